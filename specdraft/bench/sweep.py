"""One benchmark sweep: a server with speculation against the same engine without it.

`run_bench` sends the same prompts to a server (specdraft, vLLM, SGLang or any OpenAI-compatible
one, `specdraft.client`) and to an optional baseline server, streaming, at each concurrency of
the sweep, `repeats` times per level. Each server is waited for (`client.wait_for_server`) and
warmed up first; then each level is measured on every server before the next level starts, its
runs alternating between them (speculative run 1, baseline run 1, speculative run 2, ...), so
load drift on the machine reaches both servers alike. Per server and level (`LevelResult`):
throughput = completion tokens / wall time of a run (mean, sample sd, every run), TTFT and TPOT
over the requests of all runs (TPOT = (latency - TTFT) / (tokens - 1) per request), and the
speculative counts around the level (tau = 1 + accepted / drafts, p_k = accepted at position
k-1 / drafts, M1: tau = 1 + sum p_k). The comparison (`compare`, `specdraft.bench.stats`) gives a
speedup and a verdict per level and the crossover (FC-13); without a baseline speculation is
never called a win (DESIGN.md invariant 6). A level with a failed request on either server has
no valid speedup. Warnings (`BenchReport.warnings`) flag a baseline that speculates, a measured
server that does not, and failed requests. An interrupted sweep keeps the levels finished on
every server (`Sweep`, `partial_report`). Requests use temperature 0 and ignore_eos by default,
so both servers generate max_tokens tokens for every prompt.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any

from specdraft.bench.stats import (
    MIN_VERDICT_REPEATS,
    NO_VERDICT,
    Crossover,
    SpeedupPoint,
    Stats,
    find_crossover,
    mean_std,
    point_verdict,
)
from specdraft.client import (
    SERVER_WAIT_S,
    RequestRecord,
    Server,
    SpecCounts,
    check_url,
    counter_delta,
    run_requests,
    scrape,
    sglang_counts,
    wait_for_server,
)
from specdraft.data.records import chat_record, served_messages
from specdraft.errors import SpecdraftError

BUILTIN = "builtin"
ALL_INVALID = "every concurrency measured had failed requests, so no speedup is valid"


class BenchError(SpecdraftError, RuntimeError):
    """A sweep that cannot go on: every request to a server failed at some level."""


@dataclass(frozen=True)
class BenchConfig:
    """What to benchmark. url / baseline_url: server base URLs (http://host:port; trailing
    slashes and a trailing /v1 dropped, `check_url`); prompts:
    "builtin" or a JSONL file of the rows `load_prompts` reads (whatever the file's name;
    plain text is refused); concurrency: requests in flight, one level each; num_prompts: requests per
    run of a level (prompts cycled); repeats: runs per level (mean and spread of tokens/s;
    verdicts need MIN_VERDICT_REPEATS);
    max_tokens: per request; tie_band: speedups within 1 +- tie_band are ties, not wins (the
    crossover); wait_s: how long to wait for a server that refuses connections (still
    starting) before failing (`wait_for_server`; 0: try once). Raises ValueError for a bad value."""

    url: str
    baseline_url: str | None = None
    prompts: str = BUILTIN
    concurrency: tuple[int, ...] = (1, 4, 16)
    max_tokens: int = 128
    num_prompts: int = 32
    temperature: float = 0.0
    ignore_eos: bool = True
    warmup: int = 1
    timeout_s: float = 600.0
    tie_band: float = 0.05
    repeats: int = 3
    wait_s: float = SERVER_WAIT_S

    def __post_init__(self) -> None:
        for name in ("url", "baseline_url"):
            if getattr(self, name) is not None:  # kept as base URLs (`check_url`)
                object.__setattr__(self, name, check_url(getattr(self, name), name))
        if not self.concurrency or any(c < 1 for c in self.concurrency):
            raise ValueError(
                f"concurrency {list(self.concurrency)}: give positive integers, e.g. 1,4,16"
            )
        for name in ("max_tokens", "num_prompts", "repeats"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} {getattr(self, name)}: must be >= 1")
        if (
            self.temperature < 0
            or self.warmup < 0
            or self.timeout_s <= 0
            or not 0 <= self.tie_band < 1
            or self.wait_s < 0
        ):
            raise ValueError(
                "temperature, warmup and wait_s must be >= 0, timeout_s > 0, tie_band in [0, 1)"
            )


PROMPT_ROW = '{"prompt": "<text>"}, {"text": "<text>"}, a chat {"messages": [...]} or a JSON string'


def load_prompts(source: str) -> list[str | list[dict[str, Any]]]:
    """Prompts from "builtin" (specdraft/assets/bench_prompts.jsonl: short stories and code) or
    a JSONL file (any name) of {"prompt": text} rows (a "completion" is left out), {"text": text}
    rows or JSON strings: texts; or of chats ({"messages"} / {"conversations"}, read by
    `data.records.chat_record`): each chat's messages before its last assistant turn, which
    `client.request_body` sends to /v1/chat/completions. Raises ValueError naming the file and
    line of a bad row (plain text included), or for no prompts."""
    if source == BUILTIN:
        text, name = (
            (resources.files("specdraft.assets") / "bench_prompts.jsonl").read_text(),
            "builtin",
        )
    else:
        path = Path(source)
        if not path.is_file():
            raise ValueError(f"{source}: prompt file not found (give a JSONL file or 'builtin')")
        text, name = path.read_text(), str(path)
    prompts = [
        prompt_of_row(line, name, number)
        for number, line in enumerate(text.splitlines(), start=1)
        if line.strip()
    ]
    if not prompts:
        raise ValueError(f"{name}: no prompts")
    return prompts


def prompt_of_row(line: str, name: str, number: int) -> str | list[dict[str, Any]]:
    """The prompt of one JSONL row (`load_prompts`); a chat row's is its messages before its last
    assistant turn (`data.render.served_messages`)."""
    try:
        row = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(
            f"{name}:{number}: not JSON ({e.msg}); a prompts file is JSONL, one {PROMPT_ROW} "
            "per line"
        ) from None
    if isinstance(row, dict) and ("messages" in row or "conversations" in row):
        prompt = served_messages(chat_record(f"{name}:{number}", row).messages)
    else:
        prompt = (row.get("prompt") or row.get("text")) if isinstance(row, dict) else row
    if not isinstance(prompt, (str, list)) or not prompt:
        raise ValueError(f"{name}:{number}: expected {PROMPT_ROW} per line")
    return prompt


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
    tpot = [
        (r.latency_s - r.ttft_s) / (r.num_tokens - 1)
        for r in ok
        if r.ttft_s is not None and r.num_tokens > 1
    ]
    tokens = sum(r.num_tokens for r in ok)
    per_run = [
        sum(r.num_tokens for r in run if r.error is None) / duration for run, duration in runs
    ]
    tps, tps_std = mean_std(per_run)
    spec = counter_delta(before, after, f"{server.kind} /metrics") if before is not None else None
    if server.kind == "sglang":
        spec = sglang_counts(ok)
    usage = [r.usage for r in ok if r.usage and "num_drafts" in r.usage]
    drafts = sum(u["num_drafts"] for u in usage)
    usage_tau = 1 + sum(u["num_accepted_tokens"] for u in usage) / drafts if drafts else None
    errors = [r.error for r in records if r.error is not None]
    no_spec = None
    if (
        server.kind == "sglang"
        and spec is None
        and any(r.usage and "spec_verify_ct" in r.usage for r in ok)
    ):
        no_spec = "sglang meta_info (spec_verify_ct 0)"
    elif usage and spec is None and not sum(u.get("num_draft_tokens") or 0 for u in usage):
        no_spec = "usage (no drafted tokens)"
    elif spec is None and before is not None and before["exposed"]:
        no_spec = f"{server.kind} /metrics (speculative counters did not move)"
    return LevelResult(
        concurrency,
        len(records),
        len(errors),
        sum(d for _, d in runs),
        tokens,
        tps,
        Stats.of([r.ttft_s for r in ok if r.ttft_s is not None]),
        Stats.of(tpot),
        spec,
        usage_tau,
        errors[0] if errors else None,
        len(runs),
        tps_std,
        per_run,
        no_spec,
    )


def check_chats(server: Server, batch: list, cfg: BenchConfig) -> None:
    """When `batch` holds chats, send the first one to `server` once (1 token): a server that
    refuses it (HTTP 4xx, e.g. a model without a chat template) would refuse every chat row, each
    request failing; BenchError says so in one line, naming the server, its answer and the fix."""
    chat = next((p for p in batch if isinstance(p, list)), None)
    if chat is None:
        return
    [record], _ = asyncio.run(run_requests(server, [chat], 1, replace(cfg, max_tokens=1)))
    if record.error is not None and record.error.startswith("HTTP 4"):
        raise BenchError(
            f"{server.url}: refused a chat row ({record.error}), so every chat row would fail: serve "
            'the model with a chat template, or give text rows ({"prompt": ...})'
        )


def warm_up(server: Server, batch: list[str], cfg: BenchConfig) -> None:
    """Send the first `cfg.warmup` prompts of `batch` to `server`, one at a time, untimed (first
    requests pay for compilation and caches)."""
    if cfg.warmup:
        asyncio.run(run_requests(server, batch[: cfg.warmup], 1, cfg))


def measure_level(
    servers: Sequence[Server],
    batch: list[str],
    concurrency: int,
    cfg: BenchConfig,
    clock: Callable[[], float] = time.perf_counter,
) -> list[LevelResult]:
    """One concurrency level on every server of `servers` (the speculative one, then the
    baseline), its `cfg.repeats` runs interleaved: run 1 on each server in turn, then run 2,
    and so on, so load drift on the machine during the level reaches every server alike. Each
    server's counters are read before and after the whole level (`scrape`: a server counts
    only its own requests). clock: seconds now, for the runs' wall time, TTFT and latency.
    Returns one LevelResult per server, in order; raises BenchError (`level_result`) when every
    request to a server failed."""
    before = [scrape(server, cfg.timeout_s) for server in servers]
    runs: list[list[tuple[list[RequestRecord], float]]] = [[] for _ in servers]
    for _ in range(cfg.repeats):
        for server, server_runs in zip(servers, runs):
            server_runs.append(
                asyncio.run(run_requests(server, batch, concurrency, cfg, clock=clock))
            )
    after = [scrape(server, cfg.timeout_s) for server in servers]
    return [
        level_result(server, concurrency, server_runs, b, a)
        for server, server_runs, b, a in zip(servers, runs, before, after)
    ]


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


@dataclass
class Sweep:
    """What `run_bench` has measured so far, filled as it goes: config, then each server's run,
    a level appended to every run once that level's runs are done on every server (each level
    is measured on both servers before the next starts). A caller that passes one keeps the
    finished levels when the sweep is interrupted (Ctrl-C: `partial_report`)."""

    config: BenchConfig | None = None
    spec: ServerRun | None = None
    baseline: ServerRun | None = None


def run_bench(
    cfg: BenchConfig,
    progress: Callable[[str], None] | None = None,
    sweep: Sweep | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> BenchReport:
    """Benchmark cfg.url against cfg.baseline_url (if any) on the same prompts, level by level:
    each concurrency is measured on both servers, its runs alternating between them
    (`measure_level`), before the next starts, so load drift on the machine reaches both alike.
    Both servers are waited for (`wait_for_server`: a dead baseline fails before the sweep),
    asked once whether they take chat rows (`check_chats`) and warmed up (`warm_up`) before any timing. progress: told one line per server and level
    (`level_line`) as each level finishes. sweep: filled with the levels as they finish
    (`Sweep`; default: a new one). clock: seconds now, for every timing (`measure_level`)."""
    sweep = Sweep() if sweep is None else sweep
    sweep.config = cfg
    prompts = load_prompts(cfg.prompts)
    batch = [prompts[i % len(prompts)] for i in range(cfg.num_prompts)]
    servers = {
        "speculative": wait_for_server(
            cfg.url, cfg.wait_s, cfg.timeout_s, "--url", on_wait=progress
        )
    }
    if cfg.baseline_url:
        servers["baseline"] = wait_for_server(
            cfg.baseline_url, cfg.wait_s, cfg.timeout_s, "--baseline-url", on_wait=progress
        )
    runs = {role: ServerRun.of(server) for role, server in servers.items()}
    sweep.spec, sweep.baseline = runs["speculative"], runs.get("baseline")
    for server in servers.values():
        check_chats(server, batch, cfg)
        warm_up(server, batch, cfg)
    for concurrency in cfg.concurrency:
        levels = measure_level(list(servers.values()), batch, concurrency, cfg, clock)
        for run, level in zip(runs.values(), levels):  # finished on every server: kept on Ctrl-C
            run.levels.append(level)
        if progress:
            for (role, server), level in zip(servers.items(), levels):
                progress(level_line(role, server, level))
    return compare(cfg, sweep.spec, sweep.baseline)


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


def partial_report(sweep: Sweep) -> BenchReport | None:
    """The report of an interrupted sweep: the first levels of `config.concurrency` that every
    compared server finished (`run_bench` measures each level on both servers before the next),
    the rest in `not_measured`. None when no level was finished on every server (or the sweep
    never started)."""
    cfg = sweep.config
    if cfg is None:
        return None
    runs = [sweep.spec, sweep.baseline] if cfg.baseline_url else [sweep.spec]
    done = min(len(run.levels) if run else 0 for run in runs)
    if not done:
        return None
    spec, baseline = (
        replace(run, levels=run.levels[:done]) if run else None
        for run in (sweep.spec, sweep.baseline)
    )
    return compare(cfg, spec, baseline, tuple(cfg.concurrency[done:]))
