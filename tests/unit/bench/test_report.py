"""specdraft.bench.report's figures, through the data given to matplotlib (`plot_data`): a title
on each, tokens/s and TPOT from 0, error bars (and an sd in the label) only where runs give a
spread; and bench.md's sentence on why tune's and the demo's numbers differ."""

from __future__ import annotations

from specdraft.bench.comparison import compare
from specdraft.bench.config import BenchConfig
from specdraft.bench.levels import LevelResult, ServerRun
from specdraft.bench.report import markdown, plot_data, write_report
from specdraft.bench.stats import Stats


def level(concurrency: int, runs: list[float]) -> LevelResult:
    tps = sum(runs) / len(runs)
    sd = 0.0 if len(runs) < 2 else (sum((r - tps) ** 2 for r in runs) / (len(runs) - 1)) ** 0.5
    stats = Stats.of([0.01, 0.02])
    return LevelResult(
        concurrency,
        4,
        0,
        1.0,
        64,
        tps,
        stats,
        stats,
        None,
        num_runs=len(runs),
        tokens_per_s_std=sd,
        tokens_per_s_runs=runs,
    )


def report(repeats: int):
    cfg = BenchConfig("http://a:1", "http://b:2", concurrency=(1, 4), repeats=repeats)
    spec = ServerRun(
        "http://a:1", "specdraft", "m", [level(1, [150.0] * repeats), level(4, [160.0] * repeats)]
    )
    base = ServerRun(
        "http://b:2", "specdraft", "m", [level(1, [100.0] * repeats), level(4, [110.0] * repeats)]
    )
    return compare(cfg, spec, base)


def test_each_plot_has_a_title_throughput_from_zero_and_bars_only_with_a_spread(tmp_path):
    one = plot_data(report(1))
    assert set(one) == {"throughput.png", "tpot.png", "speedup.png"}
    assert all(p.title for p in one.values())
    assert one["throughput.png"].from_zero and one["tpot.png"].from_zero
    assert one["throughput.png"].ylabel == "output tokens/s"  # no "± sd" without runs to spread
    assert one["throughput.png"].lines["speculative"] == ([1, 4], [150.0, 160.0], None)
    assert (
        one["speedup.png"].lines["speedup"][2] is None
        and one["speedup.png"].ylabel == "speedup (x)"
    )
    assert one["speedup.png"].reference == (1.0, "no speculation")
    three = plot_data(report(3))
    assert three["throughput.png"].ylabel == "output tokens/s (mean ± sd)"
    assert three["throughput.png"].lines["baseline"][2] == [0.0, 0.0]  # drawn as error bars
    assert three["tpot.png"].lines["speculative"][2] is None  # a p50: never error bars
    assert [p.name for p in write_report(report(1), tmp_path)][2:] == [
        "throughput.png",
        "tpot.png",
        "speedup.png",
    ]


def test_bench_md_says_why_tune_and_the_demo_differ():
    text = markdown(report(1))
    (line,) = [t for t in text.splitlines() if t.startswith("Why these numbers differ")]
    assert "servers over HTTP" in line and "one request at a time" in line
