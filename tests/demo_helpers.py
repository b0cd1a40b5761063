"""Helpers for the demo tests: a demo that runs in seconds on the bundled stories260K."""

from __future__ import annotations

from pathlib import Path

from specdraft.demo.config import DemoConfig


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
