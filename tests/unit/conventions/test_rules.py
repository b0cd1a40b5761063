"""ENGINE_RULES rows for the classes of issue #22 (read from sglang 0.5.23 and vllm 0.32.0 model
files): how each engine numbers aux ids, what it cannot capture, and the classes it serves no
EAGLE-3 drafter on, each refused with the engine's reason."""

from __future__ import annotations

import pytest

from specdraft.conventions import ConventionError, from_engine_ids, to_engine_ids

L = 12


@pytest.mark.parametrize("target_class", ["qwen3_moe", "llama4", "qwen3_vl"])
def test_sglang_boundary_classes_add_one_and_never_capture_index_l(target_class):
    assert to_engine_ids([0, 6, 9], "sglang", L, target_class, "0.5.23") == [-1, 5, 8]
    assert from_engine_ids([-1, 5, 8], "sglang", L, target_class, "0.5.23") == [0, 6, 9]
    with pytest.raises(ConventionError, match="index 12 .* not capturable"):
        to_engine_ids([2, 6, 12], "sglang", L, target_class)


@pytest.mark.parametrize(
    ("target_class", "version"), [("qwen3_moe", "0.5.10"), ("qwen3_vl", "0.5.11")]
)
def test_sglang_captures_the_embeddings_on_qwen3_moe_and_vl_since_first_read(target_class, version):
    """0.5.10-0.5.20 capture the residual after prepare_attn (qwen3_moe) or hidden when no
    residual exists yet (qwen3_vl): the embeddings before layer 0, in every version read."""
    assert to_engine_ids([0, 6, 9], "sglang", L, target_class) == [-1, 5, 8]
    assert to_engine_ids([0, 6, 9], "sglang", L, target_class, version) == [-1, 5, 8]
    with pytest.raises(ConventionError, match="model file was not read"):
        to_engine_ids([0, 6, 9], "sglang", L, target_class, "0.5.9")


def test_sglang_llama4_captures_the_embeddings_from_0_5_21():
    """llama4.py before 0.5.21 takes hidden + residual before layer i (residual None before
    layer 0); from 0.5.21 the layer boundary captures the embeddings."""
    with pytest.raises(ConventionError, match=r"in SGLang >= 0.5.10, < 0.5.21; .*SGLang >= 0.5.21"):
        to_engine_ids([0, 6, 9], "sglang", L, "llama4")
    with pytest.raises(ConventionError, match="embeddings"):
        to_engine_ids([0, 6, 9], "sglang", L, "llama4", "0.5.20")
    assert to_engine_ids([1, 6, 9], "sglang", L, "llama4") == [0, 5, 8]


@pytest.mark.parametrize("target_class", ["qwen3_moe", "gpt_oss", "llama4", "llava", "qwen3_vl"])
@pytest.mark.parametrize("engine", ["vllm", "speculators"])
def test_vllm_mixin_classes_capture_embeddings_to_index_l(target_class, engine):
    assert to_engine_ids([0, 6, 12], engine, L, target_class) == [0, 6, 12]
    assert from_engine_ids([0, 6, 12], engine, L, target_class) == [0, 6, 12]


def test_sglang_gpt_oss_keeps_ids_that_name_index_l():
    # gpt_oss.py 0.5.17-0.5.23: as-is when max(ids) == L (the final-norm boundary), else + 1
    for version in ("0.5.17", "0.5.23"):
        assert to_engine_ids([2, 6, 12], "sglang", L, "gpt_oss", version) == [2, 6, 12]
        assert from_engine_ids([2, 6, 12], "sglang", L, "gpt_oss", version) == [2, 6, 12]
        assert to_engine_ids([0, 6, 9], "sglang", L, "gpt_oss", version) == [-1, 5, 8]
    assert from_engine_ids([1, 5, 8], "sglang", L, "gpt_oss") == [2, 6, 9]


def test_sglang_gpt_oss_before_0_5_17_adds_one_to_every_list():
    """gpt_oss.py 0.5.10-0.5.16: [id + 1], hidden + residual before layer i: neither the
    embeddings nor index L; without --sglang-version, a list naming either is refused."""
    assert from_engine_ids([2, 6, 10], "sglang", L, "gpt_oss", "0.5.16") == [3, 7, 11]
    with pytest.raises(ConventionError, match="not capturable .* SGLang >= 0.5.17, which can"):
        to_engine_ids([2, 6, 12], "sglang", L, "gpt_oss")
    with pytest.raises(ConventionError, match="embeddings"):
        to_engine_ids([0, 6, 9], "sglang", L, "gpt_oss", "0.5.16")
    assert to_engine_ids([1, 6, 9], "sglang", L, "gpt_oss") == [0, 5, 8]


