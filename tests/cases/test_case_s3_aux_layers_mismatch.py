"""Case S3, small: a 12-layer target, training layers [0, 3, 7], a serving config whose ids mean
[3, 7, 10]. Doctor must fail printing both lists and, per engine, the ids that express the
training layers or why it cannot; export --engine sglang refuses (embeddings are not capturable
on Llama-class targets); export --engine vllm writes [0, 3, 7]; offline acceptance with the wrong
layers is far below the right layers."""

from __future__ import annotations

import pytest

from specdraft.doctor import run_doctor
from specdraft.doctor.evidence import Evidence
from specdraft.doctor.inputs import DoctorInputs
from specdraft.doctor.offline import offline_run
from specdraft.export import ExportError, export_draft
from tests.support.doctor_helpers import edit_config, one_thread, trained_world  # noqa: F401


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return trained_world(tmp_path_factory)


def test_case_s3_sglang_config_meaning_3_7_10_fails_with_both_lists(world, tmp_path):
    export_draft(world.draft, tmp_path / "v", engine="vllm", target=world.target)
    edit_config(
        tmp_path / "v",
        lambda c: (
            c.pop("eagle_aux_hidden_state_layer_ids"),
            c.update(
                eagle_config={
                    "eagle_aux_hidden_state_layer_ids": [2, 6, 9],
                    "use_aux_hidden_state": True,
                }
            ),
        ),
    )
    finding = run_doctor(tmp_path / "v", target=world.target, engine="sglang").finding(
        "engine_captures_training_layers"
    )
    assert finding.verdict == "fail"
    assert "trained on [0, 3, 7] (specdraft indices)" in finding.evidence
    assert "SGLang captures [3, 7, 10] (eagle_config ids [2, 6, 9])" in finding.evidence
    assert "vLLM: top-level eagle_aux_hidden_state_layer_ids [0, 3, 7]" in finding.fix
    assert (
        "SGLang: cannot (id -1 (embeddings) is not capturable on Llama-class targets" in finding.fix
    )


def test_case_s3_export_sglang_refuses_and_vllm_writes_training_ids(world, tmp_path):
    with pytest.raises(
        ExportError, match=r"id -1 \(embeddings\) is not capturable on Llama-class targets"
    ):
        export_draft(world.draft, tmp_path / "s", engine="sglang", target=world.target)
    result = export_draft(world.draft, tmp_path / "v", engine="vllm", target=world.target)
    assert result.config["eagle_aux_hidden_state_layer_ids"] == [0, 3, 7]
    assert "eagle_config" not in result.config
    assert any("sglang cannot capture layers [0, 3, 7]" in n for n in result.notes)
    report = run_doctor(tmp_path / "v", target=world.target, engine="vllm", samples=world.samples)
    assert report.finding("engine_captures_training_layers").verdict == "pass"
    assert report.ok, report.failed


def accuracy(ckpt, world) -> list[float]:
    ev = Evidence(DoctorInputs(ckpt, target=world.target, engine="vllm", samples=world.samples))
    return offline_run(ev, "vllm", 3).metrics.accuracy()


def test_case_s3_offline_acceptance_with_wrong_layers_is_far_below(world, tmp_path):
    export_draft(world.draft, tmp_path / "right", engine="vllm", target=world.target)
    export_draft(world.draft, tmp_path / "wrong", engine="vllm", target=world.target)
    edit_config(tmp_path / "wrong", lambda c: c.update(eagle_aux_hidden_state_layer_ids=[3, 7, 10]))
    right, wrong = accuracy(tmp_path / "right", world), accuracy(tmp_path / "wrong", world)
    assert right[0] > 0.6 and wrong[0] < 0.5 * right[0], (right, wrong)
    report = run_doctor(
        tmp_path / "wrong", target=world.target, engine="vllm", samples=world.samples
    )
    finding = report.finding("offline_acceptance_matches_training")
    assert finding.verdict == "fail" and "aux layers [3, 7, 10]" in finding.evidence
    assert "layers (engine_captures_training_layers failed)" in finding.fix
