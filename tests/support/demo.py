"""Rows of the demo's report built from given numbers (no model, no timing), and a demo that
runs in seconds on the bundled stories260K."""

from __future__ import annotations

from pathlib import Path

from specdraft.bench.speedup import timing_summary
from specdraft.demo.config import DemoConfig
from specdraft.demo.report import DemoReport


def plain_baseline(tokens_per_s: list[float], plain_tokens_per_s: list[float]) -> dict:
    """The report's baseline row: plain decoding (accept length 1, no acceptance per position)
    with `timing_summary(tokens_per_s, plain_tokens_per_s)` (tokens/s per pass)."""
    timing = timing_summary(tokens_per_s, plain_tokens_per_s)
    return {"accept_length": 1.0, "acceptance": [], **timing}


def sweep_report(sweep: list[dict], tree: dict, baseline: dict | None = None, **fields):
    """A DemoReport of these sweep rows and tree row on target "t", aux layers [2, 3, 4], against
    `baseline` (default: plain decoding at 1000 tokens/s in every pass, `plain_baseline`), with
    `fields` (DemoReport's) over them."""
    if baseline is None:
        baseline = plain_baseline([1000.0] * 3, [1000.0] * 3)
    given = {"target": "t", "aux_layers": [2, 3, 4], **fields}
    return DemoReport(baseline=baseline, sweep=sweep, tree=tree, **given)


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
