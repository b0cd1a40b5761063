"""launch_names_these_models: the launch command's target and draft are --target and CHECKPOINT
(resolved paths), for vLLM and SGLang command lines; a name that is no local directory is a skip
that says so, never a silent pass."""

from __future__ import annotations

import pytest

from specdraft.doctor import run_doctor
from specdraft.export import export_draft
from tests.support.doctor_helpers import draft_checkpoint, one_thread  # noqa: F401

CHECK = "launch_names_these_models"


def vllm(target, draft) -> str:
    return (
        f"vllm serve {target} --speculative-config "
        f'\'{{"method":"eagle3","model":"{draft}","num_speculative_tokens":3}}\''
    )


def sglang(target, draft) -> str:
    return (
        f"python -m sglang.launch_server --model-path {target} --speculative-algorithm EAGLE3 "
        f"--speculative-draft-model-path {draft} --speculative-num-steps 3 "
        "--speculative-eagle-topk 1 --speculative-num-draft-tokens 4"
    )


# (launch, engine name, how the fix names the target, how it names the draft)
ENGINES = [
    (vllm, "vLLM", "vllm serve {}", '--speculative-config \'{{"model": "{}", ...}}\''),
    (sglang, "SGLang", "--model-path {}", "--speculative-draft-model-path {}"),
]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """(exported drafter, its target, another local model directory)."""
    root = tmp_path_factory.mktemp("launch")
    draft, target = draft_checkpoint(root)
    export_draft(draft, root / "out", engine="sglang", target=target)
    other = root / "other"
    other.mkdir()
    return root / "out", target, other


@pytest.mark.parametrize("launch, name, fix, _", ENGINES)
def test_wrong_target_fails_naming_both(world, launch, name, fix, _):
    out, target, other = world
    report = run_doctor(out, target=target, engine_args=launch(other, out))
    finding = report.finding(CHECK)
    assert finding.verdict == "fail", finding
    assert f"the command's target {other} is not --target {target}" in finding.evidence
    assert finding.fix.startswith(f"launch {name} with {fix.format(target)}") and not report.ok


@pytest.mark.parametrize("launch, name, _, fix", ENGINES)
def test_wrong_draft_fails_naming_both(world, launch, name, _, fix):
    out, target, other = world
    finding = run_doctor(out, target=target, engine_args=launch(target, other)).finding(CHECK)
    assert finding.verdict == "fail", finding
    assert finding.evidence == f"the command's draft {other} is not CHECKPOINT {out}"
    assert finding.fix.startswith(f"launch {name} with {fix.format(out)}"), finding.fix


@pytest.mark.parametrize("launch", [vllm, sglang])
def test_the_right_models_pass(world, launch):
    out, target, _ = world
    finding = run_doctor(out, target=target, engine_args=launch(target, out)).finding(CHECK)
    assert finding.verdict == "pass", finding
    assert finding.evidence == f"target {target} is --target; draft {out} is CHECKPOINT"


def test_a_hub_name_is_a_skip_that_says_so(world):
    out, target, _ = world
    finding = run_doctor(
        out, target=target, engine_args=vllm("meta-llama/Llama-3.1-8B", out)
    ).finding(CHECK)
    assert finding.verdict == "skip", finding
    assert "target 'meta-llama/Llama-3.1-8B' is no directory here (a hub name" in finding.evidence
    assert f"draft {out} is CHECKPOINT" in finding.evidence
