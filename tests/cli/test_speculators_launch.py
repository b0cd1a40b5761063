"""A speculators drafter served as `vllm serve DRAFTER`: doctor reads the method, draft length and
target from its config.json as vLLM does (so the launch line `export --engine speculators` prints
passes doctor), and a verifier other than --target is a fail naming what vLLM loads; convert and
export both record --target as the verifier and say when they replace another (fresh-user trial
items 2 and 4)."""

from __future__ import annotations

import json

import pytest

from specdraft.doctor import run_doctor
from tests.support.cli import cli_args, flat, invoke
from tests.support.doctor_helpers import draft_checkpoint, edit_config, one_thread  # noqa: F401

OTHER = "meta-llama/Llama-3.1-8B-Instruct"  # what speculators' converter config names


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """(speculators export, target, the launch line export printed)."""
    root = tmp_path_factory.mktemp("spec")
    draft, target = draft_checkpoint(root)
    result = invoke(cli_args("export", draft, root / "out", engine="speculators", target=target))
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    heading = next(i for i, line in enumerate(lines) if line.startswith("launch ("))
    return root / "out", target, lines[heading + 1]


def launch_heading(output: str) -> str:
    return next(line for line in output.splitlines() if line.startswith("launch"))


def test_the_launch_line_says_which_setting_it_serves_and_whence(exported, tmp_path):
    """export's default, a 3-step chain, is named as a default that was not tuned, with the options
    that pass a tuned one (the demo's summary recommends its own); given options are named as given."""
    out, target, _ = exported
    draft = out.parent / "draft"
    result = invoke(cli_args("export", draft, tmp_path / "a", engine="sglang", target=target))
    assert result.exit_code == 0, result.output
    assert launch_heading(result.output) == (
        "launch (steps 3, topk 1, draft tokens 4: export's default, not tuned; the demo's summary and specdraft "
        "tune measure the fastest setting: pass theirs as --num-steps, --topk, --num-draft-tokens):"
    )
    assert (
        "--speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4"
        in result.output
    )
    result = invoke(
        cli_args("export", draft, tmp_path / "b", engine="sglang", target=target, num_steps=5)
    )
    assert launch_heading(result.output) == (
        "launch (steps 5, topk 1, draft tokens 6: --num-steps as given, the "
        "rest export's defaults):"
    )
    result = invoke(
        cli_args(
            "export",
            draft,
            tmp_path / "c",
            engine="sglang",
            target=target,
            num_steps=4,
            topk=2,
            num_draft_tokens=7,
        )
    )
    assert launch_heading(result.output) == "launch (steps 4, topk 2, draft tokens 7, as given):"
    assert (
        "--speculative-num-steps 4 --speculative-eagle-topk 2 --speculative-num-draft-tokens 7"
        in result.output
    )


def findings(report) -> dict:
    return {f["check"]: f for f in report["findings"]}


def test_the_launch_line_export_prints_passes_doctor(exported):
    out, target, launch = exported
    assert launch == f"vllm serve {out.resolve()}"
    result = invoke(cli_args("doctor", out, target=target, engine_args=launch, json=True))
    checks = findings(json.loads(result.output))
    assert checks["algorithm_is_eagle3"]["verdict"] == "pass", checks["algorithm_is_eagle3"]
    assert "speculators_model_type eagle3 in" in checks["algorithm_is_eagle3"]["evidence"]
    assert checks["speculative_settings_valid"]["evidence"].startswith(
        "steps 3, topk 1, draft tokens 4"
    )
    assert checks["verifier_is_target"]["verdict"] == "pass", checks["verifier_is_target"]
    # no target of its own on the line (verifier_is_target covers the one vLLM loads): the draft is compared
    assert checks["launch_names_these_models"]["evidence"] == f"draft {out.resolve()} is CHECKPOINT"
    assert result.exit_code == 0, [c for c in checks.values() if c["verdict"] == "fail"]


def test_vllm_started_on_the_target_without_a_method_still_fails(exported):
    out, target, _ = exported
    finding = run_doctor(out, target=target, engine_args=f"vllm serve {target}").finding(
        "algorithm_is_eagle3"
    )
    assert finding.verdict == "fail" and "vLLM guesses the method" in finding.evidence


@pytest.fixture(scope="module")
def other_verifier(exported, tmp_path_factory):
    """A copy of the export whose verifier names another model (speculators' converter's)."""
    out, target, _ = exported
    copy = tmp_path_factory.mktemp("other") / "drafter"
    result = invoke(["convert", str(out), str(copy), "--layout", "speculators"])
    assert result.exit_code == 0, result.output
    edit_config(copy, lambda c: c["speculators_config"]["verifier"].update(name_or_path=OTHER))
    return copy, target


def test_a_verifier_other_than_the_target_fails_doctor_naming_what_vllm_loads(other_verifier):
    drafter, target = other_verifier
    finding = run_doctor(drafter, target=target).finding("verifier_is_target")
    assert finding.verdict == "fail"
    assert (
        f"`vllm serve {drafter}` loads verifier '{OTHER}' (a hub name or a path not on this machine) as the "
        f"target, not --target {target}" in finding.evidence
    )
    assert f"--engine speculators --target {target}" in finding.fix
    launched_on_target = (
        f"vllm serve {target} --speculative-config "
        f'\'{{"method": "eagle3", "model": "{drafter}", "num_speculative_tokens": 3}}\''
    )
    assert (
        run_doctor(drafter, target=target, engine_args=launched_on_target)
        .finding("verifier_is_target")
        .verdict
        == "pass"
    )  # vLLM reads no verifier then


@pytest.mark.parametrize("command", ["convert", "export"])
def test_convert_and_export_both_record_the_target_and_say_what_they_replace(
    other_verifier, tmp_path, command
):
    drafter, target = other_verifier
    mode = ["--layout", "speculators"] if command == "convert" else ["--engine", "speculators"]
    result = invoke([command, str(drafter), str(tmp_path / "out"), *mode, "--target", str(target)])
    assert result.exit_code == 0, result.output
    written = json.loads((tmp_path / "out" / "config.json").read_text())["speculators_config"][
        "verifier"
    ]
    assert written["name_or_path"] == str(target.resolve())
    assert (
        f"the source's verifier '{OTHER}' is replaced by '{target.resolve()}': `vllm serve` on the written drafter loads that one as the target"
        in flat(result.output)
    )
    assert (
        run_doctor(tmp_path / "out", target=target).finding("verifier_is_target").verdict == "pass"
    )
