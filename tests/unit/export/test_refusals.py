"""export's refusals name the cause (issue #34 item 10): a target class no engine rule covers
(OLMo 2) is named as such, with no "pass --target" advice when
--target was passed."""

from __future__ import annotations

import pytest

from specdraft.export import ExportError, export_draft
from tests.support.doctor_helpers import one_thread, unsupported_target  # noqa: F401


@pytest.mark.parametrize(
    ("config_class", "architecture"),
    [("Olmo2Config", "Olmo2ForCausalLM")],
)
def test_export_names_a_target_class_without_engine_rule(tmp_path, config_class, architecture):
    draft, target = unsupported_target(tmp_path, config_class)
    with pytest.raises(ExportError) as err:
        export_draft(draft, tmp_path / "out", engine="sglang", target=target)
    message = str(err.value)
    assert f"no engine rule is known for the target class {architecture} (target {target})" in (
        message
    )
    assert "--target" not in message and not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("config_class", "vllm_ids", "sglang_ids"),
    [("Qwen3_5TextConfig", [2, 3, 4], [1, 2, 3]), ("Gemma4TextConfig", [2, 3, 4], [1, 2, 3])],
)
def test_export_writes_qwen3_5_and_gemma4_ids_as_each_engine_reads_them(
    tmp_path, config_class, vllm_ids, sglang_ids
):
    """vLLM 0.32.0 serves EAGLE-3 on Qwen3.5 (qwen3_5.py) and Gemma 4 (gemma4.py) through
    EagleModelMixin, SGLang from 0.5.22 / 0.5.20 with [id + 1]: export writes each one's ids."""
    draft, target = unsupported_target(tmp_path, config_class)
    vllm = export_draft(draft, tmp_path / "vllm", engine="vllm", target=target)
    assert vllm.config["eagle_aux_hidden_state_layer_ids"] == vllm_ids
    sglang = export_draft(draft, tmp_path / "sglang", engine="sglang", target=target)
    assert sglang.config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == sglang_ids
