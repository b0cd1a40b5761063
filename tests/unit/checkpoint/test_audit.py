"""A vocabulary map into the embedding's padding rows (target ids at or past the tokenizer's
length, below vocab_size) is refused whenever the tokenizer is known, the target's when no
manifest records one (issue #34 item 17): inspect's audit, doctor's vocab_map_valid, export."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from specdraft.checkpoint import CheckpointError, tokenizer_length
from specdraft.cli import app
from specdraft.doctor import run_doctor
from specdraft.export import export_draft
from tests.support.doctor_helpers import draft_checkpoint, one_thread  # noqa: F401
from tests.support.tiny_tokenizer import tiny_chat_tokenizer

PAST = "past the tokenizer's 85 tokens"  # the tiny tokenizer has 85, the target vocab_size 128


@pytest.fixture
def padded(tmp_path):
    """(a manifest-less drafter whose d2t maps draft ids to target ids 0, 2, .., 126, a target of
    vocab_size 128 whose tokenizer has 85 tokens: ids 86.. are padding rows)."""
    draft, target = draft_checkpoint(tmp_path, layout="sglang")
    tiny_chat_tokenizer().save_pretrained(target)
    assert tokenizer_length(target) == 85
    return draft, target


def test_inspect_audit_bounds_the_map_by_the_targets_tokenizer(padded):
    draft, target = padded
    result = CliRunner().invoke(app, ["inspect", str(draft), "--target", str(target)])
    text = " ".join(result.output.split())
    assert (
        result.exit_code == 1 and "audit: FAIL d2t maps 21 draft ids to target ids 86..126" in text
    )
    assert PAST in text


def test_doctor_vocab_map_valid_bounds_the_map_by_the_targets_tokenizer(padded):
    draft, target = padded
    finding = run_doctor(draft, target=target).finding("vocab_map_valid")
    assert finding.verdict == "fail" and PAST in finding.evidence


def test_export_refuses_the_map_by_the_targets_tokenizer(padded, tmp_path):
    draft, target = padded
    with pytest.raises(CheckpointError, match=PAST):
        export_draft(draft, tmp_path / "out", engine="vllm", target=target)


def test_without_a_tokenizer_the_bound_is_the_vocabulary(tmp_path):
    draft, target = draft_checkpoint(tmp_path, layout="sglang")
    assert tokenizer_length(target) is None
    finding = run_doctor(draft, target=target).finding("vocab_map_valid")
    assert finding.verdict == "pass" and "in [0, 128)" in finding.evidence
