"""specdraft.draft_config.DraftConfig.from_target on configs transformers reads per layer."""

from __future__ import annotations

import pytest
import transformers

from specdraft.draft_config import DraftConfig, DraftError, method_flags, method_label, method_of
from tests.support.tiny_models import _dense_kwargs


def gemma4_config():
    """Gemma 4's text config: head_dim is per layer, and its global read raises."""
    if not hasattr(transformers, "Gemma4TextConfig"):
        pytest.skip("this transformers has no Gemma 4")
    return transformers.Gemma4TextConfig(**_dense_kwargs(7, 32, 128, 8))


def test_a_per_layer_value_is_one_line_naming_the_class_key_and_override():
    with pytest.raises(DraftError) as raised:
        DraftConfig.from_target(gemma4_config(), (2, 3, 4), draft_vocab_size=64)
    message = str(raised.value)
    assert message.startswith(
        "Gemma4TextConfig: head_dim differs by layer ('head_dim' is a per-layer attribute and "
        "may vary across layers); the drafter takes one value"
    )
    assert message.endswith('pass draft_overrides {"head_dim": N}') and "\n" not in message


def test_an_override_is_never_read_from_the_target():
    cfg = DraftConfig.from_target(gemma4_config(), (2, 3, 4), draft_vocab_size=64, head_dim=16)
    assert (cfg.head_dim, cfg.hidden_size, cfg.target_hidden_size) == (16, 32, 32)


def test_the_target_s_values_stand_where_nothing_overrides_them():
    target = transformers.LlamaConfig(**_dense_kwargs(7, 32, 128, 8))
    cfg = DraftConfig.from_target(target, (2, 3, 4), hidden_size=16, num_attention_heads=2)
    assert (cfg.hidden_size, cfg.target_hidden_size, cfg.num_attention_heads) == (16, 32, 2)
    assert cfg.head_dim == 32 // target.num_attention_heads  # the target's, as before
    assert cfg.num_key_value_heads == target.num_key_value_heads


@pytest.mark.parametrize(
    ("flags", "method", "label"),
    [
        ({}, "eagle3", "eagle3 (no norm flag)"),
        ({"fc_norm": True, "norm_output": True}, "eagle3.1", "eagle3.1 (fc_norm, norm_output)"),
        ({"fc_norm": True}, None, "EAGLE-3 variant (fc_norm)"),
        (
            {"norm_before_residual": True, "fc_norm": True, "norm_output": True},
            None,
            "EAGLE-3 variant (norm_before_residual, fc_norm, norm_output)",
        ),
    ],
)
def test_a_drafters_method_is_named_by_its_norm_flags(flags, method, label):
    """EAGLE-3.1 is exactly fc_norm + norm_output (SpecForge's qwen3-30B-A3B-eagle3.1.json,
    speculators' Eagle3SpeculatorConfig); a DraftConfig and a config dict read alike."""
    cfg = DraftConfig.from_target(
        {
            "hidden_size": 32,
            "num_attention_heads": 4,
            "intermediate_size": 64,
            "vocab_size": 128,
            "num_hidden_layers": 5,
            "max_position_embeddings": 64,
        },
        (2, 3, 4),
        **flags,
    )
    assert method_of(cfg) == method_of(flags) == method
    assert method_label(cfg) == method_label(flags) == label
    if method:
        assert {k: v for k, v in method_flags(method).items() if v} == flags
