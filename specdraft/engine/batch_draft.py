"""EAGLE-3 chains or trees of every sequence of a batch drafted together: ONE drafter forward per
step for all B rows (`draft_chains`, `draft_trees`), over the drafter's K/V in the rows of one
buffer (`DraftRows`).

A round drafts what `eagle.EagleChain.propose` drafts for each row alone: the first step over
the row's pending positions (rows padded to the longest; a pad writes the buffer's last entry,
which no row reaches, and attends entry 0 only), then num_steps - 1 steps of one position per
row, each at the row's own slot and RoPE position, masked to the row's own entries. Greedy rows
take the argmax (as `EagleChain` on the torch path: `topk(1)` of the log-softmax), sampled rows
draw from their q with their own generator (q kept for `sampling.verify_chain`). The steps are
`eagle.FastDraft`'s torch ops with a batch dimension (the Triton steps stay batch 1).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from specdraft.draft import KV
from specdraft.engine.batch_target import batch_causal_mask
from specdraft.engine.eagle import (
    DRAFT_SDPA_BACKENDS,
    NO_CONTEXT,
    DraftCache,
    FastDraft,
    sdpa_kernel,
)
from specdraft.engine.requests import Request
from specdraft.engine.round import Proposal
from specdraft.engine.sampling import logits_to_probs, sample
from specdraft.engine.tree import DraftTree, TreeExpansion


class DraftRows:
    """The drafter's K/V of a batch: k, v [max_rows, num_kv_heads, max_len, head_dim]; row r's
    `DraftCache` (`caches[r]`, views of row r) keeps its committed length. As the cache of a
    batched `FastDraft` step: `prepare` says where the step writes and how far it reads,
    `write` / `view` (what the step calls) do it."""

    def __init__(
        self,
        num_kv_heads: int,
        head_dim: int,
        max_rows: int,
        max_len: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        shape = (max_rows, num_kv_heads, max_len, head_dim)
        self.k, self.v = (torch.zeros(shape, dtype=dtype, device=device) for _ in "kv")
        self.caches = [
            DraftCache.over(self.k[r : r + 1], self.v[r : r + 1]) for r in range(max_rows)
        ]
        self.max_len = max_len
        self.slots = torch.zeros(1, 1, dtype=torch.long, device=device)
        self.width = 1

    def prepare(self, slots: Tensor, width: int) -> None:
        """The next step writes row b's T positions at entries slots[b] ([B, T] long on the
        buffers' device, each < max_len) and reads entries 0..width-1 of rows 0..B-1."""
        self.slots, self.width = slots, width

    def write(self, kv: KV, start: object = None) -> None:
        """Scatter kv (each [B, num_kv_heads, T, head_dim]) at the prepared slots (start unused:
        the slots are per row)."""
        index = self.slots[:, None, :, None].expand_as(kv.k)
        rows = kv.k.shape[0]
        self.k[:rows].scatter_(2, index, kv.k)
        self.v[:rows].scatter_(2, index, kv.v)

    def view(self, end: object = None) -> KV:
        """Rows 0..B-1 over the prepared width (end unused)."""
        rows = self.slots.shape[0]
        return KV(self.k[:rows, :, : self.width], self.v[:rows, :, : self.width])

    def move(self, src: int, dst: int) -> None:
        """Row src's committed entries and length into row dst (a sequence changes rows)."""
        n = self.caches[src].length
        self.k[dst, :, :n] = self.k[src, :, :n]
        self.v[dst, :, :n] = self.v[src, :, :n]
        self.caches[dst].length = n


def first_step_inputs(rows: DraftRows, reqs: Sequence[Request], device: torch.device) -> tuple:
    """The first step's padded inputs for rows 0..B-1: ids [B, m], aux [B, m, A], positions,
    slots [B, m], mask [B, 1, m, S] (module docstring), and each row's pending count [B]."""
    counts = torch.tensor([req.pending_ids.numel() for req in reqs])
    starts = torch.tensor([rows.caches[b].length for b in range(len(reqs))])
    m, aux0 = int(counts.max()), reqs[0].pending_aux
    ids = torch.zeros(len(reqs), m, dtype=torch.long, device=device)
    aux = aux0.new_zeros(len(reqs), m, aux0.shape[-1])
    for b, req in enumerate(reqs):
        ids[b, : counts[b]], aux[b, : counts[b]] = req.pending_ids, req.pending_aux
    offsets = torch.arange(m)
    valid = offsets < counts[:, None]  # [B, m]
    positions = starts[:, None] + offsets
    slots = torch.where(valid, positions, rows.max_len - 1)
    width = int((starts + counts).max())
    pad_mask = torch.arange(width) == 0
    mask = torch.where(valid[:, None, :, None], batch_causal_mask(starts, m, width), pad_mask)
    return ids, aux, positions.to(device), slots.to(device), mask.to(device), counts


