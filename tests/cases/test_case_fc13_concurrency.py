"""Case FC-13: speculation loses at high concurrency. bench sweeps concurrency against the
no-speculation baseline, several runs per level, and reports the crossover point, or that there
is none.

The crossover rule is checked on injected per-run tokens/s, as a batched engine gives them
(speculation verifies several tokens per request per step, so its steps grow faster with the
requests in flight), so no assertion depends on timing. One end-to-end run against vLLM-like
fakes checks the plumbing only: counters, runs, and that the reported crossover is the rule
applied to the reported measurements."""

from __future__ import annotations

import json

from specdraft.bench.config import BenchConfig
from specdraft.bench.report import markdown, write_report
from specdraft.bench.stats import SpeedupPoint, find_crossover, verdict
from specdraft.bench.sweep import run_bench
from specdraft.serve.server import serve_in_thread
from tests.support.serve_helpers import fake_vllm_app, write_prompts

# concurrency -> (tokens/s of each speculative run, tokens/s of each baseline run)
BATCHED = {
    1: ([410.0, 395.0, 402.0], [200.0, 204.0, 198.0]),
    2: ([700.0, 690.0, 712.0], [395.0, 400.0, 405.0]),
    8: ([1300.0, 1280.0, 1320.0], [1500.0, 1490.0, 1510.0]),
}


def sweep(runs: dict[int, tuple[list[float], list[float]]]) -> list[SpeedupPoint]:
    return [SpeedupPoint.of(c, spec, base) for c, (spec, base) in runs.items()]


def test_case_fc13_crossover_where_the_batched_baseline_overtakes():
    points = sweep(BATCHED)
    assert [verdict(p, 0.05) for p in points] == ["wins", "wins", "loses"]
    cross = find_crossover(points, tie_band=0.05)
    assert cross.concurrency == 8
    assert cross.text == (
        "crossover: speculation stops winning by more than 5% and its run-to-run deviation "
        f"between concurrency 2 (speedup {points[1].text()}) and 8 (speedup {points[2].text()})"
    )
    assert points[2].text() == "0.87x ± 0.01"


def test_case_fc13_one_slow_run_is_not_a_loss():
    """A hiccup in one speculative run at concurrency 8: judged on that run alone speculation
    loses there; judged on the means of the runs it ties (within its deviation), never loses."""
    runs = {**BATCHED, 8: ([600.0, 1000.0, 1000.0], [900.0, 900.0, 900.0])}
    first_runs = [SpeedupPoint(c, spec[0] / base[0]) for c, (spec, base) in runs.items()]
    assert verdict(first_runs[2], 0.05) == "loses"
    points = sweep(runs)
    assert points[2].speedup < 1.0 and verdict(points[2], 0.05) == "ties"
    assert find_crossover(points, tie_band=0.05).concurrency == 8  # it still stops winning there


def test_case_fc13_flat_speedup_has_no_crossover():
    """A server that runs one sequence at a time (specdraft's own) keeps its speedup at every
    concurrency: no crossover."""
    runs = {c: ([300.0, 305.0, 298.0], [200.0, 199.0, 202.0]) for c in (1, 4, 16)}
    cross = find_crossover(sweep(runs), tie_band=0.05)
    assert cross.concurrency is None
    assert cross.text.startswith(
        "no crossover: speculation wins by more than 5% and its run-to-run deviation at "
        "every concurrency measured (up to 16, speedup 1.50x ± "
    )


def test_case_fc13_bench_end_to_end_against_vllm_like_servers(tmp_path):
    prompts = write_prompts(tmp_path / "prompts.jsonl", ["w1 w2 w3"])
    spec_app = fake_vllm_app(lambda active: 0.002 * (1 + active), tokens_per_step=2, num_spec=3)
    plain_app = fake_vllm_app(
        lambda active: 0.004 * (1 + active / 16), tokens_per_step=1, num_spec=0
    )
    with serve_in_thread(spec_app) as spec, serve_in_thread(plain_app) as plain:
        cfg = BenchConfig(
            spec.url,
            plain.url,
            str(prompts),
            (1, 4),
            max_tokens=6,
            num_prompts=4,
            warmup=0,
            repeats=2,
        )
        report = run_bench(cfg)
    assert (report.spec.kind, report.baseline.kind) == ("vllm", "vllm")
    for level in report.spec.levels:  # tau from vLLM's raw counters over both runs, M1
        assert level.num_runs == 2 and level.num_output_tokens == 2 * 4 * 6
        assert level.spec.num_drafts == 2 * 4 * 3  # 6 tokens at 2 per step: 3 steps per request
        assert level.spec.accept_length == 2.0 and level.spec.acceptance_per_position == [
            1.0,
            0.0,
            0.0,
        ]
        assert level.spec.num_draft_tokens == 3 * level.spec.num_drafts
    assert all(level.spec is None and level.num_runs == 2 for level in report.baseline.levels)
    assert report.speedups == [
        SpeedupPoint.of(a.concurrency, a.tokens_per_s_runs, b.tokens_per_s_runs)
        for a, b in zip(report.spec.levels, report.baseline.levels)
    ]
    assert report.crossover == find_crossover(report.speedups, cfg.tie_band)
    text = markdown(report)
    assert report.crossover.text in text and ": counters agree)" in text
    write_report(report, tmp_path / "out")
    data = json.loads((tmp_path / "out" / "bench.json").read_text())
    assert [p["verdict"] for p in data["speedups"]] == [
        verdict(p, cfg.tie_band) for p in report.speedups
    ]
