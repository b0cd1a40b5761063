"""A sweep's comparison (`BenchReport`, `compare`): the speedup and verdict per level, the
crossover (FC-13), and the warnings that make a comparison invalid (failed requests, a measured
server that does not speculate, a baseline that does). Without a baseline speculation is never
called a win (DESIGN.md invariant 6); a level with a failed request on either server has no valid
speedup."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from specdraft.bench.config import BenchConfig
from specdraft.bench.levels import ServerRun
from specdraft.bench.stats import (
    MIN_VERDICT_REPEATS,
    NO_VERDICT,
    Crossover,
    SpeedupPoint,
    find_crossover,
    point_verdict,
)

ALL_INVALID = "every concurrency measured had failed requests, so no speedup is valid"


def baseline_warning(baseline: ServerRun) -> str | None:
    """The one-line warning when the baseline itself speculates: some level shows speculative
    counts (specdraft / vLLM /metrics counters that moved, SGLang's spec_verify_ct) or a
    specdraft usage accept length above 1. None when there is no such signal (plain decoding,
    or a server that exposes none)."""
    for level in baseline.levels:
        if level.spec is not None:
            tau, source = level.spec.accept_length, level.spec.source
        elif (level.usage_accept_length or 0.0) > 1.0:
            tau, source = level.usage_accept_length, "usage"
        else:
            continue
        return (
            f"WARNING: the baseline {baseline.url} speculates too (accept length {tau:.2f} from {source} "
            f"at concurrency {level.concurrency}): this compares speculation with speculation, not with "
            "plain decoding; restart the baseline without speculation (specdraft serve --no-spec; "
            "SGLang / vLLM without --speculative-* flags)"
        )
    return None


def speculation_warning(run: ServerRun) -> str | None:
    """The one-line warning when the measured ("speculative") server shows no speculation at
    some level: its own signals say so (`LevelResult.no_spec_signal`: spec counters exposed
    but still, usage without drafted tokens, SGLang spec_verify_ct 0) or its counts give accept
    length 1 (no draft accepted). None for a server without such signals (e.g. plain OpenAI)."""
    for level in run.levels:
        if level.no_spec_signal is not None:
            what = f"no speculation: {level.no_spec_signal}"
        elif level.spec is not None and level.spec.num_accepted_tokens <= 0:
            what = f"accept length 1.00 (no draft accepted) from {level.spec.source}"
        else:
            continue
        return (
            f"WARNING: the speculative server {run.url} shows {what} at concurrency {level.concurrency}: "
            "its tokens/s and any speedup measure no gain from speculation; start it with a working "
            "drafter (specdraft serve --draft CKPT without --no-spec; SGLang / vLLM with --speculative-* flags)"
        )
    return None


def failed_requests_warning(runs: Sequence[ServerRun]) -> str | None:
    """The one-line warning when some level has failed requests on any server: its tokens/s
    count only the requests that succeeded, so they and any speedup there are invalid. Names
    each such level with its error counts, the first error and the likely causes. None when
    every request succeeded."""
    failed = {}
    for run in runs:
        for level in run.levels:
            if level.num_errors:
                failed.setdefault(level.concurrency, []).append(
                    (
                        f"{level.num_errors} of {level.num_requests} requests failed on {run.url}",
                        level.first_error,
                    )
                )
    if not failed:
        return None
    levels = "; ".join(
        f"concurrency {c}: {', '.join(text for text, _ in parts)}"
        for c, parts in sorted(failed.items())
    )
    first = next(error for parts in failed.values() for _, error in parts if error)
    return (
        f"WARNING: failed requests ({levels}; first error: {first}): tokens/s and speedup at "
        f"{'that level' if len(failed) == 1 else 'those levels'} are invalid; likely the server refused "
        "requests beyond its queue (HTTP 429: raise specdraft serve --max-queue above the concurrency, or "
        "lower --concurrency) or they timed out (raise --timeout)"
    )


@dataclass
class BenchReport:
    """Both runs, speedups per concurrency (None without baseline) and the crossover.
    not_measured: the concurrencies of the sweep left out because it was interrupted before
    they were measured on every server (`partial_report`); empty for a complete sweep."""

    config: BenchConfig
    spec: ServerRun
    baseline: ServerRun | None
    speedups: list[SpeedupPoint] | None
    crossover: Crossover
    not_measured: tuple[int, ...] = ()

    @property
    def partial(self) -> bool:
        """Whether the sweep was interrupted before every level was measured on every server."""
        return bool(self.not_measured)

    @property
    def partial_note(self) -> str | None:
        """The first line of a partial report's markdown: which levels were not measured; None
        for a complete one."""
        if not self.partial:
            return None
        measured = ", ".join(str(lv.concurrency) for lv in self.spec.levels)
        return (
            f"PARTIAL: bench was interrupted; concurrency {', '.join(map(str, self.not_measured))} not measured "
            f"on every server, so this report covers concurrency {measured} only"
        )

    @property
    def has_verdicts(self) -> bool:
        """Whether the speedups are judged (wins / ties / loses): a baseline and enough runs."""
        return self.speedups is not None and self.config.repeats >= MIN_VERDICT_REPEATS

    @property
    def baseline_warning(self) -> str | None:
        """`baseline_warning` of the baseline run (None without a baseline)."""
        return baseline_warning(self.baseline) if self.baseline else None

    @property
    def speculation_warning(self) -> str | None:
        """`speculation_warning` of the measured server's run."""
        return speculation_warning(self.spec)

    @property
    def failed_requests_warning(self) -> str | None:
        """`failed_requests_warning` of both runs."""
        return failed_requests_warning(
            [run for run in (self.spec, self.baseline) if run is not None]
        )

    @property
    def warnings(self) -> list[str]:
        """Every warning that makes the comparison invalid (failed requests, a measured server
        that does not speculate, a baseline that does)."""
        return [
            w
            for w in (self.failed_requests_warning, self.speculation_warning, self.baseline_warning)
            if w
        ]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        speedups = [
            {
                **asdict(p),
                "verdict": point_verdict(p, self.config.tie_band)
                if self.has_verdicts or p.num_errors
                else None,
                "valid": not p.num_errors,
            }
            for p in self.speedups or []
        ]
        for d in speedups:  # an invalid level has no speedup: no number to mistake for one
            if not d["valid"]:
                d.update(speedup=None, speedup_std=None, noise=None)
        return {
            "config": asdict(self.config),
            "spec": self.spec.to_dict(),
            "baseline": self.baseline.to_dict() if self.baseline else None,
            "speedups": speedups or None,
            "crossover": asdict(self.crossover),
            "baseline_warning": self.baseline_warning,
            "speculation_warning": self.speculation_warning,
            "failed_requests_warning": self.failed_requests_warning,
            "partial": self.partial,
            "interrupted_at_concurrency": self.not_measured[0] if self.partial else None,
            "concurrency_not_measured": list(self.not_measured),
        }


def compare(
    cfg: BenchConfig,
    spec: ServerRun,
    baseline: ServerRun | None,
    not_measured: tuple[int, ...] = (),
) -> BenchReport:
    """The report of measured runs: speedups at each level (the runs' levels pair up in order)
    and the crossover over the valid ones; not_measured: `BenchReport.not_measured`."""
    if baseline is None:
        return BenchReport(cfg, spec, None, None, find_crossover([], cfg.tie_band), not_measured)
    speedups = [
        SpeedupPoint.of(
            a.concurrency, a.tokens_per_s_runs, b.tokens_per_s_runs, a.num_errors + b.num_errors
        )
        for a, b in zip(spec.levels, baseline.levels)
    ]
    valid = [p for p in speedups if not p.num_errors]
    if cfg.repeats < MIN_VERDICT_REPEATS:
        crossover = Crossover(None, NO_VERDICT)
    elif not valid:
        crossover = Crossover(None, f"no crossover: {ALL_INVALID}")
    else:
        crossover = find_crossover(
            valid, cfg.tie_band, [p.concurrency for p in speedups if p.num_errors]
        )
    return BenchReport(cfg, spec, baseline, speedups, crossover, not_measured)
