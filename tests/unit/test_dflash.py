"""The DFlash drafter (specdraft/dflash.py) and the engines' default target layers: each block sees
the context before its anchor and its own block, never later context or other blocks."""

from __future__ import annotations

import pytest
import torch

from specdraft.conventions.dflash import dflash_aux_layers, dflash_target_layer_ids
from specdraft.dflash import DFlashConfig, DFlashDraft
from specdraft.draft_config import DraftError
from specdraft.train.dflash_loss import Blocks, block_inputs, block_mask
from tests.support.tiny_models import tiny_config

BLOCK = 4
SEQ = 12


def tiny_cfg(**kw) -> DFlashConfig:
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
        block_size=BLOCK,
    )
    return DFlashConfig(**{**base, **kw})


def tiny_draft() -> DFlashDraft:
    torch.manual_seed(0)
    draft = DFlashDraft(tiny_cfg())
    draft.load_target_head(torch.randn(50, 32), torch.randn(50, 32))
    return draft.double()


def run(draft, ids, aux, anchors):
    blocks = Blocks(torch.tensor([anchors]), torch.ones(1, len(anchors), dtype=torch.bool))
    block_ids, positions = block_inputs(ids, blocks, BLOCK, draft.cfg.mask_token_id)
    hidden = draft(block_ids, aux, positions, block_mask(blocks, SEQ, BLOCK))
    return hidden.view(1, len(anchors), BLOCK, -1)


def test_a_block_sees_the_context_before_its_anchor_and_nothing_of_later_blocks():
    draft = tiny_draft()
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 49, (1, SEQ), generator=g)
    aux = torch.randn(1, SEQ, 96, generator=g, dtype=torch.float64)
    base = run(draft, ids, aux, [3, 7])
    later = aux.clone()
    later[:, 3:] += 1.0  # the states at and after block 0's anchor
    moved = run(draft, ids, later, [3, 7])
    assert torch.equal(moved[:, 0], base[:, 0])  # block 0 reads context < 3 only
    assert not torch.allclose(moved[:, 1], base[:, 1])  # block 1 reads context < 7
    other = ids.clone()
    other[0, 7] = (ids[0, 7] + 1) % 49  # block 1's anchor token
    assert torch.equal(run(draft, other, aux, [3, 7])[:, 0], base[:, 0])
    earlier = aux.clone()
    earlier[:, 2] += 1.0  # inside block 0's context
    assert not torch.allclose(run(draft, ids, earlier, [3, 7])[:, 0], base[:, 0])


def test_positions_within_a_block_see_each_other():
    draft = tiny_draft()
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(0, 49, (1, SEQ), generator=g)
    aux = torch.randn(1, SEQ, 96, generator=g, dtype=torch.float64)
    base = run(draft, ids, aux, [5])
    other = ids.clone()
    other[0, 5] = (ids[0, 5] + 1) % 49  # the anchor, at block position 0
    assert not torch.allclose(run(draft, other, aux, [5])[0, 0, BLOCK - 1], base[0, 0, BLOCK - 1])


def test_tensor_names_are_the_engines():
    names = set(DFlashDraft(tiny_cfg()).state_dict())
    assert "fc.weight" in names and "hidden_norm.weight" in names and "norm.weight" in names
    assert {
        "layers.1.self_attn.q_norm.weight",
        "layers.1.self_attn.k_norm.weight",
        "layers.1.mlp.gate_proj.weight",
        "layers.0.post_attention_layernorm.weight",
    } <= names
    assert not any("embed" in n or "lm_head" in n for n in names)  # the target's, not saved


def test_default_target_layers_are_sglangs():
    assert dflash_target_layer_ids(36, 5) == [1, 9, 17, 25, 33]  # z-lab Qwen3-8B-DFlash-b16
    assert dflash_target_layer_ids(36, 1) == [18]
    assert dflash_aux_layers([1, 9]) == (2, 10)


def test_config_from_target_and_its_refusals():
    target = tiny_config("llama", num_layers=4, hidden_size=32, vocab_size=128)
    cfg = DFlashConfig.from_target(target, (1, 2, 3), 127, num_hidden_layers=1)
    assert cfg.target_layer_ids == (0, 1, 2) and cfg.aux_layers == (1, 2, 3)
    assert cfg.block_size == 16 and cfg.hidden_size == 32
    with pytest.raises(DraftError, match="mask_token_id 128"):
        DFlashConfig.from_target(target, (1, 2, 3), 128)
    with pytest.raises(DraftError, match="index 0"):
        DFlashConfig.from_target(target, (0, 2, 3), 127)
    with pytest.raises(DraftError, match="draft_overrides norm_output: no DFlashConfig field"):
        DFlashConfig.from_target(target, (1, 2, 3), 127, norm_output=True)
    with pytest.raises(DraftError, match="block_size 1"):
        tiny_cfg(block_size=1)
