"""FC-06: an EAGLE-3 drafter served in plain EAGLE mode gives accept length 1.0 without a warning.
Doctor's lint checks the algorithm against the draft architecture (and fc's width: S2 tests)."""

from __future__ import annotations

import pytest

from specdraft.doctor import run_doctor
from tests.support.doctor_helpers import one_thread, sglang_export  # noqa: F401


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    root = tmp_path_factory.mktemp("fc06")
    return sglang_export(root)


def algorithm(ckpt, engine, args):
    return run_doctor(ckpt[0], target=ckpt[1], engine=engine, engine_args=args)


def test_case_fc06_sglang_plain_eagle_fails(ckpt):
    report = algorithm(
        ckpt,
        "sglang",
        "--speculative-algorithm EAGLE --speculative-num-steps 3 "
        "--speculative-eagle-topk 1 --speculative-num-draft-tokens 4",
    )
    finding = report.finding("algorithm_is_eagle3")
    assert finding.verdict == "fail"
    assert "--speculative-algorithm 'EAGLE' with an EAGLE-3 drafter" in finding.evidence
    assert (
        "accept length ~1.0" in finding.evidence
        and finding.fix == "set --speculative-algorithm EAGLE3"
    )
    assert report.finding("aux_width_on_target").verdict == "fail"


def test_case_fc06_vllm_method_eagle_fails(ckpt):
    finding = algorithm(
        ckpt,
        "vllm",
        'vllm serve T --speculative-config \'{"method": "eagle", "num_speculative_tokens": 3}\'',
    ).finding("algorithm_is_eagle3")
    assert (
        finding.verdict == "fail"
        and "plain EAGLE feeds one H-wide hidden state" in finding.evidence
    )


def test_case_fc06_vllm_without_method_fails_naming_the_guess(ckpt):
    finding = algorithm(
        ckpt,
        "vllm",
        'vllm serve T --speculative-config \'{"model": "/drafts/d", "num_speculative_tokens": 3}\'',
    ).finding("algorithm_is_eagle3")
    assert (
        finding.verdict == "fail" and "guesses the method from the draft path" in finding.evidence
    )
    assert "vllm config/speculative.py" in finding.evidence


def test_case_fc06_eagle3_passes(ckpt):
    finding = algorithm(
        ckpt,
        "vllm",
        'vllm serve T --speculative-config \'{"method": "eagle3", "num_speculative_tokens": 3}\'',
    ).finding("algorithm_is_eagle3")
    assert finding.verdict == "pass"
    assert algorithm(ckpt, "sglang", None).finding("algorithm_is_eagle3").verdict == "skip"
