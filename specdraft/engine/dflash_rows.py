"""DFlash blocks of every sequence of a batch drafted together: ONE drafter forward for all B
rows (`draft_blocks`), over the context's per-layer K/V in the rows of one buffer per draft
layer (`DFlashRows`), beside `batch_draft`'s EAGLE-3 chains and trees.

A round drafts what `dflash_block.DFlashBlock.propose` drafts for each row alone: each row's
pending positions join its context (`DFlashBlock.extend`, per row: their counts differ), then
the blocks [root_b, mask x (block_size - 1)] at positions length_b.. of all rows run through
the drafter at once, row b's block attending to its own context entries 0..length_b - 1 (the
rows padded to the longest, the pads masked) and to its whole block, as the single-sequence
forward attends to its context and block (z-lab `dflash/model.py`; SGLang
`srt/speculative/dflash_worker.py` drafts a batch's blocks in one forward the same way).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from specdraft.dflash import DFlashDraft
from specdraft.draft import KV
from specdraft.engine.batch_draft import DraftRows
from specdraft.engine.dflash_block import DFlashBlock
from specdraft.engine.eagle import DraftCache
from specdraft.engine.requests import Request
from specdraft.engine.round import Proposal


class DFlashRows:
    """The DFlash drafter's context K/V of a batch: one `batch_draft.DraftRows` per draft layer
    ([max_rows, kv_heads, max_len, head_dim]); row r's caches (`row`) keep its length."""

    def __init__(
        self, draft: DFlashDraft, max_rows: int, max_len: int, device: torch.device
    ) -> None:
        cfg, dtype = draft.cfg, draft.fc.weight.dtype
        self.layers = [
            DraftRows(cfg.num_key_value_heads, cfg.head_dim, max_rows, max_len, dtype, device)
            for _ in draft.layers
        ]

    def row(self, row: int) -> list[DraftCache]:
        """Row `row`'s context cache of every layer (views of the buffers)."""
        return [layer.caches[row] for layer in self.layers]

    def move(self, src: int, dst: int) -> None:
        """Row src's context entries and length into row dst, in every layer."""
        for layer in self.layers:
            layer.move(src, dst)


def block_mask(lengths: Tensor, width: int, block_size: int) -> Tensor:
    """Bool [B, 1, block_size, width + block_size]: row b's block sees its context entries
    0..lengths[b] - 1 of the padded width and its whole block."""
    context = torch.arange(width, device=lengths.device) < lengths[:, None]  # [B, width]
    block = context.new_ones(lengths.shape[0], block_size)
    return torch.cat([context, block], 1)[:, None, None].expand(-1, 1, block_size, -1)


def draft_blocks(
    proposers: Sequence[DFlashBlock], reqs: Sequence[Request], rows: DFlashRows, num_drafts: int
) -> list[Proposal]:
    """Each row's chain of num_drafts (<= block_size - 1) drafts: rows b = 0..B-1, proposers[b]
    over `rows.row(b)` (module docstring). Returns B proposals [num_drafts + 1] long."""
    for proposer, req in zip(proposers, reqs):
        proposer.extend(req.pending_aux)
    first, bsz = proposers[0], len(reqs)
    draft, device = first.draft, first.device
    lengths = torch.tensor([p.caches[0].length for p in proposers], device=device)
    width = int(lengths.max())
    block_ids = torch.stack([p.block_ids(req) for p, req in zip(proposers, reqs)])  # [B, bs]
    contexts = [KV(rows_.k[:bsz, :, :width], rows_.v[:bsz, :, :width]) for rows_ in rows.layers]
    mask = block_mask(lengths, width, block_ids.shape[1])
    hidden = first.block_states(block_ids, lengths[:, None] + first.offsets, contexts, mask)
    drafts = draft.logits(hidden[:, 1 : num_drafts + 1]).argmax(-1)  # [B, num_drafts]
    return [
        Proposal(torch.cat([block_ids[b, :1], drafts[b]]), None, None, None, num_drafts)
        for b in range(bsz)
    ]
