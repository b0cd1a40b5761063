"""Fixtures of the demo tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def stopped_train(monkeypatch) -> dict:
    """`specdraft.train.loop.train` replaced by a stub that keeps the TrainConfig it is given
    under "config" of the returned dict, then raises RuntimeError("stop here")."""
    import specdraft.train.loop as loop

    seen = {}

    def train(config, store, out, **kwargs):
        seen["config"] = config
        raise RuntimeError("stop here")

    monkeypatch.setattr(loop, "train", train)
    return seen
