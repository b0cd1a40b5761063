"""What one server measured at one concurrency level (`LevelResult`), every level of a server
(`ServerRun`), and their progress text."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from specdraft.bench.config import BenchError
from specdraft.bench.stats import Stats, mean_std
from specdraft.client import RequestRecord, Server, SpecCounts, counter_delta, sglang_counts


@dataclass
class LevelResult:
    """One server at one concurrency, over `num_runs` runs of the same requests.

    num_requests, num_errors, duration_s, num_output_tokens: totals over the runs;
    tokens_per_s: mean over the runs of (completion tokens / wall seconds of the run), with
    tokens_per_s_std (sample standard deviation, 0 for one run) and every run's value in
    tokens_per_s_runs; TTFT, TPOT: over the requests of all runs; spec: counts over all runs."""

    concurrency: int
    num_requests: int
    num_errors: int
    duration_s: float
    num_output_tokens: int
    tokens_per_s: float
    ttft_s: Stats
    tpot_s: Stats
    spec: SpecCounts | None
    usage_accept_length: float | None = None  # from specdraft's per-response usage
    first_error: str | None = None
    num_runs: int = 1
    tokens_per_s_std: float = 0.0
    tokens_per_s_runs: list[float] = field(default_factory=list)
    no_spec_signal: str | None = None  # the server's own signal that it did not speculate here

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        d = asdict(self)
        d["spec"] = self.spec.to_dict() if self.spec else None
        return d


@dataclass
class ServerRun:
    """All levels of one server."""

    url: str
    kind: str
    model: str
    levels: list[LevelResult] = field(default_factory=list)

    @classmethod
    def of(cls, server: Server) -> ServerRun:
        """A run of `server` with no level measured yet."""
        return cls(server.url, server.kind, server.model)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {
            "url": self.url,
            "kind": self.kind,
            "model": self.model,
            "levels": [level.to_dict() for level in self.levels],
        }


def level_result(
    server: Server,
    concurrency: int,
    runs: list[tuple[list[RequestRecord], float]],
    before: dict[str, Any] | None,
    after: dict[str, Any] | None,
) -> LevelResult:
    """Aggregate the runs (records, wall seconds) of one level; before / after: the server's
    counters (`scrape`) around the level (None for kinds without them). Raises BenchError
    when every request failed."""
    records = [r for run, _ in runs for r in run]
    ok = [r for r in records if r.error is None]
    if not ok:
        raise BenchError(
            f"{server.url}: every request failed at concurrency {concurrency}: {records[0].error}"
        )
    per_run = [
        sum(r.num_tokens for r in run if r.error is None) / duration for run, duration in runs
    ]
    tps, tps_std = mean_std(per_run)
    spec = counter_delta(before, after, f"{server.kind} /metrics") if before is not None else None
    if server.kind == "sglang":
        spec = sglang_counts(ok)
    errors = [r.error for r in records if r.error is not None]
    return LevelResult(
        concurrency,
        len(records),
        len(errors),
        sum(d for _, d in runs),
        sum(r.num_tokens for r in ok),
        tps,
        Stats.of([r.ttft_s for r in ok if r.ttft_s is not None]),
        Stats.of(tpot_of(ok)),
        spec,
        usage_accept_length(ok),
        errors[0] if errors else None,
        len(runs),
        tps_std,
        per_run,
        no_spec_signal(server, ok, spec, before),
    )


def tpot_of(ok: list[RequestRecord]) -> list[float]:
    """Seconds per output token after the first, per successful request with two tokens or more:
    (latency - TTFT) / (tokens - 1)."""
    return [
        (r.latency_s - r.ttft_s) / (r.num_tokens - 1)
        for r in ok
        if r.ttft_s is not None and r.num_tokens > 1
    ]


def usage_accept_length(ok: list[RequestRecord]) -> float | None:
    """1 + accepted / drafts over specdraft's per-response usage; None without such usage or
    drafts."""
    usage = [r.usage for r in ok if r.usage and "num_drafts" in r.usage]
    drafts = sum(u["num_drafts"] for u in usage)
    return 1 + sum(u["num_accepted_tokens"] for u in usage) / drafts if drafts else None


def no_spec_signal(
    server: Server, ok: list[RequestRecord], spec: SpecCounts | None, before: dict | None
) -> str | None:
    """The server's own signal that it did not speculate at a level (`LevelResult.no_spec_signal`):
    SGLang's spec_verify_ct 0, usage without drafted tokens, or /metrics speculative counters
    exposed but still; None when it speculated or gives no such signal."""
    if spec is not None:
        return None
    usage = [r.usage for r in ok if r.usage and "num_drafts" in r.usage]
    if server.kind == "sglang" and any(r.usage and "spec_verify_ct" in r.usage for r in ok):
        return "sglang meta_info (spec_verify_ct 0)"
    if usage and not sum(u.get("num_draft_tokens") or 0 for u in usage):
        return "usage (no drafted tokens)"
    if before is not None and before["exposed"]:
        return f"{server.kind} /metrics (speculative counters did not move)"
    return None


def level_line(role: str, server: Server, level: LevelResult) -> str:
    """The progress line of one server's level: "speculative http://h:8000 (vllm) concurrency 4:
    812.3 ± 4.1 (806.0-816.2) tok/s, tau 2.310" (role: "speculative" or "baseline")."""
    tau = f", tau {level.spec.accept_length:.3f}" if level.spec else ""
    tps = (
        f"invalid: {level.num_errors} of {level.num_requests} requests FAILED"
        if level.num_errors
        else f"{tps_cell(level)} tok/s"
    )
    return f"{role} {server.url} ({server.kind}) concurrency {level.concurrency}: {tps}{tau}"


def tps_cell(level: LevelResult) -> str:
    """Tokens/s of a level: "812.3", or "812.3 ± 4.1 (806.0-816.2)" (mean ± sd (min-max)) over runs;
    "invalid (12 of 16 failed)" with failed requests (the successful ones alone give no valid tokens/s)."""
    if level.num_errors:
        return f"invalid ({level.num_errors} of {level.num_requests} failed)"
    if level.num_runs < 2:
        return f"{level.tokens_per_s:.1f}"
    runs = level.tokens_per_s_runs
    return (
        f"{level.tokens_per_s:.1f} ± {level.tokens_per_s_std:.1f} ({min(runs):.1f}-{max(runs):.1f})"
    )
