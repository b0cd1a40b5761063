"""`specdraft doctor DRAFT` without --target checks everything the drafter's own files fix: key
names and shapes, the vocabulary map and fc width from its config (a missing fc.weight fails);
the summary names the input that would run the skipped checks; --strict fails on any skip
(issue #20 item 11)."""

from __future__ import annotations

import json

import pytest

from specdraft.doctor import run_doctor
from tests.support.cli import flat, invoke
from tests.support.doctor_helpers import draft_checkpoint, edit_weights, one_thread  # noqa: F401

OWN_FILES = (
    "keys_match_engine",
    "shapes_and_dtypes",
    "values_finite",
    "vocab_map_valid",
    "variant_flags_implemented",
    "draft_vocab_size_declared",
    "lm_head_untied",
)


@pytest.fixture(scope="module")
def bare(tmp_path_factory):
    """A drafter in the SGLang layout (no manifest), as downloaded: its files only."""
    draft, _ = draft_checkpoint(tmp_path_factory.mktemp("own"), layout="sglang")
    return draft


def test_without_target_the_drafters_own_files_are_checked(bare):
    report = run_doctor(bare)
    for check in OWN_FILES + ("fc_width_matches_aux",):
        assert report.finding(check).verdict == "pass", report.finding(check)
    assert "fc takes 96 = 3 x 32" in report.finding("fc_width_matches_aux").evidence
    assert report.skips_enabled_by() == {
        "--target": 3,
        "--engine-args": 4,
        "--samples": 1,
        "--server": 1,
    }


def test_a_drafter_without_fc_weight_fails_without_target(bare, tmp_path):
    import shutil

    draft = shutil.copytree(bare, tmp_path / "d")
    edit_weights(draft, lambda t: t.pop("fc.weight"))
    keys = run_doctor(draft).finding("keys_match_engine")
    assert (
        keys.verdict == "fail"
        and "leave 1 parameters at their initial values [fc.weight]" in keys.evidence
    )
    result = invoke(["doctor", str(draft)])
    text = flat(result.output)
    assert result.exit_code == 1, result.output
    assert "2 fail" in text and "pass --target to run 2 more checks, --engine-args for 4" in text, (
        text
    )


def test_strict_fails_on_a_skip(bare):
    assert invoke(["doctor", str(bare)]).exit_code == 0
    strict = invoke(["doctor", str(bare), "--strict"])
    assert strict.exit_code == 1 and "--strict: 14 checks skipped" in flat(strict.output), (
        strict.output
    )
    as_json = invoke(["doctor", str(bare), "--strict", "--json"])
    assert (
        as_json.exit_code == 1 and json.loads(as_json.output)["skips_enabled_by"]["--target"] == 3
    )
