"""bench marks a verdict inconclusive when a server's runs spread more than NOISY_SPREAD of their
mean (fresh-user trial: "loses" printed for 452 ± 597 tok/s on a busy machine). The check is a
pure function of the per-run numbers, so these tests use synthetic runs and no timing; the
noise line is no WARNING, so tests that count warnings are unaffected by a loaded machine."""

from __future__ import annotations

import pytest

from specdraft.bench.report import markdown
from specdraft.bench.stats import (
    NOISY_SPREAD,
    SpeedupPoint,
    noise_note,
    noisy_runs,
    verdict,
)
from tests.support.bench import report_of

BUSY = [1141.0, 115.0, 100.0]  # mean 452, sd 597: the trial's numbers
STEADY = [1200.0, 1190.0, 1210.0]


def test_noisy_runs_names_the_servers_whose_spread_exceeds_the_limit():
    assert (
        noisy_runs({"speculative": BUSY, "baseline": STEADY})
        == "speculative 452 ± 597 tok/s (sd/mean 1.32)"
    )
    both = noisy_runs({"speculative": BUSY, "baseline": [100.0, 300.0]})
    assert (
        both
        == "speculative 452 ± 597 tok/s (sd/mean 1.32); baseline 200 ± 141 tok/s (sd/mean 0.71)"
    )
    assert noisy_runs({"speculative": STEADY, "baseline": STEADY}) is None
    assert noisy_runs({"speculative": [5000.0], "baseline": [1.0]}) is None  # one run: no spread
    assert noisy_runs({"speculative": [0.0, 0.0]}) is None  # every request failed: nothing to judge
    edge = [100.0, 100.0 + NOISY_SPREAD * 100.0 * 2**0.5]  # sd / mean just below the limit
    assert (
        noisy_runs({"baseline": edge}) is None
        and noisy_runs({"baseline": edge}, limit=0.2) is not None
    )


def test_a_noisy_level_is_reported_inconclusive_with_its_numbers():
    noisy = SpeedupPoint.of(4, BUSY, STEADY)
    assert noisy.noise == "speculative 452 ± 597 tok/s (sd/mean 1.32)"
    assert (
        verdict(noisy, 0.05) == "loses"
    )  # the verdict of the means is kept, and qualified in the report
    loud_baseline = SpeedupPoint.of(8, STEADY, [2000.0, 600.0, 700.0])
    assert loud_baseline.noise == "baseline 1100 ± 781 tok/s (sd/mean 0.71)"
    steady = SpeedupPoint.of(1, [2400.0, 2410.0, 2390.0], STEADY)
    assert steady.noise is None and verdict(steady, 0.05) == "wins"
    text = markdown(report_of([steady, noisy, loud_baseline]))
    assert f"| 1 | {steady.speedup:.2f}x | {steady.speedup_std:.2f} | wins | steady |" in text
    # before: "| 4 | 0.38x | 0.50 | loses |" with nothing saying the runs were noise
    assert (
        f"| 4 | {noisy.speedup:.2f}x | {noisy.speedup_std:.2f} | loses | noisy: verdict inconclusive |"
        in text
    )
    assert "| 8 | 1.09x | 0.77 | ties | noisy: verdict inconclusive |" in text
    note = noise_note([steady, noisy, loud_baseline])
    assert note in text.splitlines()
    assert note == (
        "Noisy runs (sd/mean above 0.25), so the verdict there and any crossover it sets are inconclusive: "
        "concurrency 4: speculative 452 ± 597 tok/s (sd/mean 1.32); concurrency 8: baseline 1100 ± 781 "
        "tok/s (sd/mean 0.71); re-run on an idle machine, or with more --num-prompts so each run lasts "
        "longer"
    )
    assert "WARNING" not in text  # its own kind: the WARNING lines stay the server-setup ones


def test_steady_levels_add_no_note_and_the_json_carries_the_noise():
    steady = SpeedupPoint.of(1, [2400.0, 2410.0, 2390.0], STEADY)
    assert noise_note([steady]) is None and "Noisy runs" not in markdown(report_of([steady]))
    data = report_of([steady, SpeedupPoint.of(4, BUSY, STEADY)]).to_dict()["speedups"]
    assert [p["noise"] for p in data] == [None, "speculative 452 ± 597 tok/s (sd/mean 1.32)"]
    assert [p["verdict"] for p in data] == ["wins", "loses"]


@pytest.mark.parametrize("runs", [[1000.0, 1000.0], [1000.0]])
def test_identical_or_single_runs_are_never_noisy(runs):
    assert SpeedupPoint.of(1, runs, runs).noise is None
