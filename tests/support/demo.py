"""Rows of the demo's report built from given numbers (no model, no timing), and a demo that
runs in seconds on the bundled stories260K."""

from __future__ import annotations

from pathlib import Path

from specdraft.bench.speedup import timing_summary
from specdraft.demo.config import DemoConfig


def plain_baseline(tokens_per_s: list[float], plain_tokens_per_s: list[float]) -> dict:
    """The report's baseline row: plain decoding (accept length 1, no acceptance per position)
    with `timing_summary(tokens_per_s, plain_tokens_per_s)` (tokens/s per pass)."""
    timing = timing_summary(tokens_per_s, plain_tokens_per_s)
    return {"accept_length": 1.0, "acceptance": [], **timing}


def tiny_demo_config(out: Path, data: Path, **changes) -> DemoConfig:
    """A DemoConfig for `data` under `out`: 3 training and 1 held-out records, 4 new tokens, 2
    training steps of batch 2, one chain (1 step) and one tree timed once; `changes` over them."""
    settings = {
        "num_train": 3,
        "num_heldout": 1,
        "max_new_tokens": 4,
        "train_steps": 2,
        "batch_size": 2,
        "sweep_steps": (1,),
        "tree": (1, 2, 3),
        "timing_repeats": 1,
    }
    return DemoConfig(out=out, data=data, **{**settings, **changes})