def next_tokens(
    logits: Tensor, reqs: Sequence[Request], vocab: Tensor, vocab_size: int, probs: list[list]
) -> Tensor:
    """Each row's draft [B] (target ids) from the drafter's logits [B, Vd]: the argmax for a
    greedy row, a draw from q for a sampled one (q as [1, V] appended to probs[b])."""
    logp = logits.float().log_softmax(-1).clamp(max=0.0)
    tokens = vocab[logp.topk(1, dim=-1).indices[:, 0]]
    for b, req in enumerate(reqs):
        if not req.greedy:
            q = logits_to_probs(logits[b : b + 1], req.params)  # [1, Vd]
            tokens[b] = vocab[sample(q, req.generator)].reshape(())
            probs[b].append(q.new_zeros(1, vocab_size).index_copy_(1, vocab, q))
    return tokens


def first_step(
    fast: FastDraft, rows: DraftRows, reqs: Sequence[Request], device: torch.device
) -> tuple[Tensor, Tensor, Tensor]:
    """The drafter's first step over every row's pending positions (`first_step_inputs`), each
    row's cache committing them: the logits [B, Vd] and output [B, 1, H] at each row's last
    pending position, and each row's committed length [B] long on the CPU."""
    ids, aux, positions, slots, mask, counts = first_step_inputs(rows, reqs, device)
    rows.prepare(slots, mask.shape[-1])
    logits, hidden = fast(ids, aux, positions, True, rows, 0, mask)
    for b, n in enumerate(counts.tolist()):
        rows.caches[b].commit(n)
    ends = torch.tensor([rows.caches[b].length for b in range(len(reqs))])
    pick = (torch.arange(len(reqs)), counts - 1)
    return logits[pick], hidden[pick][:, None], ends


@torch.no_grad()
def draft_chains(
    fast: FastDraft,
    rows: DraftRows,
    reqs: Sequence[Request],
    num_steps: int,
    vocab: Tensor,
    vocab_size: int,
) -> list[Proposal]:
    """Row b's chain (reqs[b]'s root and num_steps drafts) for every row, in num_steps drafter
    forwards (module docstring); each row's cache commits its pending positions."""
    device = vocab.device
    probs: list[list] = [[] for _ in reqs]
    with sdpa_kernel(DRAFT_SDPA_BACKENDS) if device.type == "cuda" else NO_CONTEXT:
        logits, hidden, ends = first_step(fast, rows, reqs, device)
        tokens = [torch.tensor([req.output_ids[-1] for req in reqs], device=device)]
        for step in range(1, num_steps + 1):  # draft `step` at slot = RoPE position end + step - 1
            tokens.append(next_tokens(logits, reqs, vocab, vocab_size, probs))
            if step < num_steps:
                slot = (ends + step - 1)[:, None]  # [B, 1]
                width = int(slot.max()) + 1
                rows.prepare(slot.to(device), width)
                step_mask = (torch.arange(width) <= slot)[:, None, None, :].to(device)
                at = slot.to(device)
                logits, hidden = fast(tokens[-1][:, None], hidden, at, False, rows, 0, step_mask)
                logits = logits[:, 0]
    chains = torch.stack(tokens, 1)  # [B, num_steps + 1]
    return [
        Proposal(chains[b], None, None, torch.cat(probs[b]) if probs[b] else None, num_steps)
        for b in range(len(reqs))
    ]


@torch.no_grad()
def draft_trees(
    fast: FastDraft,
    rows: DraftRows,
    reqs: Sequence[Request],
    expansions: Sequence[TreeExpansion],
    num_steps: int,
    num_draft_tokens: int,
) -> list[DraftTree]:
    """Row b's tree (`eagle_tree.EagleTree.draft_steps`' for reqs[b] alone, through its
    expansions[b]) for every row: the first step, then num_steps - 1 drafter forwards over every
    row's frontier of topk nodes, written at the row's scratch entries, each node seeing the
    row's committed entries and its ancestors' (`TreeExpansion.draft_mask`)."""
    device = rows.k.device
    with sdpa_kernel(DRAFT_SDPA_BACKENDS) if device.type == "cuda" else NO_CONTEXT:
        logits, hidden, ends = first_step(fast, rows, reqs, device)
        frontier = [e.expand(logits[b : b + 1], hidden[b], False) for b, e in enumerate(expansions)]
        for step in range(1, num_steps):  # frontier at depth `step`, RoPE position end - 1 + step
            tokens, hidden = (torch.stack(parts) for parts in zip(*frontier))  # [B, F], [B, F, H]
            f, scratch = tokens.shape[1], expansions[0].num_scratch
            width = int(ends.max()) + scratch + f
            masks = [e.draft_mask(int(end))[0, 0] for e, end in zip(expansions, ends)]
            mask = torch.stack([F.pad(m, (0, width - m.shape[-1])) for m in masks])[:, None]
            slots = ends[:, None] + scratch + torch.arange(f)
            rows.prepare(slots.to(device), width)
            positions = (ends - 1 + step)[:, None].expand(-1, f).to(device)
            logits, hidden = fast(tokens, hidden, positions, False, rows, 0, mask)
            frontier = [e.expand(logits[b], hidden[b], True) for b, e in enumerate(expansions)]
    return [e.tree(num_draft_tokens) for e in expansions]
