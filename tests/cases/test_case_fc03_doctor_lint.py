"""FC-03: the same physical layers written in one engine's id convention and read in the other's.
Doctor's lint must flag a file the two engines read differently, name what each captures, and
flag an explicit SGLang list whose first id is not 1 on a DeepSeek-class target; export writes
each engine its own ids, which then pass."""

from __future__ import annotations

import pytest

from specdraft.doctor import run_doctor
from specdraft.export import export_draft
from tests.support.cli import cli_args
from tests.support.doctor_helpers import draft_checkpoint, edit_config, one_thread  # noqa: F401

KEY = "eagle_aux_hidden_state_layer_ids"


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    root = tmp_path_factory.mktemp("fc03")
    draft, target = draft_checkpoint(root, num_layers=8, aux=(2, 4, 5))  # L = 8 default: [2, 4, 5]
    return draft, target


def nested_only(src, dst, target, ids):
    export_draft(src, dst, engine="sglang", target=target)
    edit_config(dst, lambda c: (c.pop(KEY), c["eagle_config"].update({KEY: ids})))
    return dst


def test_case_fc03_nested_only_file_is_read_differently(llama, tmp_path):
    draft, target = llama
    ckpt = nested_only(
        draft, tmp_path / "n", target, [1, 3, 4]
    )  # SGLang's convention for [2, 4, 5]
    report = run_doctor(ckpt, target=target)
    lint = report.finding("aux_ids_read_alike")
    assert lint.verdict == "fail"
    assert (
        "SGLang captures [2, 4, 5], vLLM [1, 3, 4]" in lint.evidence
        and "top-level" in lint.evidence
    )
    parity = report.finding("engine_captures_training_layers")
    assert parity.verdict == "fail" and "vLLM captures [1, 3, 4]" in parity.evidence
    assert "SGLang" not in parity.evidence.split("trained on")[1].split(";")[1]  # SGLang is right


def test_case_fc03_vllm_ids_read_by_sglang_are_off_by_one(llama, tmp_path):
    draft, target = llama
    ckpt = nested_only(draft, tmp_path / "n", target, [2, 4, 5])  # vLLM's convention, SGLang's key
    finding = run_doctor(ckpt, target=target, engine="sglang").finding(
        "engine_captures_training_layers"
    )
    assert finding.verdict == "fail" and "SGLang captures [3, 5, 6]" in finding.evidence
    assert "SGLang: eagle_config eagle_aux_hidden_state_layer_ids [1, 3, 4]" in finding.fix


def test_case_fc03_export_writes_each_engine_its_ids_and_passes(llama, tmp_path):
    draft, target = llama
    result = export_draft(draft, tmp_path / "e", engine="vllm", target=target)
    assert result.config[KEY] == [2, 4, 5] and result.config["eagle_config"][KEY] == [1, 3, 4]
    report = run_doctor(tmp_path / "e", target=target)
    assert report.finding("aux_ids_read_alike").verdict == "pass"
    assert report.finding("engine_captures_training_layers").verdict == "pass"


def test_case_fc03_deepseek_first_id_not_one_is_flagged(tmp_path):
    draft, target = draft_checkpoint(tmp_path, arch="deepseek_v3", num_layers=8, aux=(3, 4, 5))
    export_draft(draft, tmp_path / "d", engine="sglang", target=target, sglang_version="0.5.14")
    finding = run_doctor(tmp_path / "d", target=target, engine="sglang").finding(
        "aux_ids_read_alike"
    )
    assert finding.verdict == "fail" and "start with 3, not 1" in finding.evidence
    pinned = run_doctor(tmp_path / "d", target=target, engine="sglang", sglang_version="0.5.14")
    assert pinned.finding("aux_ids_read_alike").verdict == "pass"
    assert pinned.finding("engine_captures_training_layers").verdict == "pass"


@pytest.mark.parametrize("with_manifest", [True, False])
def test_case_fc03_nested_only_file_fails_for_vllm_alone(llama, tmp_path, with_manifest):
    """vLLM reads eagle_config ids (SGLang's convention) as-is: `doctor --engine vllm` fails the
    file on its own, not only when both engines are compared (issue #20 item 9)."""
    from typer.testing import CliRunner

    from specdraft.cli import app

    draft, target = llama
    ckpt = nested_only(
        draft, tmp_path / "n", target, [1, 3, 4]
    )  # SGLang's convention for [2, 4, 5]
    if not with_manifest:
        (ckpt / "specdraft_manifest.json").unlink()
    report = run_doctor(ckpt, target=target, engine="vllm")
    lint = report.finding("aux_ids_read_alike")
    assert lint.verdict == "fail", lint
    assert (
        "vLLM reads the eagle_config ids" in lint.evidence
        and "captures [1, 3, 4], not the [2, 4, 5]" in lint.evidence
    )
    assert (
        run_doctor(ckpt, target=target, engine="sglang").finding("aux_ids_read_alike").verdict
        == "pass"
    )
    result = CliRunner().invoke(
        app,
        cli_args("doctor", ckpt, target=target, engine="vllm"),
        env={"COLUMNS": "400"},
    )
    assert result.exit_code == 1 and "aux_ids_read_alike" in result.output, result.output
