"""Output redirected (a file, a pipe, CliRunner: no terminal) keeps each line whole: rich would wrap
at 80 columns inside paths and table cells (`cli.common.make_console`)."""

from __future__ import annotations

from typer.testing import CliRunner

from specdraft.cli import app
from tests.doctor_helpers import draft_checkpoint, one_thread  # noqa: F401


def test_a_long_path_survives_unbroken_when_redirected(tmp_path):
    root = tmp_path / ("a-directory-with-a-rather-long-name-" * 3)
    draft, target = draft_checkpoint(root)
    out = root / "exported-for-sglang"
    assert len(str(out)) > 120
    runner = CliRunner()
    result = runner.invoke(app, ["export", str(draft), str(out), "--engine", "sglang", "--target", str(target)])
    assert result.exit_code == 0, result.output
    assert f"wrote {out} for sglang: " in result.output  # on one line
    doctor = runner.invoke(app, ["doctor", str(out), "--target", str(target)])
    assert f"specdraft doctor {out}" in doctor.output  # the table's title
    rows = [line for line in doctor.output.splitlines() if line.startswith("│")]
    assert rows and len({len(line) for line in rows}) == 1  # one table, as wide as its longest line
    assert max(len(line) for line in doctor.output.splitlines()) < 1000  # not padded to the console's width
