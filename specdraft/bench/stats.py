"""The statistics of a benchmark sweep: sample summaries, run-to-run noise, the speedup of one
concurrency level with its deviation, its verdict (wins / ties / loses) and the crossover.

Pure functions of measured numbers (throughputs in output tokens per second, latencies in
seconds): nothing here times anything, so tests give them numbers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

NO_BASELINE = (
    "no baseline: speedup not measured (pass --baseline-url URL: the same engine without "
    "speculation)"
)
# Two runs are the fewest with a spread (a sample standard deviation); a verdict must clear that
# spread, so a shaky two-run spread turns a level into a tie, never into a false win.
MIN_VERDICT_REPEATS = 2
NO_VERDICT = (
    f"no verdict: one run per level has no run-to-run spread to tell a win from noise; "
    f"a verdict needs --repeats {MIN_VERDICT_REPEATS} or more (the default 3 gives a steadier spread)"
)
# A server whose per-run tokens/s spread more than this fraction of their mean (sample sd / mean)
# measured a busy machine more than itself: a verdict at that level is inconclusive.
NOISY_SPREAD = 0.25


@dataclass
class Stats:
    """mean, p50 and p99 of a sample (seconds); None for an empty sample."""

    mean: float | None
    p50: float | None
    p99: float | None

    @classmethod
    def of(cls, values: list[float]) -> Stats:
        """Stats of `values`."""
        if not values:
            return cls(None, None, None)
        a = np.asarray(values, dtype=float)
        return cls(float(a.mean()), float(np.percentile(a, 50)), float(np.percentile(a, 99)))


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """(mean, sample standard deviation) of a non-empty sample; the deviation of one value is 0."""
    a = np.asarray(values, dtype=float)
    return float(a.mean()), float(a.std(ddof=1)) if len(a) > 1 else 0.0


def noisy_runs(
    runs_by_server: dict[str, Sequence[float]], limit: float = NOISY_SPREAD
) -> str | None:
    """The servers whose per-run throughputs spread more than `limit` of their mean (sample sd /
    mean), as "speculative 452 ± 597 tok/s (sd/mean 1.32)" joined by "; "; None when every
    server's runs are steady (one run has no spread)."""
    noisy = []
    for name, runs in runs_by_server.items():
        mean, std = mean_std(runs)
        if mean > 0 and std / mean > limit:
            noisy.append(f"{name} {mean:.0f} ± {std:.0f} tok/s (sd/mean {std / mean:.2f})")
    return "; ".join(noisy) or None


@dataclass(frozen=True)
class SpeedupPoint:
    """Speculation against the baseline at one concurrency. speedup: mean throughput with
    speculation / mean throughput of the baseline; speedup_std: its standard deviation from the
    runs' spreads (first order: the relative variances add; 0 with one run each); noise:
    `noisy_runs` of both servers' runs (None when steady: else no verdict there is conclusive)."""

    concurrency: int
    speedup: float
    speedup_std: float = 0.0
    noise: str | None = None
    num_errors: int = (
        0  # failed requests on both servers at this level: the speedup is then invalid
    )

    @classmethod
    def of(
        cls,
        concurrency: int,
        spec_runs: Sequence[float],
        baseline_runs: Sequence[float],
        num_errors: int = 0,
    ) -> SpeedupPoint:
        """The point of the per-run tokens/s of both servers at `concurrency`."""
        (spec_mean, spec_std), (base_mean, base_std) = mean_std(spec_runs), mean_std(baseline_runs)
        speedup = spec_mean / base_mean
        relative = math.hypot(spec_std / spec_mean if spec_mean else 0.0, base_std / base_mean)
        noise = noisy_runs({"speculative": spec_runs, "baseline": baseline_runs})
        return cls(concurrency, speedup, speedup * relative, noise, num_errors)

    def text(self) -> str:
        """ "1.23x", or "1.23x ± 0.04" when the runs spread."""
        return f"{self.speedup:.2f}x" + (f" ± {self.speedup_std:.2f}" if self.speedup_std else "")


def verdict(point: SpeedupPoint, tie_band: float = 0.0) -> str:
    """ "wins", "loses" or "ties" at one point: speculation wins (loses) only when its mean
    tokens/s is above (below) the baseline's by more than tie_band and by more than the
    speedup's standard deviation; anything closer is run-to-run noise."""
    margin = max(tie_band, point.speedup_std)
    if point.speedup > 1.0 + margin:
        return "wins"
    return "loses" if point.speedup < 1.0 - margin else "ties"