@pytest.mark.parametrize(
    ("engine", "target_class", "reason"),
    [
        (
            "vllm",
            "gemma2",
            "vLLM 0.32.0 serves no EAGLE-3 drafter on Gemma 2 .gemma2.py: no SupportsEagle3",
        ),
        ("vllm", "gemma3", "vLLM 0.32.0 serves no EAGLE-3 drafter on Gemma 3"),
        ("vllm", "qwen2_vl", "vLLM 0.32.0 serves no EAGLE-3 drafter on Qwen2-VL"),
        ("speculators", "gemma3", "vLLM 0.32.0 serves no EAGLE-3 drafter on Gemma 3"),
        ("sglang", "gemma2", "gemma2.py does not implement set_eagle3_layers_to_capture"),
        ("sglang", "qwen2_vl", "qwen2_vl.py does not implement set_eagle3_layers_to_capture"),
        ("sglang", "llava", "Mistral3ForConditionalGeneration"),
        ("sglang", "gemma3", "MLP branch .* not the residual stream"),
    ],
)
def test_engines_refuse_classes_they_do_not_serve(engine, target_class, reason):
    with pytest.raises(ConventionError, match=reason):
        to_engine_ids([2, 6, 9], engine, L, target_class)
    with pytest.raises(ConventionError, match=reason):
        from_engine_ids([2, 6, 9], engine, L, target_class)


def test_sglang_version_not_read_is_refused():
    with pytest.raises(ConventionError, match="SGLang 0.5.9's Qwen3-MoE model file was not read"):
        to_engine_ids([2, 6, 9], "sglang", L, "qwen3_moe", "0.5.9")
    with pytest.raises(ConventionError, match="SGLang 0.5.10's Qwen3-VL model file was not read"):
        to_engine_ids([2, 6, 9], "sglang", L, "qwen3_vl", "0.5.10")
    assert to_engine_ids([2, 6, 9], "sglang", L, "qwen3_moe", "0.5.20") == [1, 5, 8]
    assert to_engine_ids([2, 6, 9], "sglang", L, "qwen3_moe", "0.5.23") == [1, 5, 8]


def test_serving_problem_names_reasons_and_the_layers_engines_serve():
    from specdraft.data.serving import serving_problem

    assert serving_problem([2, 6, 9], L, "llama") is None
    assert serving_problem([0, 6, 12], L, "llama") is None  # vLLM captures both ends
    assert serving_problem([0, 6, 12], L, "qwen2_vl").startswith(
        "no engine serves an EAGLE-3 drafter on Qwen2-VL-class targets (SGLang: SGLang 0.5.23"
    )
    line = serving_problem([0, 3, 6], 8, "deepseek")  # vLLM: no embeddings; SGLang < 0.5.14: none
    assert line is None  # SGLang >= 0.5.14 captures the embeddings on DeepSeek
    line = serving_problem([0, 4, 8], 8, "deepseek")
    assert "no engine can capture aux layers [0, 4, 8] on DeepSeek-class targets" in line
    assert "captures indices 1..7, e.g. 2,4,5" in line
    assert serving_problem([1, 2, 3], 4, None) is None


def test_capture_and_train_name_the_serving_problem_before_any_work(tmp_path):
    from specdraft.capture.stage import serving_line
    from specdraft.train.sources import TargetInfo, serving_note
    from tests.support.tiny_models import save_tiny_model

    path = save_tiny_model("gemma2", tmp_path / "g", num_layers=8)
    assert "no engine serves an EAGLE-3 drafter on Gemma 2-class targets" in serving_line(
        None, path
    )
    assert serving_line([2, 4, 5], save_tiny_model("llama", tmp_path / "l", num_layers=8)) is None
    info = TargetInfo(
        config=None,
        aux_layers=(0, 4, 8),
        embed_weight=None,
        vocab_limit=None,
        manifest_fields={
            "target": {
                "num_layers": 8,
                "target_class": "deepseek",
                "architecture": "DeepseekV3ForCausalLM",
            }
        },
    )
    assert "no engine can capture aux layers [0, 4, 8] on DeepSeek-class" in serving_note(info)
    info.manifest_fields["target"]["architecture"] = (
        "LlavaForConditionalGeneration"  # recorded "llama"
    )
    info.manifest_fields["target"]["target_class"] = "llama"
    assert serving_note(info) is None  # vLLM serves Llava with both ends
