"""The target forwards of a batch: B sequences verified in ONE forward, each in its own cache row
at its own length (`BatchRunner`, the batched form of `round.TargetRunner`).

Sequence i of the batch owns cache row i (rows 0..B-1: the target attends over `k_cache[:B]`,
as vLLM's persistent batch keeps its requests in the first rows of its input buffers,
`v1/worker/gpu_input_batch.py`). A round writes row i's N nodes at its own slots
length_i..length_i+N-1 (`cache_slots` [B, N]) and masks each row by its own length (a per-row
causal or tree mask over the widest row's slots): nothing is padded, and after the round each
row keeps only its accepted nodes by moving its length pointer (a tree's path compacted within
its row, `commit`). The batch is never re-padded: a finished sequence leaves by moving the last
row into its row, a new one joins by moving row 0 to row B and prefilling at row 0 (`move`).
Batched forwards run on either target: a `fast_model.FastTarget` (through its Triton kernels,
once `use_triton` has switched them on, for B * T <= `fused_decode.MAX_TOKENS`, each row
writing its own slots; else torch ops) or `hf_target.HFTarget` over a `hf_rows.RowCache` (torch
ops); eager, or on a FastTarget replayed as one CUDA graph per (B, T)
(`batch_graphs.GraphedRows`, `graphs=True`; off by default).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from specdraft.engine.batch_graphs import GraphedRows
from specdraft.engine.errors import EngineError
from specdraft.engine.round import Proposal, TargetRunner
from specdraft.engine.tree import verify_mask


def batch_causal_mask(starts: Tensor, num_tokens: int, width: int) -> Tensor:
    """Bool mask [B, 1, T, width]: row b's token i attends to slots 0..starts[b]+i (starts [B]
    long, each row's cache length)."""
    rows = starts[:, None] + torch.arange(num_tokens, device=starts.device)  # [B, T]
    return (torch.arange(width, device=starts.device) <= rows[..., None])[:, None]


def batch_verify_mask(
    proposals: Sequence[Proposal], starts: Tensor, slots: Tensor, width: int
) -> Tensor:
    """The verify mask [B, 1, N, width] bool on the CPU of B proposals padded to N nodes, row
    b's nodes written at slots starts[b]..: causal for chains, `tree.verify_mask` for trees;
    a pad (slots [B, N] long: its slot) sees the slots up to its own, and no node sees it."""
    n = slots.shape[1]
    sizes = [p.tokens.numel() for p in proposals]
    if all(p.ancestors is None for p in proposals) and min(sizes) == n:
        return batch_causal_mask(starts, n, width)
    rows = []
    for b, (p, size) in enumerate(zip(proposals, sizes)):
        own = (
            batch_causal_mask(starts[b : b + 1], size, width)
            if p.ancestors is None
            else verify_mask(p.ancestors, int(starts[b]), width)
        )
        pads = torch.arange(width) <= slots[b, size:, None]  # [N - size, width]
        rows.append(torch.cat([own, pads[None, None]], dim=2))
    return torch.cat(rows)


def padded_depths(proposal: Proposal, num_nodes: int) -> Tensor:
    """The proposal's node depths [num_nodes] long on the CPU, its pads' after them (one more
    each: at their slots)."""
    size = proposal.tokens.numel()
    depths = torch.arange(num_nodes)
    if proposal.depths is not None:
        depths[:size] = proposal.depths
    return depths


def padded_tokens(proposal: Proposal, num_nodes: int) -> Tensor:
    """The proposal's tokens [num_nodes] long, pads repeating its root."""
    tokens, size = proposal.tokens, proposal.tokens.numel()
    return tokens if size == num_nodes else torch.cat([tokens, tokens[:1].expand(num_nodes - size)])


