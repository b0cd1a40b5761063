"""specdraft.draft_rope: the drafter's rope frequencies and yarn's cos/sin factor equal
transformers' (`ROPE_INIT_FUNCTIONS`, which the engines' `YaRNScalingRotaryEmbedding` computes
alike), and a GPT-OSS target's yarn rope is the drafter's by default (issue #34 item 12)."""

from __future__ import annotations

import pytest
import torch
import transformers
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from specdraft.draft import apply_rope, rope_cos_sin
from specdraft.draft_config import DraftConfig, DraftError
from specdraft.draft_rope import rope_attention_factor, rope_inv_freq
from tests.support.drafts import seeded_draft
from tests.support.tiny_models import GPT_OSS_ROPE, tiny_config

# A truncating yarn (truncate left out: true), as Qwen's long-context configs write it
QWEN_YARN = {
    "rope_type": "yarn",
    "rope_theta": 1e6,
    "factor": 4.0,
    "original_max_position_embeddings": 32768,
}


def scaling_of(rope: dict) -> dict:
    return {k: v for k, v in rope.items() if k != "rope_theta"}


@pytest.mark.parametrize("rope", [GPT_OSS_ROPE, QWEN_YARN], ids=["gpt_oss", "truncated"])
@pytest.mark.parametrize("head_dim", [8, 64])
def test_yarn_frequencies_and_factor_are_transformers(rope, head_dim):
    config = transformers.LlamaConfig(
        hidden_size=4 * head_dim,
        num_attention_heads=4,
        head_dim=head_dim,
        max_position_embeddings=131072,
        rope_parameters=rope,
    )
    expected, factor = ROPE_INIT_FUNCTIONS["yarn"](config, "cpu")
    inv_freq = rope_inv_freq(head_dim, rope["rope_theta"], scaling_of(rope))
    torch.testing.assert_close(inv_freq.float(), expected, rtol=1e-6, atol=0)
    assert rope_attention_factor(scaling_of(rope)) == pytest.approx(factor, rel=1e-12)
    assert factor > 1.1  # the factor matters: q·k grows by its square


def test_gpt_oss_target_rope_is_the_drafters_and_rotates_as_the_target():
    """DraftConfig.from_target keeps GPT-OSS's yarn (it was refused: "yarn is not implemented");
    the drafter's q and k are rotated and scaled as transformers' GPT-OSS rotary does."""
    target = tiny_config(
        "gpt_oss", num_layers=4, rope_parameters=GPT_OSS_ROPE, max_position_embeddings=131072
    )
    cfg = DraftConfig.from_target(target, (1, 2, 3), 64)
    assert (cfg.rope_theta, cfg.rope_scaling) == (150000.0, scaling_of(GPT_OSS_ROPE))
    draft = seeded_draft(cfg, 0)
    q = torch.randn(1, cfg.num_attention_heads, 5, cfg.head_dim, dtype=torch.float64)
    positions = torch.tensor([[0, 1, 7, 100, 5000]])
    cos, sin = rope_cos_sin(positions, draft.inv_freq, torch.float64)
    ours = apply_rope(q, cos, sin) * draft.midlayer.self_attn.rope_scale
    rotary = transformers.models.gpt_oss.modeling_gpt_oss.GptOssRotaryEmbedding(target)
    t_cos, t_sin = rotary(q.float(), positions)  # [B, T, head_dim / 2], times attention scaling
    x1, x2 = q.float().chunk(2, dim=-1)
    c, s = t_cos[:, None], t_sin[:, None]
    theirs = torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)
    torch.testing.assert_close(ours.float(), theirs, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("key", ["attention_factor", "mscale", "extrapolation_factor"])
def test_yarn_keys_the_engines_read_apart_are_refused(key):
    rope = {**GPT_OSS_ROPE, key: 1.5}
    with pytest.raises(DraftError, match=f"yarn holds {key}"):
        DraftConfig.from_target(tiny_config("llama", rope_parameters=rope), (1, 2, 3))
