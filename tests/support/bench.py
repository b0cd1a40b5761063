"""bench reports built from given speedup points (no server, no timing)."""

from __future__ import annotations

from specdraft.bench.comparison import BenchReport
from specdraft.bench.config import BenchConfig
from specdraft.bench.levels import ServerRun
from specdraft.bench.stats import SpeedupPoint, find_crossover


def report_of(points: list[SpeedupPoint], repeats: int = 3) -> BenchReport:
    """The report of a specdraft server against a specdraft baseline (loopback URLs that nothing
    serves) over `points`, measured `repeats` times per level."""
    cfg = BenchConfig("http://127.0.0.1:1", "http://127.0.0.1:2", repeats=repeats)
    return BenchReport(
        cfg,
        ServerRun(cfg.url, "specdraft", "m"),
        ServerRun(cfg.baseline_url, "specdraft", "m"),
        points,
        find_crossover(points, cfg.tie_band),
    )
