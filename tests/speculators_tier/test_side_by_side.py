"""benchmarks/side_by_side.py's tiny mode with speculators installed: speculators' trainer runs on
the CPU on specdraft's converted store for exactly the steps asked, and specdraft loads and scores
its drafter with the same code as its own."""

from __future__ import annotations

import sys

import pytest

from tests.support.benchmarks import last_json_line, run_smoke

pytestmark = pytest.mark.speculators


def test_tiny_side_by_side_trains_and_scores_both():
    result = run_smoke("side_by_side.py", ["--tiny", "--speculators-python", sys.executable])
    assert result.returncode == 0, result.stderr[-4000:]
    line = last_json_line(result.stdout)
    assert line["speculators_skipped"] is None
    for trainer in ("specdraft", "speculators"):
        row = line[trainer]
        assert row["steps"] == line["steps"] == 3, (
            trainer,
            row,
        )  # --max-steps ends the run, not one epoch
        assert row["train_tokens_per_s"] > 0
        for k in (3, 5):
            assert (
                1.0 <= row[f"replayed_tau_chain{k}"] <= k + 1
                and 1.0 <= row[f"engine_tau_chain{k}"] <= k + 1
            )
