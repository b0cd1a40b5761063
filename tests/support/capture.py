"""Running `specdraft capture` in-process on the tiny chat target and reading its one-line
errors."""

from __future__ import annotations

from typer.testing import CliRunner

from specdraft.cli import app


def run(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def capture(chat_target_dir, data, out, *extra):
    return run(
        "capture", chat_target_dir, data, out, "--shard-tokens", 20, "--max-length", 30, *extra
    )


def one_line_error(result, *needles):
    lines = [
        line for line in result.output.strip().splitlines() if not line.startswith("aux layers ")
    ]
    assert result.exit_code == 1 and len(lines) == 1 and lines[0].startswith("error: "), (
        result.output
    )
    for needle in needles:
        assert needle in lines[0], result.output
    return lines[0]
