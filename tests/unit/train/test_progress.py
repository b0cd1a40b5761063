"""specdraft.train.progress.counted_progress: the count and time left of any long stage, as
training shows them (rich's bar on a terminal, plain lines otherwise), on stderr."""

from __future__ import annotations

import itertools
import re

import pytest
from rich.console import Console

import specdraft.train.progress
from specdraft.train.progress import counted_progress, status_while, time_left


def test_plain_lines_off_a_terminal_count_and_give_the_time_left(monkeypatch, capsys):
    ticks = itertools.count(0.0, 10.0)  # every item takes 10 s
    monkeypatch.setattr(specdraft.train.progress.time, "monotonic", lambda: next(ticks))
    with counted_progress("timing", 4) as advance:
        for _ in range(4):
            advance()
    captured = capsys.readouterr()
    assert captured.out == ""  # stdout keeps a command's results (doctor --json, generate's text)
    assert captured.err.splitlines() == [
        "timing 1/4  ETA 0:00:30",
        "timing 2/4  ETA 0:00:20",
        "timing 3/4  ETA 0:00:10",
        "timing 4/4  ETA 0:00:00",
    ]
    assert time_left(0.0, 0, 5) == "-"  # no pace yet


@pytest.mark.parametrize(
    ("total", "counts"),
    [(100, [25, 50, 75, 100]), (32, [8, 16, 24, 32]), (7, [2, 4, 6, 7]), (6, [2, 4, 6])],
)
def test_a_long_stage_off_a_terminal_prints_a_few_lines(capsys, total, counts):
    """A redirected log had a line every 2 of 32 samples (16 a stage, 72 in a demo's log): now
    one a quarter of the stage, and the last item's."""
    with counted_progress("bench runs", total) as advance:
        for _ in range(total):
            advance()
    lines = capsys.readouterr().err.splitlines()
    assert [line.split("  ETA ")[0] for line in lines] == [
        f"bench runs {n}/{total}" for n in counts
    ]


def test_a_bar_on_a_terminal_and_nothing_when_disabled(monkeypatch, capsys):
    monkeypatch.setattr(Console, "is_terminal", property(lambda self: True))
    with counted_progress("doctor offline acceptance", 3) as advance:
        for _ in range(3):
            advance()
    err = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", capsys.readouterr().err)
    assert "doctor offline acceptance" in err and "3/3" in err
    with counted_progress("quiet", 3, enabled=False) as advance:
        advance()
    assert capsys.readouterr().err == ""


def test_a_stage_without_count_gets_a_status_line_once_it_runs_long(capsys):
    """Loading a target said nothing for ~13 s (tune) / ~11 s (doctor): off a terminal, one line
    once the stage has run after_s; a stage that ends (or fails) sooner prints nothing, so a
    refused input stays one error line."""
    import time

    with status_while("tune: loading the target", after_s=0.05):
        time.sleep(0.5)
    assert capsys.readouterr().err == "tune: loading the target ...\n"
    with status_while("quick", after_s=0.5):
        pass
    time.sleep(0.6)
    assert capsys.readouterr().err == ""


def test_a_status_spinner_on_a_terminal_shows_at_once(monkeypatch, capsys):
    monkeypatch.setattr(Console, "is_terminal", property(lambda self: True))
    with status_while("doctor: loading the target", after_s=60.0):
        pass
    err = capsys.readouterr().err
    assert "doctor: loading the target" in re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", err)


def test_a_terminal_only_status_prints_nothing_off_a_terminal(capsys):
    """tune's and doctor's import of torch (seconds) shows a spinner on a terminal only: off one a
    line there could precede a one-line error."""
    import time

    with status_while("doctor: loading torch and its checks", after_s=0.0, plain=False):
        time.sleep(0.2)
    assert capsys.readouterr().err == ""


def test_tune_and_doctor_show_a_spinner_while_importing_on_a_terminal(monkeypatch, tmp_path):
    from typer.testing import CliRunner

    import specdraft.bench.tune
    from specdraft.bench.config import BenchInputError
    from specdraft.cli import app

    monkeypatch.setattr(Console, "is_terminal", property(lambda self: True))

    def refuse(*args, **kwargs):
        raise BenchInputError("stop here")

    monkeypatch.setattr(specdraft.bench.tune, "tune_paths", refuse)
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "config.json").write_text("{}")
    (tmp_path / "d").mkdir()
    args = ["tune", "--target", str(tmp_path / "t"), "--draft", str(tmp_path / "d")]
    result = CliRunner().invoke(app, args)
    assert "tune: loading torch and the engine" in result.output
    doctor = CliRunner().invoke(app, ["doctor", str(tmp_path / "d")])
    assert "doctor: loading torch and its checks" in doctor.output
