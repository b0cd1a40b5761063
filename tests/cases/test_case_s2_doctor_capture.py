"""Case S2: the target side supplies one H-wide hidden state to a drafter whose fc takes 3·H.
With H_draft = H_target an engine's "apply fc only if widths differ" skips the fusion silently;
doctor's capture check must fail, and so must the fc-width lint for a drafter of another width."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from specdraft.cli import app
from specdraft.doctor import run_doctor
from specdraft.export import export_draft
from tests.support.cli import cli_args
from tests.support.doctor_helpers import (  # noqa: F401
    edit_config,
    edit_weights,
    one_thread,
    sglang_export,
)


@pytest.fixture(scope="module")
def healthy(tmp_path_factory):
    root = tmp_path_factory.mktemp("s2")
    return sglang_export(root)


def copy_export(src, dst, target):
    export_draft(src, dst, engine="sglang", target=target)
    return dst


def test_case_s2_aux_capture_off_in_config_fails(healthy, tmp_path):
    out, target = healthy
    ckpt = copy_export(out, tmp_path / "off", target)
    edit_config(ckpt, lambda c: c["eagle_config"].update(use_aux_hidden_state=False))
    finding = run_doctor(ckpt, target=target, engine="sglang").finding("aux_width_on_target")
    assert finding.verdict == "fail"
    assert (
        "SGLang supplies one hidden state (the draft config sets eagle_config.use_aux_hidden_state: "
        "false) = width 32, but fc takes 96 = 3 x 32" in finding.evidence
    )
    assert "skips fc silently" in finding.evidence


def test_case_s2_plain_eagle_algorithm_supplies_one_state(healthy):
    out, target = healthy
    report = run_doctor(
        out,
        target=target,
        engine="sglang",
        engine_args="--speculative-algorithm EAGLE --speculative-num-steps 3 "
        "--speculative-eagle-topk 1 --speculative-num-draft-tokens 4",
    )
    finding = report.finding("aux_width_on_target")
    assert finding.verdict == "fail" and "'EAGLE' is not 'EAGLE3'" in finding.evidence
    assert report.finding("offline_acceptance_matches_training").verdict == "skip"


def test_case_s2_healthy_capture_passes_on_a_real_forward(healthy):
    out, target = healthy
    finding = run_doctor(out, target=target, engine="sglang").finding("aux_width_on_target")
    assert finding.verdict == "pass"
    assert "SGLang supplies 3 states of layers [2, 3, 4] = width 96 = fc input" in finding.evidence


def test_case_s2_fc_of_another_width_fails_the_lint(healthy, tmp_path):
    out, target = healthy
    ckpt = copy_export(out, tmp_path / "two", target)
    edit_weights(ckpt, lambda t: t.update({"fc.weight": t["fc.weight"][:, :64].contiguous()}))
    manifest = json.loads((ckpt / "specdraft_manifest.json").read_text())
    manifest["draft"]["aux_layers"] = [2, 4]
    (ckpt / "specdraft_manifest.json").write_text(json.dumps(manifest))
    report = run_doctor(ckpt, target=target, engine="sglang")
    lint = report.finding("fc_width_matches_aux")
    assert (
        lint.verdict == "fail"
        and "takes 64 inputs, but the engines feed 3 aux states x target hidden 32 = 96"
        in lint.evidence
    )
    assert report.finding("aux_width_on_target").verdict == "fail"


def test_case_s2_cli(healthy, tmp_path):
    out, target = healthy
    ckpt = copy_export(out, tmp_path / "off", target)
    edit_config(ckpt, lambda c: c["eagle_config"].update(use_aux_hidden_state=False))
    result = CliRunner().invoke(app, cli_args("doctor", ckpt, target=target, engine="sglang"))
    assert result.exit_code == 1 and "aux_width_on_target" in result.output
