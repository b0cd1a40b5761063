"""Case S1: the decoder layer under `layers.0.*` in a checkpoint whose config declares the official
(SGLang) layout. SGLang < 0.5.12 skips those names without a word (0.5.12 maps the legacy
`midlayer` to `layers.0`, so both load there: conventions.DRAFT_LOADING); doctor must fail naming
the keys, the rename and the SGLang versions that skip them, and `export --engine sglang` must
write `midlayer.*`."""

from __future__ import annotations

import json

import pytest
from safetensors.torch import load_file
from typer.testing import CliRunner

from specdraft.checkpoint import load_draft, save_draft
from specdraft.cli import app
from specdraft.doctor import run_doctor
from specdraft.export import export_draft
from tests.support.cli import cli_args
from tests.support.doctor_helpers import draft_checkpoint, edit_weights, one_thread, rename_layer  # noqa: F401


@pytest.fixture
def s1(tmp_path):
    """(checkpoint with layers.0.* tensors under an official config, target dir)."""
    draft, target = draft_checkpoint(tmp_path)
    export_draft(draft, tmp_path / "s1", engine="sglang", target=target)
    edit_weights(tmp_path / "s1", lambda t: rename_layer(t, "midlayer.", "layers.0."))
    return tmp_path / "s1", target


def test_case_s1_doctor_sglang_fails_naming_keys_and_rename(s1):
    ckpt, target = s1
    finding = run_doctor(ckpt, target=target, engine="sglang").finding("keys_match_engine")
    assert finding.verdict == "fail"
    assert "SGLang < 0.5.12 would skip 10 tensors" in finding.evidence
    assert "SGLang >= 0.5.12 loads all 15 tensors" in finding.evidence
    assert "layers.0.hidden_norm.weight" in finding.evidence
    assert (
        "leave 10 parameters at their initial values [midlayer.hidden_norm.weight"
        in finding.evidence
    )
    assert "rename layers.0. -> midlayer." in finding.evidence
    assert "--engine sglang" in finding.fix and "or serve with SGLang >= 0.5.12" in finding.fix


@pytest.mark.parametrize(
    ("version", "verdict"), [("0.5.11", "fail"), ("0.5.12", "pass"), ("0.5.23", "pass")]
)
def test_case_s1_depends_on_the_sglang_version(s1, version, verdict):
    ckpt, target = s1
    finding = run_doctor(ckpt, target=target, engine="sglang", sglang_version=version).finding(
        "keys_match_engine"
    )
    assert finding.verdict == verdict, finding
    assert ("SGLang would skip 10 tensors" in finding.evidence) == (verdict == "fail")


def test_case_s1_vllm_loads_either_prefix(s1):
    ckpt, target = s1
    assert (
        run_doctor(ckpt, target=target, engine="vllm").finding("keys_match_engine").verdict
        == "pass"
    )
    # without --engine, every engine the official config serves is checked: SGLang fails
    finding = run_doctor(ckpt, target=target).finding("keys_match_engine")
    assert finding.verdict == "fail" and "SGLang < 0.5.12 would skip" in finding.evidence


def test_case_s1_export_sglang_writes_midlayer_and_doctor_passes(tmp_path):
    draft, target = draft_checkpoint(tmp_path)
    source = load_draft(draft)
    save_draft(source.model, tmp_path / "spec", layout="speculators", verifier=str(target))
    assert any(
        k.startswith("layers.0.") for k in load_file(str(tmp_path / "spec" / "model.safetensors"))
    )
    result = export_draft(tmp_path / "spec", tmp_path / "out", engine="sglang", target=target)
    keys = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert sum(k.startswith("midlayer.") for k in keys) == 10
    assert not any(k.startswith("layers.") for k in keys) and result.num_tensors == len(keys)
    assert any("no specdraft manifest" in n for n in result.notes)
    report = run_doctor(tmp_path / "out", target=target, engine="sglang")
    assert report.finding("keys_match_engine").verdict == "pass"


def test_case_s1_cli_doctor_exits_nonzero(s1):
    ckpt, target = s1
    result = CliRunner().invoke(
        app, cli_args("doctor", ckpt, target=target, engine="sglang", json=True)
    )
    assert result.exit_code == 1
    report = json.loads(result.stdout)
    keys = next(f for f in report["findings"] if f["check"] == "keys_match_engine")
    assert keys["verdict"] == "fail" and "midlayer." in keys["evidence"]
