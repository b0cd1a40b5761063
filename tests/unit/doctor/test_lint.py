"""doctor's lint checks apply each engine rule to exactly the target classes it was read from
(issue #34 item 6): SGLang's first-id rule (deepseek_v2.py, >= 0.5.13) is DeepSeek's alone, so a
correct export trained on aux layers 1,3,5 (SGLang ids 0,2,4) passes `aux_ids_read_alike` on
Qwen3-MoE, GPT-OSS, Llama 4 and Qwen3-VL targets, while DeepSeek still gets the rule."""

from __future__ import annotations

import pytest

from specdraft.doctor import run_doctor
from specdraft.export import export_draft
from tests.support.doctor_helpers import draft_checkpoint, edit_config, one_thread  # noqa: F401

KEY = "eagle_aux_hidden_state_layer_ids"


@pytest.mark.parametrize("arch", ["qwen3_moe", "gpt_oss", "llama4", "qwen3_vl"])
@pytest.mark.parametrize("engine", ["sglang", None])
def test_first_id_rule_spares_classes_it_was_not_read_from(tmp_path, arch, engine):
    draft, target = draft_checkpoint(tmp_path, arch=arch, num_layers=7, aux=(1, 3, 5))
    result = export_draft(draft, tmp_path / "out", engine="sglang", target=target)
    assert result.config["eagle_config"][KEY] == [0, 2, 4]  # SGLang's ids: first is not 1
    finding = run_doctor(tmp_path / "out", target=target, engine=engine).finding(
        "aux_ids_read_alike"
    )
    assert finding.verdict == "pass", finding
    assert "SGLang reads [1, 3, 5]" in finding.evidence


def test_first_id_rule_still_applies_to_deepseek(tmp_path):
    """The same nested ids [0, 2, 4] on a DeepSeek target: SGLang < 0.5.13 reads layers 1,3,5,
    >= 0.5.14 layers 0,2,4 (0.5.13 refuses the embeddings): a fail without --sglang-version."""
    draft, target = draft_checkpoint(tmp_path, arch="deepseek_v3", num_layers=7, aux=(2, 3, 5))
    export_draft(draft, tmp_path / "out", engine="sglang", target=target)
    edit_config(tmp_path / "out", lambda c: c["eagle_config"].update({KEY: [0, 2, 4]}))
    finding = run_doctor(tmp_path / "out", target=target, engine="sglang").finding(
        "aux_ids_read_alike"
    )
    assert finding.verdict == "fail", finding
    assert "start with 0, not 1: SGLang >= 0.5.13 reads such a list as-is on DeepSeek" in (
        finding.evidence
    )
