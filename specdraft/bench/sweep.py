"""One benchmark sweep: a server with speculation against the same engine without it.

`run_bench` sends the same prompts to a server (specdraft, vLLM, SGLang or any OpenAI-compatible
one, `specdraft.client`) and to an optional baseline server, streaming, at each concurrency of
the sweep, `repeats` times per level. Each server is waited for (`client.wait_for_server`) and
warmed up first; then each level is measured on every server before the next level starts, its
runs alternating between them (speculative run 1, baseline run 1, speculative run 2, ...), so
load drift on the machine reaches both servers alike. Per server and level (`levels.LevelResult`):
throughput = completion tokens / wall time of a run (mean, sample sd, every run), TTFT and TPOT
over the requests of all runs (TPOT = (latency - TTFT) / (tokens - 1) per request), and the
speculative counts around the level (tau = 1 + accepted / drafts, p_k = accepted at position
k-1 / drafts, M1: tau = 1 + sum p_k). The comparison (`comparison.compare`, `bench.stats`) gives a
speedup and a verdict per level and the crossover (FC-13); without a baseline speculation is
never called a win (DESIGN.md invariant 6). A level with a failed request on either server has
no valid speedup. Warnings (`BenchReport.warnings`) flag a baseline that speculates, a measured
server that does not, and failed requests. An interrupted sweep keeps the levels finished on
every server (`Sweep`, `partial_report`). Requests use temperature 0 and ignore_eos by default,
so both servers generate max_tokens tokens for every prompt.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from specdraft.bench.comparison import BenchReport, compare
from specdraft.bench.config import BenchConfig, BenchError
from specdraft.bench.levels import LevelResult, ServerRun, level_line, level_result
from specdraft.bench.prompts import load_prompts
from specdraft.client import RequestRecord, Server, run_requests, scrape, wait_for_server
from specdraft.train.progress import counted_progress


def wait_for_servers(cfg: BenchConfig, progress: Callable[[str], None] | None) -> dict[str, Server]:
    """{"speculative": cfg.url's server, "baseline": cfg.baseline_url's (when given)}, each waited
    for (`client.wait_for_server`, progress told while it waits; an error names its option)."""
    urls = {"speculative": (cfg.url, "--url"), "baseline": (cfg.baseline_url, "--baseline-url")}
    return {
        role: wait_for_server(url, cfg.wait_s, cfg.timeout_s, option, on_wait=progress)
        for role, (url, option) in urls.items()
        if url
    }


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
    on_run: Callable[[], None] = lambda: None,
) -> list[LevelResult]:
    """One concurrency level on every server of `servers` (the speculative one, then the
    baseline), its `cfg.repeats` runs interleaved: run 1 on each server in turn, then run 2,
    and so on, so load drift on the machine during the level reaches every server alike. Each
    server's counters are read before and after the whole level (`scrape`: a server counts
    only its own requests). clock: seconds now, for the runs' wall time, TTFT and latency;
    on_run: called after each run (progress). Returns one LevelResult per server, in order;
    raises BenchError (`level_result`) when every request to a server failed."""
    before = [scrape(server, cfg.timeout_s) for server in servers]
    runs: list[list[tuple[list[RequestRecord], float]]] = [[] for _ in servers]
    for _ in range(cfg.repeats):
        for server, server_runs in zip(servers, runs):
            server_runs.append(
                asyncio.run(run_requests(server, batch, concurrency, cfg, clock=clock))
            )
            on_run()
    after = [scrape(server, cfg.timeout_s) for server in servers]
    return [
        level_result(server, concurrency, server_runs, b, a)
        for server, server_runs, b, a in zip(servers, runs, before, after)
    ]


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
    servers = wait_for_servers(cfg, progress)
    runs = {role: ServerRun.of(server) for role, server in servers.items()}
    sweep.spec, sweep.baseline = runs["speculative"], runs.get("baseline")
    for server in servers.values():
        check_chats(server, batch, cfg)
        warm_up(server, batch, cfg)
    measure_levels(cfg, servers, runs, batch, progress, clock)
    return compare(cfg, sweep.spec, sweep.baseline)


def measure_levels(
    cfg: BenchConfig,
    servers: dict[str, Server],
    runs: dict[str, ServerRun],
    batch: list,
    progress: Callable[[str], None] | None,
    clock: Callable[[], float],
) -> None:
    """Every level of the sweep in turn (`measure_level`), appended to the servers' `runs` as it
    finishes on all of them (kept on Ctrl-C) and told to `progress` (`level_line`); the runs done
    of the sweep and the time left are shown meanwhile (`train.progress.counted_progress`)."""
    total = len(cfg.concurrency) * cfg.repeats * len(servers)
    with counted_progress("bench runs (all levels)", total) as advance:
        for concurrency in cfg.concurrency:
            levels = measure_level(
                list(servers.values()), batch, concurrency, cfg, clock, on_run=advance
            )
            for run, level in zip(runs.values(), levels):
                run.levels.append(level)
            if progress:
                for (role, server), level in zip(servers.items(), levels):
                    progress(level_line(role, server, level))


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
