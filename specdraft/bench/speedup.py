"""Which speculative setting to recommend, from timings taken in turns with plain decoding.

Shared by `specdraft demo` and `specdraft tune`, so both recommend by one rule: every setting and
plain decoding are timed once per round, the order rotated each round (`timed_passes`); a
setting's speedup is summarised from its same-round ratios to plain decoding (`timing_summary`:
median and quartiles); it beats plain decoding when the median reaches `min_speedup` and the
lower quartile is above 1x (`beats_plain`); settings within half the fastest one's interquartile
range of it tie (`ties_at_top`), and of the ties the one verifying the fewest tokens per step is
recommended (`pick_setting`). A row is a dict with timing_summary's keys and num_draft_tokens.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

# What the in-process timings divide, worded once for every report that prints them: the demo's
# (`demo.generation.generation_pass`) and tune's (`tune_model.decode_tokens_per_s`).
WALL_TOKENS_PER_S = "tokens/s: every new token over the wall time, the prefill included"
DECODE_TOKENS_PER_S = (
    "decode tokens/s: the tokens after each request's first over the time after its prefill"
)


def timed_passes(
    passes: dict[Any, Any], repeats: int, run: Callable[[Any], Any]
) -> dict[Any, list[Any]]:
    """`repeats` rounds of `run(name)` over every name in `passes` ("plain" among them), the
    order rotated each round, so load from other processes hits every setting and the plain
    baseline alike and each setting can be compared with the plain pass of its own round."""
    names = list(passes)
    runs: dict[Any, list[Any]] = {name: [] for name in names}
    for r in range(repeats):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            runs[name].append(run(name))
    return runs


def timing_summary(tokens_per_s: list[float], plain_tokens_per_s: list[float]) -> dict[str, Any]:
    """Median tokens/s over a setting's passes, and its speedup over plain decoding from the
    same-round ratios (one pass each per round): median, quartiles (the middle half of the rounds;
    a load spike in one round moves them little) and range."""
    ratios = [t / p for t, p in zip(tokens_per_s, plain_tokens_per_s)]
    q1, _, q3 = (
        statistics.quantiles(ratios, n=4, method="inclusive") if len(ratios) > 1 else ratios * 3
    )
    return {
        "tokens_per_s": statistics.median(tokens_per_s),
        "tokens_per_s_runs": list(tokens_per_s),
        "speedup": statistics.median(ratios),
        "speedup_q1": q1,
        "speedup_q3": q3,
        "speedup_low": min(ratios),
        "speedup_high": max(ratios),
    }


def plain_variation_warning(plain_tokens_per_s: list[float]) -> str | None:
    """The warning printed when plain decoding's tokens/s varied more than 10 % between timing
    rounds (a busy machine: the timings are noisy); None otherwise."""
    low, high = min(plain_tokens_per_s), max(plain_tokens_per_s)
    if high <= 1.1 * low:
        return None
    return (
        f"Warning: plain decoding itself varied {high / low - 1:.0%} between rounds: the "
        "machine was busy, so these timings are noisy."
    )


def beats_plain(row: dict[str, Any], min_speedup: float) -> bool:
    """Faster than plain decoding beyond the noise: a median speedup of at least `min_speedup`
    and a lower quartile above 1x (faster than plain in at least three rounds of four)."""
    return row["speedup"] >= min_speedup and row["speedup_q1"] > 1.0


def ties_at_top(rows: list[dict[str, Any]], min_speedup: float) -> list[dict[str, Any]]:
    """The settings that beat plain decoding (`beats_plain`) with a median speedup within the
    noise of the fastest one's (half its interquartile range of same-round speedups); [] when
    none wins."""
    winners = [r for r in rows if beats_plain(r, min_speedup)]
    if not winners:
        return []
    top = max(winners, key=lambda r: r["speedup"])
    noise = (top["speedup_q3"] - top["speedup_q1"]) / 2
    return [r for r in winners if r["speedup"] >= top["speedup"] - noise]


def pick_setting(rows: list[dict[str, Any]], min_speedup: float) -> dict[str, Any] | None:
    """The setting to recommend, or None when none beats plain decoding beyond the noise.

    Of the ties at the top (`ties_at_top`) the one verifying the fewest tokens per step is
    picked (the same speed for less work), so repeated runs agree on the pick.
    """
    ties = ties_at_top(rows, min_speedup)
    return min(ties, key=lambda r: (r["num_draft_tokens"], -r["speedup"])) if ties else None


def speedup_text(r: dict[str, Any]) -> str:
    """ "1.31x (1.25-1.36x)": the median and quartiles of the same-round speedups."""
    return f"{r['speedup']:.2f}x ({r['speedup_q1']:.2f}-{r['speedup_q3']:.2f}x)"
