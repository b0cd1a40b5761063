"""Rows of the demo's report built from given numbers (no model, no timing)."""

from __future__ import annotations

from specdraft.bench.speedup import timing_summary


def plain_baseline(tokens_per_s: list[float], plain_tokens_per_s: list[float]) -> dict:
    """The report's baseline row: plain decoding (accept length 1, no acceptance per position)
    with `timing_summary(tokens_per_s, plain_tokens_per_s)` (tokens/s per pass)."""
    timing = timing_summary(tokens_per_s, plain_tokens_per_s)
    return {"accept_length": 1.0, "acceptance": [], **timing}
