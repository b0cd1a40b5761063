"""Case S4: `--speculative-eagle-topk 1 --speculative-num-steps 1 --speculative-num-draft-tokens 16`
is silently rewritten by SGLang (num_draft_tokens = steps + 1 = 2). Doctor's lint must fail with
the corrected values; FC-06: trees are bounded by 1 + topk + (steps - 1)·topk², not the looser
field rule."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from specdraft.cli import app
from specdraft.doctor import run_doctor
from tests.support.cli import cli_args
from tests.support.doctor_helpers import one_thread, sglang_export, sglang_launch  # noqa: F401

S4 = sglang_launch(eagle_topk=1, num_steps=1, num_draft_tokens=16)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    root = tmp_path_factory.mktemp("s4")
    return sglang_export(root)[0]


def settings(ckpt, args: str):
    return run_doctor(ckpt, engine="sglang", engine_args=args).finding("speculative_settings_valid")


def test_case_s4_topk1_draft_tokens_16_fails_with_corrected_values(ckpt):
    finding = settings(ckpt, S4)
    assert finding.verdict == "fail"
    assert "with topk 1 (a chain) num_draft_tokens must be num_steps + 1 = 2" in finding.evidence
    assert "SGLang would silently set num_draft_tokens = 2" in finding.evidence
    assert "num_steps 15 / num_draft_tokens 16" in finding.evidence
    assert "a tree (topk > 1), e.g. topk 4, num_steps 2, num_draft_tokens 16" in finding.evidence


def test_case_s4_consistent_settings_pass(ckpt):
    chain = settings(
        ckpt,
        "--speculative-algorithm EAGLE3 --speculative-num-steps 15 "
        "--speculative-eagle-topk 1 --speculative-num-draft-tokens 16",
    )
    assert chain.verdict == "pass" and "a chain" in chain.evidence


def test_case_fc06_tree_bound_is_the_expansion_size(ckpt):
    # topk 4, steps 3: up to 1 + 4 + 2·16 = 37 nodes (the field's "1 + steps·topk" = 13 is wrong)
    ok = settings(
        ckpt,
        "--speculative-num-steps 3 --speculative-eagle-topk 4 --speculative-num-draft-tokens 20",
    )
    assert ok.verdict == "pass" and "at most 37 nodes" in ok.evidence
    bad = settings(
        ckpt,
        "--speculative-num-steps 3 --speculative-eagle-topk 4 --speculative-num-draft-tokens 38",
    )
    assert (
        bad.verdict == "fail"
        and "2 <= num_draft_tokens <= 1 + topk + (num_steps - 1) * topk^2 = 37" in bad.evidence
    )


def test_case_s4_incomplete_or_unparsable_settings(ckpt):
    partial = settings(ckpt, "--speculative-num-steps 3")
    assert partial.verdict == "fail" and "--speculative-eagle-topk" in partial.evidence
    bad = settings(ckpt, "--speculative-num-steps x")
    assert bad.verdict == "fail" and "is not an integer" in bad.evidence
    none = settings(ckpt, "--speculative-algorithm EAGLE3")
    assert none.verdict == "skip" and "picks them itself" in none.evidence


def test_case_s4_vllm_chain_length(ckpt):
    finding = run_doctor(
        ckpt,
        engine="vllm",
        engine_args="vllm serve T --speculative-config "
        '\'{"method": "eagle3", "num_speculative_tokens": 5}\'',
    ).finding("speculative_settings_valid")
    assert finding.verdict == "pass" and "steps 5, topk 1, draft tokens 6" in finding.evidence


def test_case_s4_cli(ckpt):
    result = CliRunner().invoke(
        app,
        cli_args("doctor", ckpt, engine="sglang", engine_args=S4),
        env={"COLUMNS": "240"},
    )
    assert result.exit_code == 1
    assert "speculative_settings_valid" in result.output and "num_draft_tokens 16" in result.output
