"""specdraft.machine_load: the busy-machine note next to timings."""

from __future__ import annotations

import os

import pytest

from specdraft.machine_load import busy_note


@pytest.mark.parametrize("load, busy", [(0.9, False), (1.0, True), (3.7, True)])
def test_a_note_when_half_the_cores_or_more_are_busy(monkeypatch, load, busy):
    monkeypatch.setattr(os, "getloadavg", lambda: (load, 0.0, 0.0))
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    note = busy_note("the tokens/s above", "try X")
    assert (note is not None) == busy
    if busy:
        assert note == (
            f"note: the machine was busy when this started (load {load:.1f} on 2 cores): the tokens/s "
            "above are lower and noisier than on an idle machine; try X"
        )


def test_no_note_where_the_load_is_unknown(monkeypatch):
    monkeypatch.delattr(os, "getloadavg", raising=False)
    assert busy_note("the tokens/s above") is None