class BatchRunner(TargetRunner):
    """The forwards of up to max_batch_size sequences over one target (module docstring): the
    prompt of a joining sequence at row 0 (`prefill`, batch 1's), every sequence's proposal in
    one forward (`verify_batch`), per-row commits and row moves. Eager (never `compile`d);
    static_width: masks over all max_seq_len slots (a target whose layers were compiled sees
    few shapes), else over the widest row's. graphs: verify forwards replay one graph per
    (B, T) (`batch_graphs.GraphedRows`; CUDA graphs on CUDA, its eager stand-in elsewhere),
    masks then over max_seq_len slots; a `fast_model.FastTarget` only. Raises EngineError for
    graphs over a target that reads its inputs on the host."""

    def __init__(
        self,
        target: object,
        aux_layers: tuple[int, ...],
        max_batch_size: int,
        max_seq_len: int,
        device: torch.device,
        static_width: bool = False,
        graphs: bool = False,
    ) -> None:
        self.max_batch_size, self.static_width = max_batch_size, static_width or graphs
        super().__init__(target, aux_layers, max_seq_len, device)
        if graphs and self.host_inputs:
            raise EngineError("batched CUDA graphs need a fast target (its inputs on the device)")
        self.graphed_rows = GraphedRows(target, aux_layers, max_seq_len) if graphs else None

    def check_cache(self, num_rows: int) -> None:
        """Rebuild the cache when another user (a batch-1 engine on the same target) reallocated
        it while no row is in use; raise EngineError when rows were in use (their K/V is gone)."""
        wanted = (self.max_batch_size, self.max_seq_len)
        if (self.target.max_batch_size, self.target.max_seq_len) == wanted:
            return
        if num_rows:
            raise EngineError(
                f"the target's cache was reallocated while {num_rows} batched sequences used it: "
                "run a batch-1 engine and a batch scheduler on one target one after the other"
            )
        self.reserve()

    def verify_batch(
        self, proposals: Sequence[Proposal], starts: list[int]
    ) -> tuple[Tensor, Tensor | None]:
        """Row b's proposal at slots starts[b].., positions starts[b] + depth, seeing its row's
        prefix, its ancestors and itself: logits [B, N, V] float32 and aux states [B, N,
        n_aux*H] (None without a drafter), N the most nodes of a row. A row of fewer nodes (cut
        near the cache's end, `round.free_nodes`, which leaves the last slot free) is padded
        with its root: the pads write after its nodes, at slots clamped to the cache's last
        (past the row's length: a later round writes them before it reads), and no node sees
        them. Graphed, the host inputs reach the device in one staged copy."""
        n, start = max(p.tokens.numel() for p in proposals), torch.tensor(starts)
        last = self.max_seq_len - 1
        slots = (start[:, None] + torch.arange(n)).clamp_(max=last)
        depths = torch.stack([padded_depths(p, n) for p in proposals])
        width = self.max_seq_len if self.static_width else min(max(starts) + n, self.max_seq_len)
        mask = batch_verify_mask(proposals, start, slots, width)
        graphed = self.graphed_rows is not None
        if graphed and len({p.tokens.device for p in proposals}) == 1:  # staged with the rest
            tokens = torch.stack([padded_tokens(p, n) for p in proposals])
        else:
            tokens = torch.stack([padded_tokens(p, n).to(self.device) for p in proposals])
        inputs = (tokens, (start[:, None] + depths).clamp_(max=last), slots, mask)
        if graphed:
            out = self.graphed_rows(*inputs, self.aux_layers)
        elif self.host_inputs:
            out = self.target(*inputs, self.aux_layers)
        else:
            out = self.target(*(x.to(self.device) for x in inputs), self.aux_layers)
        return out.logits, out.aux_hidden

    def commit_row(self, row: int, start: int, path: Tensor) -> None:
        """`Target.commit` in one row: the K/V of its accepted nodes path [a + 1] long (slots
        start + path) moved to slots start..start+a of that row."""
        self.target.copy_slots(row, path + start, row, start)

    def move(self, src_row: int, dst_row: int, length: int) -> None:
        """Copy row src_row's K/V of slots 0..length-1 into row dst_row (a sequence changes rows)."""
        self.target.copy_slots(src_row, torch.arange(length, device=self.device), dst_row, 0)