@dataclass
class Crossover:
    """Where speculation stops winning: the first concurrency with no win after a win (None
    when no win is followed by a non-win: it wins everywhere, never wins, only starts winning
    at some concurrency and keeps winning, or there is no baseline). text: the plain sentence."""

    concurrency: int | None
    text: str


def margin_text(tie_band: float, noisy: bool) -> str:
    """ " by more than 5% and its run-to-run deviation" (the parts that apply)."""
    parts = [f"{tie_band:.0%}"] * bool(tie_band) + ["its run-to-run deviation"] * noisy
    return f" by more than {' and '.join(parts)}" if parts else ""


def find_crossover(
    points: list[SpeedupPoint], tie_band: float = 0.0, invalid: Sequence[int] = ()
) -> Crossover:
    """Crossover of the points (sorted here by concurrency), judged by `verdict`: speculation
    stops winning at the first point after a win that is no win (a tie or a loss). The text
    says which case holds: wins at every concurrency, loses at every one, wins at none,
    wins only from some concurrency on (no crossover), or stops winning between two
    concurrencies (naming any later concurrency where it wins again). invalid: concurrencies
    measured but left out of `points` (failed requests): the text then speaks of "every valid
    concurrency" and names them."""
    points = sorted(points, key=lambda p: p.concurrency)
    if not points:
        return Crossover(None, NO_BASELINE)
    crossover = _crossover(
        points,
        tie_band,
        "valid concurrency" if invalid else "concurrency measured",
        "valid" if invalid else "measured",
    )
    if invalid:
        left_out = ", ".join(map(str, sorted(invalid)))
        crossover.text += f" (left out, failed requests: concurrency {left_out})"
    return crossover


def _crossover(
    points: list[SpeedupPoint], tie_band: float, measured: str, highest: str
) -> Crossover:
    """`find_crossover` of sorted, non-empty points; measured: "concurrency measured" or "valid
    concurrency"; highest: "measured" or "valid"."""
    verdicts = [verdict(p, tie_band) for p in points]
    wins = [v == "wins" for v in verdicts]
    band = margin_text(tie_band, any(p.speedup_std > 0 for p in points))
    if all(wins):
        last = points[-1]
        return Crossover(
            None,
            f"no crossover: speculation wins{band} at every {measured} "
            f"(up to {last.concurrency}, speedup {last.text()} there)",
        )
    if not any(wins):
        best = max(points, key=lambda p: p.speedup)
        how = (
            f"loses at every {measured}"
            if all(v == "loses" for v in verdicts)
            else f"does not win{band} at any {measured}"
        )
        return Crossover(
            None,
            f"no crossover: speculation {how} "
            f"(best speedup {best.text()} at concurrency {best.concurrency})",
        )
    i = next((i for i in range(1, len(points)) if wins[i - 1] and not wins[i]), None)
    if i is None:  # no win is followed by a non-win: speculation starts winning and keeps winning
        first = points[wins.index(True)]
        return Crossover(
            None,
            f"speculation wins from concurrency {first.concurrency} on (speedup "
            f"{first.text()} there); below concurrency {first.concurrency} it does "
            f"not win{band}; no crossover: it does not stop winning up to concurrency "
            f"{points[-1].concurrency}, the highest {highest}",
        )
    a, b = points[i - 1], points[i]
    again = [p.concurrency for p, w in zip(points[i + 1 :], wins[i + 1 :]) if w]
    resumes = f"; it wins again at concurrency {', '.join(map(str, again))}" if again else ""
    return Crossover(
        b.concurrency,
        f"crossover: speculation stops winning{band} between concurrency "
        f"{a.concurrency} (speedup {a.text()}) and {b.concurrency} "
        f"(speedup {b.text()}){resumes}",
    )


def noise_note(points: Sequence[SpeedupPoint]) -> str | None:
    """One line naming the concurrencies whose runs are too noisy to judge (`SpeedupPoint.noise`)
    and the fix; None when every point is steady."""
    noisy = [f"concurrency {p.concurrency}: {p.noise}" for p in points if p.noise]
    if not noisy:
        return None
    return (
        f"Noisy runs (sd/mean above {NOISY_SPREAD}), so the verdict there and any crossover it sets are "
        f"inconclusive: {'; '.join(noisy)}; re-run on an idle machine, or with more --num-prompts so each "
        "run lasts longer"
    )


def point_verdict(point: SpeedupPoint, tie_band: float) -> str:
    """`verdict`, or "invalid: N errors" for a level with failed requests."""
    return f"invalid: {point.num_errors} errors" if point.num_errors else verdict(point, tie_band)
