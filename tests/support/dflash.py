"""Tiny seeded DFlash drafters for tests (specdraft/dflash.py's sizes shrunk)."""

from __future__ import annotations

import torch

from specdraft.dflash import DFlashConfig, DFlashDraft

TINY_BLOCK = 4


def tiny_dflash_cfg(**kw) -> DFlashConfig:
    """A 2-layer drafter of a 4-layer, 50-token, H = 32 target on its layers 0, 1, 2 (0-based),
    block 4, mask id 49; `kw` replaces any field."""
    base = dict(
        hidden_size=32,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        intermediate_size=64,
        vocab_size=50,
        target_layer_ids=(0, 1, 2),
        target_num_layers=4,
        mask_token_id=49,
        max_position_embeddings=128,
        num_hidden_layers=2,
        block_size=TINY_BLOCK,
    )
    return DFlashConfig(**{**base, **kw})


def tiny_dflash_draft(**kw) -> DFlashDraft:
    """`tiny_dflash_cfg(**kw)`'s drafter, seeded, with a random target head, in float64."""
    torch.manual_seed(0)
    draft = DFlashDraft(tiny_dflash_cfg(**kw))
    draft.load_target_head(torch.randn(50, 32), torch.randn(50, 32))
    return draft.double()
