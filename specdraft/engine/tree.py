"""Draft tree expansion (EAGLE-2 / SGLang) and the attention masks of drafting and verifying.

Expansion, one round (SGLang `eagle_worker.py` draft + `eagle_utils.py` organize_draft_results):
- the drafter's first step gives the root's children: the top-k draft tokens, scored by their
  draft log-probability; they form the first frontier;
- each later step runs the frontier (topk nodes) through the drafter, expands the top-k
  children of every frontier node (score = parent score + child log-prob, topk² candidates)
  and keeps the topk best as the next frontier;
- finally the best num_draft_tokens - 1 candidates by score, plus the root, are verified.
A child's score never exceeds its parent's (log-probs <= 0), and ties are broken by creation
order (parents first), so the kept set always contains every kept node's ancestors; `select`
checks it anyway. A chain (topk 1) is the special case; at T > 0 its drafts are sampled from
the draft's q instead of taken as the argmax (lossless chain verification needs q).

Nodes of a `DraftTree` are ordered root first, parents before children.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from specdraft.engine.sampling import SamplingParams, logits_to_probs, sample


@dataclass
class DraftTree:
    """The nodes one verification checks.

    tokens:      [N] long target ids on the drafter's device (the CPU for a root-only tree);
                 tokens[0] = the root (the last emitted token, not yet in the target's cache).
    parents:     N ints, parents[0] = -1, parents[i] < i.
    depths:      N ints, 0 for the root (RoPE position = root position + depth).
    scores:      [N] float32 cumulative draft log-prob of each node's path (root 0).
    draft_probs: [N-1, V] float32, the q each draft was sampled from (chain at T > 0), else None.
    """

    tokens: Tensor
    parents: list[int]
    depths: list[int]
    scores: Tensor
    draft_probs: Tensor | None = None

    @property
    def num_nodes(self) -> int:
        """N, root included."""
        return len(self.parents)

    @property
    def is_chain(self) -> bool:
        """True when node i's parent is i - 1 (a chain, or the root alone)."""
        return all(parent == i - 1 for i, parent in enumerate(self.parents))

    def best(self, num_keep: int) -> DraftTree:
        """The subtree of the root and the num_keep - 1 best nodes by score (`select`: every
        kept node's ancestors are kept), renumbered in the same order; itself when it has no
        more nodes. Raises RuntimeError as `select` does."""
        if self.num_nodes <= num_keep:
            return self
        keep = select(self.parents, self.scores, num_keep)
        new_id = {old: new for new, old in enumerate(keep)}
        index = torch.tensor(keep, device=self.tokens.device)
        probs = self.draft_probs
        return DraftTree(
            self.tokens[index],
            [-1] + [new_id[self.parents[i]] for i in keep[1:]],
            [self.depths[i] for i in keep],
            self.scores[index.to(self.scores.device)],
            None if probs is None else probs[index[1:].to(probs.device) - 1],
        )

    def ancestor_mask(self) -> Tensor:
        """[N, N] bool on the CPU: [i, j] True iff j is i or an ancestor of i."""
        rows: list[list[bool]] = []
        for i, parent in enumerate(self.parents):
            row = rows[parent].copy() if parent >= 0 else [False] * self.num_nodes
            row[i] = True
            rows.append(row)
        return torch.tensor(rows)


def verify_mask(ancestors: Tensor, prefix_len: int, num_slots: int) -> Tensor:
    """Target attention mask [1, 1, N, num_slots] bool on the CPU over cache slots
    0..num_slots-1 (at least prefix_len + N) for a tree written at slots
    prefix_len..prefix_len+N-1: every node sees the whole prefix, then its ancestors and itself
    (ancestors [N, N] bool, `DraftTree.ancestor_mask`; a chain's mask is `causal_mask`'s). Built
    on the host: a graphed target stages it with its other inputs in one copy (`GraphedTarget`)."""
    framed = framed_ancestors(ancestors)
    return ancestor_verify_mask(framed, torch.tensor([prefix_len]), torch.arange(num_slots))[
        None, None
    ]


def select(parents: list[int], scores: Tensor, num_keep: int) -> list[int]:
    """Indices (ascending, 0 = root first) of the root plus the num_keep - 1 best candidates.

    parents: M+1 ints (node 0 = root, parents[i] < i); scores: [M+1] cumulative draft
    log-probs, non-increasing along every path. Ties keep the earlier node (stable sort), so
    ancestors precede descendants. Raises RuntimeError if a kept node's parent was dropped.
    """
    order = torch.sort(-scores[1:].float(), stable=True).indices[: num_keep - 1] + 1
    keep = sorted([0] + order.tolist())
    kept = set(keep)
    orphans = [i for i in keep[1:] if parents[i] not in kept]
    if orphans:
        raise RuntimeError(
            f"draft tree selection kept nodes {orphans} without their parents: "
            "scores are not monotone along paths"
        )
    return keep


def select_on_device(
    parents: Tensor, scores: Tensor, num_keep: int, max_depth: int
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """`select` and `tree_of`'s bookkeeping without leaving the device: fixed shapes, no host
    sync, so a CUDA graph can capture it (`GraphedRound` selects a tree's nodes and writes its
    verify inputs before the host sees them).

    parents: [M+1] long (node 0 = root with parent -1, parents[i] < i); scores: [M+1] cumulative
    draft log-probs (`TreeExpansion.candidates`: the root's 0, every other <= 0); num_keep: N <=
    M+1 nodes kept, root included; max_depth: the deepest node's depth (num_steps). The kept
    nodes are those `select` keeps: the root plus the N - 1 best by score, ties to the earlier
    node (the same stable sort, which the root, first and best, always leads; on CUDA, M+1 <=
    4096 sorts in place in one kernel, no allocation: capturable).
    Returns, on the device: keep [N] long (ascending node ids, keep[0] = 0); parents [N] long
    (indices into keep, -1 for the root); depths [N] long; framed [N, N+2] bool, the ancestors
    as `framed_ancestors` frames them (column 1 + j of row i: j is i or an ancestor of i); ok
    [] bool, False when the kept nodes are no tree (a kept node whose parent was dropped: scores
    not monotone along a path), which `select` raises for: the caller checks ok when it next
    reads from the device.
    """
    device = scores.device
    keep = torch.sort(torch.sort(-scores, stable=True).indices[:num_keep]).values
    # each node's column in framed (1 + its index in keep), 0 when dropped; the last entry, never
    # written, is the root's parent's (parents[0] = -1)
    column = torch.zeros(scores.numel() + 1, dtype=torch.long, device=device)
    own = torch.arange(1, num_keep + 1, device=device)
    column.scatter_(0, keep, own)
    parent = column[parents[keep]]  # [N]: the parent's column, 0 for the root and a dropped parent
    ok = (parent[1:] > 0).all()
    up = torch.cat([parent.new_zeros(1), parent])  # column -> its parent's column, 0 -> 0
    levels = [own, parent]  # each node's own column, then one level up per pass
    for _ in range(max_depth):  # the last pass reaches column 0 (the prefix) from every node
        levels.append(up[levels[-1]])
    framed = torch.zeros(num_keep, num_keep + 2, dtype=torch.bool, device=device)
    framed.scatter_(1, torch.stack(levels, 1), True)
    return keep, parent - 1, framed.sum(1) - 2, framed, ok


def framed_ancestors(ancestors: Tensor) -> Tensor:
    """ancestors [N, N] bool (`DraftTree.ancestor_mask`) framed for `ancestor_verify_mask`:
    [N, N+2] bool, column 0 True (the prefix every node sees), the ancestors, then a False
    column (the slots past the tree)."""
    n = ancestors.shape[0]
    framed = torch.zeros(n, n + 2, dtype=torch.bool, device=ancestors.device)
    framed[:, 0] = True
    framed[:, 1 : n + 1] = ancestors
    return framed


def ancestor_verify_mask(
    framed: Tensor, prefix_len: Tensor, columns: Tensor, out: Tensor | None = None
) -> Tensor:
    """The verify mask [N, S] bool of a tree written at slots prefix_len .. prefix_len + N - 1,
    from tensors on any device (`verify_mask` on the host, a graphed round on the GPU): every
    node sees the prefix, then its ancestors and itself. framed: [N, N+2] bool
    (`framed_ancestors`, `select_on_device`); prefix_len: [1] long, the cached tokens every node
    sees; columns: arange(S) on the same device; out: an [N, S] bool tensor to write, or None."""
    n = framed.shape[0]
    index = (columns - (prefix_len - 1)).clamp_(0, n + 1)  # [S]: framed's column of each slot
    return torch.index_select(framed, 1, index, out=out) if out is not None else framed[:, index]


class TreeExpansion:
    """Candidates of one draft round, built step by step (see the module docstring).

    root_token: the last emitted token (an int, or a [1] long tensor on the drafter's device:
    `GraphedRound` captures the expansion). topk: children per node. sampled: draw each child
    from q (chain at T > 0) instead of taking the top-k. draft_to_target: [Vd] long, the target
    id of every draft id. vocab_size: the target's V (for draft_probs). kernels: expand through
    `kernels.expand_ops` (CUDA with Triton; ignored when sampled or when the draft vocabulary is
    larger than `expand_ops.MAX_VOCAB`): three launches a tree step, one a chain step, where the
    torch ops are fifteen and six; ties go to the lower draft id.
    A chain (topk 1) keeps no frontier bookkeeping: its one child is the next frontier, every
    scratch entry is an ancestor of the next row (no draft mask) and every node is verified.
    """

    def __init__(
        self,
        root_token: int | Tensor,
        topk: int,
        sampled: bool,
        params: SamplingParams,
        draft_to_target: Tensor,
        vocab_size: int,
        generator: torch.Generator | None,
        kernels: bool = False,
    ) -> None:
        device = draft_to_target.device
        self.topk, self.sampled, self.params, self.generator = topk, sampled, params, generator
        self.kernels = False
        if kernels and not sampled:
            from specdraft.engine.kernels.expand_ops import MAX_VOCAB

            self.kernels = draft_to_target.numel() <= MAX_VOCAB
        self.draft_to_target, self.vocab_size = draft_to_target, vocab_size
        root = (
            root_token
            if isinstance(root_token, Tensor)
            else draft_to_target.new_tensor([root_token])
        )
        self.tokens = [root]
        self.scores = [torch.zeros(1, device=device)]
        self.probs: list[Tensor] = []
        self.num_nodes = 1
        self.num_scratch = (
            0  # draft-cache scratch entries written so far (frontier rows of steps >= 1)
        )
        self.frontier_scores = self.scores[0]
        if topk > 1:  # a tree's bookkeeping (device tensors, no host copy: capturable)
            self.root_parent = torch.full((1,), -1, device=device)
            self.frontiers = [
                torch.zeros(1, dtype=torch.long, device=device)
            ]  # node ids [F] of each frontier
            # [F, C]: the scratch entries each frontier row sees once the frontier is written there
            # (C = num_scratch + F): its ancestors' and its own; the root's row sees none
            self.seen = torch.zeros(1, 0, dtype=torch.bool, device=device)
            self.eye = torch.eye(topk, dtype=torch.bool, device=device)

    def draft_mask(self, committed: int) -> Tensor | None:
        """Drafter mask [1, 1, F, committed + C + F] bool for running the frontier: all committed
        draft entries, the scratch entries of each row's ancestors, then the row itself; None for
        a chain (every entry is visible)."""
        if self.topk == 1:
            return None
        f, device = self.seen.shape[0], self.seen.device
        return torch.cat(
            [torch.ones(f, committed, dtype=torch.bool, device=device), self.seen], dim=1
        )[None, None]

    def cache_mask(self, prefix: Tensor, scratch_slots: Tensor) -> Tensor:
        """A tree's `draft_mask` over the whole draft cache, from device values (what a CUDA
        graph of the round captures): [F, max_len] bool. prefix: [max_len] bool, True at the
        committed entries; scratch_slots: [>= C + F] long, the cache entry of each scratch
        entry (committed + 0, 1, ...)."""
        if self.kernels:
            from specdraft.engine.kernels.expand_ops import tree_mask

            return tree_mask(self.seen, scratch_slots[:1], prefix.numel())
        f, width = self.seen.shape
        return (
            prefix.expand(f, -1).clone().scatter_(1, scratch_slots[:width].expand(f, -1), self.seen)
        )

    def expand(self, logits: Tensor, hidden: Tensor, written: bool) -> tuple[Tensor, Tensor]:
        """Add the children of the frontier and move the frontier to the best topk of them.

        logits: [F, Vd] draft logits after each frontier node; hidden: [F, H] its pre-norm
        output; written: whether these rows were written to the draft-cache scratch (false for
        the first step, whose row is the committed last position). Returns the new frontier's
        (target token ids [topk], hidden inputs [topk, H]).
        """
        tokens, scores = self.add_children(logits, written)
        if self.topk == 1:
            self.frontier_scores = scores
            return tokens, hidden
        if self.kernels:
            from specdraft.engine.kernels.expand_ops import next_frontier

            self.frontier_scores, nodes, tokens, hidden, self.seen = next_frontier(
                scores,
                tokens,
                hidden,
                self.seen[:, : self.num_scratch],
                self.topk,
                self.topk,
                self.num_nodes - scores.numel(),
            )
            self.frontiers.append(nodes)
            return tokens, hidden
        self.frontier_scores, best = scores.topk(self.topk)
        rows = best // self.topk
        self.frontiers.append(best + (self.num_nodes - scores.numel()))
        self.seen = torch.cat([self.seen[:, : self.num_scratch][rows], self.eye], 1)
        return tokens[best], hidden[rows]

    def add_children(self, logits: Tensor, written: bool) -> tuple[Tensor, Tensor]:
        """Add the children of the frontier, leaving the frontier where it is (a round's last
        step; `expand` moves it too). logits, written: as `expand`'s. Returns the children's
        target token ids [F*k] long and scores [F*k] float32, row by row."""
        f, k = logits.shape[0], 1 if self.sampled else self.topk
        if self.kernels:
            from specdraft.engine.kernels.expand_ops import child_topk

            tokens, scores = child_topk(logits, self.frontier_scores, self.draft_to_target, k)
        else:
            tokens, scores = self.torch_children(logits)
        self.tokens.append(tokens)
        self.scores.append(scores)
        self.num_scratch += f if written else 0
        self.num_nodes += f * k
        return tokens, scores

    def torch_children(self, logits: Tensor) -> tuple[Tensor, Tensor]:
        """`add_children`'s tokens and scores through torch ops (a sampled chain's q kept)."""
        logp = logits.float().log_softmax(-1).clamp(max=0.0)
        if self.sampled:
            q = logits_to_probs(logits, self.params)  # [1, Vd]
            child = sample(q, self.generator)[:, None]
            self.probs.append(
                q.new_zeros(1, self.vocab_size).index_copy_(1, self.draft_to_target, q)
            )
            values = logp.gather(1, child)
        else:
            values, child = logp.topk(self.topk, dim=-1)  # [F, k]
        return self.draft_to_target[child].reshape(-1), (
            self.frontier_scores[:, None] + values
        ).reshape(-1)

    def candidates(self) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
        """Every node so far, root first: tokens [M+1] long (target ids), scores [M+1] float32,
        parents [M+1] long (None for a chain: node i's parent is i - 1), draft_probs [M, V] (a
        sampled chain's q) or None."""
        parents = None
        if self.topk > 1:  # every frontier that has children has topk of each node, in order
            frontiers = torch.cat(self.frontiers[: len(self.tokens) - 1])
            parents = torch.cat(
                [self.root_parent, frontiers[:, None].expand(-1, self.topk).reshape(-1)]
            )
        probs = torch.cat(self.probs) if self.probs else None
        return torch.cat(self.tokens), torch.cat(self.scores), parents, probs

    def tree(self, num_draft_tokens: int, out: Tensor | None = None) -> DraftTree:
        """The root plus the best num_draft_tokens - 1 candidates, as a DraftTree (`tree_of`;
        out as there)."""
        return tree_of(*self.candidates(), num_draft_tokens, out)


def tree_of(
    tokens: Tensor,
    scores: Tensor,
    parents: Tensor | None,
    probs: Tensor | None,
    num_draft_tokens: int,
    out: Tensor | None = None,
) -> DraftTree:
    """The DraftTree of the root plus the best num_draft_tokens - 1 of `TreeExpansion.candidates`
    (a chain: every node, in order). out: a [num_draft_tokens] long tensor on the drafter's
    device that receives the tree's tokens (a graphed target's input buffer,
    `GraphedTarget.device_input_ids`) and becomes `DraftTree.tokens`, or None for a new tensor.
    Raises ValueError when the tree does not have exactly out's size."""
    if parents is None:  # a chain: every node, in order
        n = tokens.numel()
        check_out(out, n)
        return DraftTree(
            tokens if out is None else out.copy_(tokens),
            list(range(-1, n - 1)),
            list(range(n)),
            scores,
            probs,
        )
    parent_list = parents.tolist()
    keep = select(parent_list, scores, num_draft_tokens)
    check_out(out, len(keep))
    index = {node: i for i, node in enumerate(keep)}
    new_parents = [-1] + [index[parent_list[node]] for node in keep[1:]]
    keep_t = torch.tensor(keep, device=tokens.device)
    kept = tokens[keep_t] if out is None else torch.index_select(tokens, 0, keep_t, out=out)
    return DraftTree(
        kept,
        new_parents,
        depths_of(new_parents),
        scores[keep_t],
        None if probs is None else probs[keep_t[1:] - 1],
    )


def depths_of(parents: list[int]) -> list[int]:
    """Each node's depth (root 0) from its parent index (parents[0] = -1, parents[i] < i)."""
    depths = [0] * len(parents)
    for i in range(1, len(parents)):
        depths[i] = depths[parents[i]] + 1
    return depths


def check_out(out: Tensor | None, num_nodes: int) -> None:
    """Raise ValueError when a tree of num_nodes nodes cannot be written to out (None: nothing to check)."""
    if out is not None and out.shape != (num_nodes,):
        raise ValueError(
            f"a draft tree of {num_nodes} nodes written to a token buffer of shape "
            f"{tuple(out.shape)}: the verify graph was built for another num_draft_tokens"
        )
