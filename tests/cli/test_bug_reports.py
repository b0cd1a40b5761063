"""One rule for errors: a user error (a SpecdraftError) is one line on stderr, no traceback; any other
exception is a bug: a one-line summary, then its traceback, exit 1."""

from __future__ import annotations

from typer.testing import CliRunner

import specdraft.engine.speculate
from specdraft.cli import app
from tests.support.cli import cli_args
from tests.support.engine_helpers import copy_with_word_tokenizer, tiny_setup


def test_a_bug_inside_the_engine_prints_its_traceback_and_exits_1(tmp_path, monkeypatch):
    setup = tiny_setup("llama")
    copy_with_word_tokenizer(setup, tmp_path / "target")

    def broken(*args, **kwargs):
        raise KeyError("boom")

    monkeypatch.setattr(specdraft.engine.speculate.SpeculativeEngine, "generate", broken)
    result = CliRunner().invoke(
        app,
        cli_args("generate", target=tmp_path / "target", prompt="w1 w2", max_new_tokens=4),
    )
    assert result.exit_code == 1, result.output
    assert (
        "error: unexpected KeyError: 'boom' (a bug in specdraft; the traceback follows)"
        in result.output
    )
    assert "Traceback (most recent call last)" in result.output
    assert 'raise KeyError("boom")' in result.output  # the frame that raised it


def test_a_bad_input_is_one_line_without_a_traceback(tmp_path):
    setup = tiny_setup("llama")
    copy_with_word_tokenizer(setup, tmp_path / "target")
    result = CliRunner().invoke(
        app,
        cli_args("generate", target=tmp_path / "target", prompt="hi", topk=2),
    )
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert lines == [
        "error: --topk: drafting settings, but no --draft is given (plain decoding): add --draft "
        "CKPT, or drop --topk"
    ], result.output
    assert "Traceback" not in result.output
