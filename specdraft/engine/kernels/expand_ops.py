"""Triton kernels for a greedy draft round's expansion (`tree.TreeExpansion` with kernels on):
what a draft step does between the drafter's logits and the next step's inputs.

- `child_topk`: each frontier row's log-softmax over the draft vocabulary (float32), its top-k
  draft ids, their target ids (d2t) and scores (the row's score + the child's log-prob): one
  launch where torch runs six (cast, log_softmax, clamp, topk, add, index);
- `next_frontier`: the best topk of those children (a stable descending sort's first topk),
  their node ids, tokens and parents' hidden rows, and the scratch entries each new frontier row
  sees: one launch where torch runs seven (topk, divide, add, index, cat, two gathers);
- `tree_mask`: a frontier's draft-cache mask from what it sees: one launch where torch runs two.

Ties go to the lower index (the lower draft id, the earlier child), so a round is the same on
every device; torch.topk leaves the order of equal values unspecified, and bf16 logits tie
often. The log-softmax rounds as torch's does ((x - max) - log(sum exp(x - max))), with Triton's
exp and log: scores agree with the torch path to float32 rounding, not bit for bit
(tests/unit/engine/kernels/test_expand_ops.py). Import this module only where Triton is installed.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from specdraft.engine.kernels.pdl import pdl_launch, pdl_wait

MASK_BLOCK = 1024  # draft-cache entries a `tree_mask` program writes
MAX_VOCAB = (
    4096  # the largest draft vocabulary `child_topk` takes: a program holds its row in registers
)


@triton.jit
def _child_topk_kernel(
    logits_ptr,
    row_scores_ptr,
    d2t_ptr,
    tokens_ptr,
    scores_ptr,
    V,
    K: tl.constexpr,
    BLOCK_V: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """Program r: children r*K .. r*K+K-1, the K best draft ids of logits row r, best first."""
    r = tl.program_id(0)
    cols = tl.arange(0, BLOCK_V)
    pdl_wait(USE_PDL)
    x = tl.load(logits_ptr + r * V + cols, mask=cols < V, other=-float("inf")).to(tl.float32)
    top = tl.max(x, axis=0)
    log_sum = tl.log(tl.sum(tl.exp(x - top), axis=0))
    base = tl.load(row_scores_ptr + r)
    taken = cols >= V  # the padding is never a child
    for j in tl.static_range(K):
        best = tl.max(tl.where(taken, -float("inf"), x), axis=0)
        child = tl.minimum(tl.min(tl.where((x == best) & ~taken, cols, BLOCK_V), axis=0), V - 1)
        taken = taken | (cols == child)
        tl.store(scores_ptr + r * K + j, base + tl.minimum((best - top) - log_sum, 0.0))
        tl.store(tokens_ptr + r * K + j, tl.load(d2t_ptr + child))


def child_topk(
    logits: Tensor, row_scores: Tensor, draft_to_target: Tensor, k: int
) -> tuple[Tensor, Tensor]:
    """Every frontier row's k best children: logits [F, Vd] (any float dtype, contiguous);
    row_scores [F] float32 (each row's path score); draft_to_target [Vd] long. Returns tokens
    [F*k] long (target ids) and scores [F*k] float32 (row score + log_softmax(logits[r])[child],
    clamped at 0), row by row, best child first. Raises ValueError when k > Vd or Vd > MAX_VOCAB
    (`TreeExpansion` expands through torch ops there)."""
    f, vocab = logits.shape
    if not k <= vocab <= MAX_VOCAB:
        raise ValueError(
            f"top-{k} children of a draft vocabulary of {vocab} (kernel: k <= vocabulary <= {MAX_VOCAB})"
        )
    tokens = torch.empty(f * k, dtype=torch.long, device=logits.device)
    scores = torch.empty(f * k, dtype=torch.float32, device=logits.device)
    block_v = triton.next_power_of_2(vocab)
    _child_topk_kernel[(f,)](
        logits.contiguous(),
        row_scores.float().contiguous(),
        draft_to_target,
        tokens,
        scores,
        vocab,
        K=k,
        BLOCK_V=block_v,
        **pdl_launch(logits.device, block_v, 1024),
    )
    return tokens, scores


@triton.jit
def _next_frontier_kernel(
    scores_ptr,
    tokens_ptr,
    hidden_ptr,
    seen_ptr,
    out_scores_ptr,
    out_nodes_ptr,
    out_tokens_ptr,
    out_hidden_ptr,
    out_seen_ptr,
    N,
    H,
    C,
    seen_stride,
    node_offset,
    K: tl.constexpr,
    P: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_C: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """Program p: frontier row p, the candidate that a stable descending sort puts p-th."""
    p = tl.program_id(0)
    i = tl.arange(0, BLOCK_N)
    j = tl.arange(0, BLOCK_N)
    pdl_wait(USE_PDL)
    valid = i < N
    s_i = tl.load(scores_ptr + i, mask=valid, other=-float("inf"))
    s_j = tl.load(scores_ptr + j, mask=j < N, other=-float("inf"))
    beats = (s_j[None, :] > s_i[:, None]) | (
        (s_j[None, :] == s_i[:, None]) & (j[None, :] < i[:, None])
    )
    rank = tl.sum(
        (beats & (j[None, :] < N)).to(tl.int32), axis=1
    )  # [BLOCK_N]: candidates ahead of i
    best = tl.minimum(tl.min(tl.where((rank == p) & valid, i, BLOCK_N), axis=0), N - 1)
    tl.store(out_scores_ptr + p, tl.load(scores_ptr + best))
    tl.store(out_nodes_ptr + p, best + node_offset)
    tl.store(out_tokens_ptr + p, tl.load(tokens_ptr + best))
    row = best // K
    for h in tl.range(0, H, BLOCK_H):
        cols = h + tl.arange(0, BLOCK_H)
        tl.store(
            out_hidden_ptr + p * H + cols,
            tl.load(hidden_ptr + row * H + cols, mask=cols < H),
            mask=cols < H,
        )
    c = tl.arange(0, BLOCK_C)
    old = tl.load(seen_ptr + row * seen_stride + c, mask=c < C, other=0)
    own = tl.where(c - C == p, 1, 0).to(old.dtype)  # the row's own new entry, C + p
    tl.store(out_seen_ptr + p * (C + P) + c, tl.where(c < C, old, own), mask=c < C + P)


def next_frontier(
    scores: Tensor, tokens: Tensor, hidden: Tensor, seen: Tensor, k: int, p: int, node_offset: int
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The next frontier of a tree expansion: the p best of the N = F*k children (`child_topk`'s
    scores [N] float32 and tokens [N] long, row r's children at r*k .. r*k+k-1), ties to the
    earlier child. hidden: [F, H] each row's output (a child's next input is its parent row's);
    seen: [F, C] bool (row r's visible scratch entries, columns may be strided); node_offset:
    the node id of child 0. Returns scores [p] float32, node ids [p] long, tokens [p] long, hidden
    [p, H] (hidden's dtype) and seen [p, C + p] bool (the parent row's C entries, then the row
    itself at C + its index). Raises ValueError when p > N."""
    n, width, c = scores.numel(), hidden.shape[1], seen.shape[1]
    if p > n:
        raise ValueError(f"a frontier of {p} out of {n} children")
    device = scores.device
    out_scores = torch.empty(p, dtype=torch.float32, device=device)
    nodes = torch.empty(p, dtype=torch.long, device=device)
    out_tokens = torch.empty(p, dtype=torch.long, device=device)
    out_hidden = torch.empty(p, width, dtype=hidden.dtype, device=device)
    out_seen = torch.empty(p, c + p, dtype=torch.bool, device=device)
    seen_bytes = (
        seen.view(torch.uint8) if c else out_seen.view(torch.uint8)
    )  # any valid pointer when C = 0
    _next_frontier_kernel[(p,)](
        scores,
        tokens,
        hidden.contiguous(),
        seen_bytes,
        out_scores,
        nodes,
        out_tokens,
        out_hidden,
        out_seen.view(torch.uint8),
        n,
        width,
        c,
        seen.stride(0) if c else 0,
        node_offset,
        K=k,
        P=p,
        BLOCK_N=triton.next_power_of_2(n),
        BLOCK_H=min(4096, triton.next_power_of_2(width)),
        BLOCK_C=triton.next_power_of_2(c + p),
        **pdl_launch(device),
    )
    return out_scores, nodes, out_tokens, out_hidden, out_seen


@triton.jit
def _tree_mask_kernel(
    seen_ptr, committed_ptr, mask_ptr, W, L, BLOCK: tl.constexpr, USE_PDL: tl.constexpr
):
    """Program (p, b): entries b*BLOCK .. of row p."""
    p, b = tl.program_id(0), tl.program_id(1)
    e = b * BLOCK + tl.arange(0, BLOCK)
    pdl_wait(USE_PDL)
    committed = tl.load(committed_ptr)
    scratch = e - committed
    in_tree = (scratch >= 0) & (scratch < W)
    seen = tl.load(seen_ptr + p * W + scratch, mask=in_tree, other=0)
    tl.store(mask_ptr + p * L + e, ((e < committed) | (seen != 0)).to(tl.uint8), mask=e < L)


def tree_mask(seen: Tensor, committed: Tensor, length: int) -> Tensor:
    """The draft-cache mask [P, length] bool of a frontier: every committed entry (those before
    committed [1] long), then the W scratch entries after them where seen [P, W] bool says
    (`next_frontier`), nothing past them (what `TreeExpansion.cache_mask` builds with torch)."""
    p, width = seen.shape
    mask = torch.empty(p, length, dtype=torch.bool, device=seen.device)
    _tree_mask_kernel[(p, triton.cdiv(length, MASK_BLOCK))](
        seen.contiguous().view(torch.uint8),
        committed,
        mask.view(torch.uint8),
        width,
        length,
        BLOCK=MASK_BLOCK,
        **pdl_launch(seen.device),
    )
    return mask
