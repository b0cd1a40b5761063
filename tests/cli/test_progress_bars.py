"""A finished progress bar (train, capture, regenerate) says how long it took, not the time left:
rich's TimeRemainingColumn showed 0:00:00 at the end (`train ... 1000/1000 0:00:00`)."""

from __future__ import annotations

import io
import itertools
import re

import pytest
import rich
import torch
from rich.console import Console

from specdraft.capture.store import StoreSettings
from specdraft.capture.write import write_store
from specdraft.data.render import Sample
from specdraft.regenerate.run import _progress as regen_progress
from specdraft.targets import load_target
from specdraft.train.progress import training_progress as train_progress
from tests.support.tiny_models import save_tiny_model


@pytest.fixture
def clock(monkeypatch):
    """Every read of rich's clock is 10 s later: a bar of two steps takes tens of seconds."""
    ticks = itertools.count(0.0, 10.0)
    monkeypatch.setattr("rich.console.monotonic", lambda: next(ticks))  # consoles made from here on
    monkeypatch.setattr(
        rich.get_console(), "get_time", lambda: next(ticks)
    )  # the global one (train's bar)


def last_line(text: str) -> str:
    return text.strip().splitlines()[-1]


def test_a_finished_train_bar_shows_the_time_taken(clock, capsys, monkeypatch):
    monkeypatch.setattr(
        Console, "is_terminal", property(lambda self: True)
    )  # the bar is a terminal's
    with train_progress(True, 2, 0) as advance:
        advance({"step": 1, "loss": 1.0})
        advance({"step": 2, "loss": 0.5})
    line = last_line(
        re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", capsys.readouterr().out)
    )  # the terminal's codes off
    assert "2/2" in line and "0:00:00" not in line and "loss 0.5000" in line, line


def test_a_finished_regenerate_bar_shows_the_time_taken(clock):
    buf = io.StringIO()
    with regen_progress(Console(file=buf, width=200), 2) as advance:
        advance(1)
        advance(1)
    line = last_line(buf.getvalue())
    assert "regenerate" in line and "100%" in line and "0:00:00" not in line, line


def test_a_finished_capture_bar_shows_the_time_taken(clock, tmp_path):
    target = load_target(save_tiny_model("llama", tmp_path / "tiny", num_layers=4))
    buf = io.StringIO()
    samples = [Sample([1, 5, 6, 7], [0, 0, 1, 1]), Sample([1, 8, 9], [0, 1, 1])]
    write_store(
        target,
        samples,
        tmp_path / "s",
        StoreSettings((1, 2, 3), torch.bfloat16, shard_tokens=4),
        console=Console(file=buf, width=200),
    )
    line = last_line(buf.getvalue())
    assert "capture" in line and "7/7 tokens" in line and "0:00:00" not in line, line
