"""Output redirected (a file, a pipe, CliRunner: no terminal) keeps each line whole: rich would wrap
at 80 columns inside paths and table cells (`cli.common.make_console`); doctor's table still wraps its
evidence at spaces, within `REDIRECTED_TEXT_WIDTH` columns or its longest path."""

from __future__ import annotations

from typer.testing import CliRunner

from specdraft.cli import app
from specdraft.cli.common import REDIRECTED_TEXT_WIDTH
from specdraft.doctor.launch import ENGINE_ARGS_FIX
from tests.support.cli import cli_args
from tests.support.doctor_helpers import draft_checkpoint, one_thread  # noqa: F401


def test_a_long_path_survives_unbroken_when_redirected(tmp_path):
    root = tmp_path / ("a-directory-with-a-rather-long-name-" * 3)
    draft, target = draft_checkpoint(root)
    out = root / "exported-for-sglang"
    assert len(str(out)) > 120
    runner = CliRunner()
    result = runner.invoke(app, cli_args("export", draft, out, engine="sglang", target=target))
    assert result.exit_code == 0, result.output
    assert f"wrote {out} for sglang: " in result.output  # on one line
    doctor = runner.invoke(app, ["doctor", str(out), "--target", str(target)])
    assert f"specdraft doctor {out}" in doctor.output  # the table's title
    rows = [line for line in doctor.output.splitlines() if line.startswith("│")]
    assert rows and len({len(line) for line in rows}) == 1  # one table, as wide as its longest line
    assert (
        max(len(line) for line in doctor.output.splitlines()) < 1000
    )  # not padded to the console's width
    assert (
        f" {target} " in doctor.output
    )  # the evidence's path on one line: the column is as wide as it
    assert len(rows[0]) < len(str(target)) + 30  # and its other text wraps at spaces


def cells_text(rows: list[str]) -> str:
    """A table's cell text read across its wrapped lines."""
    return " ".join(" ".join(row.replace("│", " ").split()) for row in rows)


def test_doctor_table_redirected_wraps_its_evidence_at_a_readable_width(tmp_path):
    """`doctor ... > report.txt` was as wide as its longest evidence (257 columns)."""
    draft, target = draft_checkpoint(tmp_path)
    doctor = CliRunner().invoke(app, ["doctor", str(draft), "--target", str(target)])
    rows = [line for line in doctor.stdout.splitlines() if line.startswith("│")]
    assert rows and len({len(line) for line in rows}) == 1  # one table
    assert REDIRECTED_TEXT_WIDTH < len(rows[0]) <= REDIRECTED_TEXT_WIDTH + len("│ verdict │  │")
    assert "fix: " + " ".join(ENGINE_ARGS_FIX.split()) in cells_text(
        rows
    )  # every word kept, wrapped at spaces
    assert f"trained for target {target} (" in cells_text(rows)
