"""`specdraft bench`: a server with speculation against its baseline, over a concurrency sweep or a
suite by category."""

from __future__ import annotations

from typing import Annotated

import typer

from specdraft.cli.checks import positive_int_list, url_option
from specdraft.cli.common import app, make_console, user_errors
from specdraft.cli.options import PROMPTS_HELP, option

Url = Annotated[
    str,
    typer.Option(
        help="Server with speculation (specdraft, vLLM, SGLang), e.g. "
        "http://127.0.0.1:8000 or http://127.0.0.1:8000/v1.",
        callback=url_option,
    ),
]
BaselineUrl = Annotated[
    str,
    option(
        "", help="The same engine without speculation (needed for a speedup).", callback=url_option
    ),
]
BenchPrompts = Annotated[str, option("builtin", help=PROMPTS_HELP + " (plain text is refused).")]
Concurrency = Annotated[
    str, option("1,4,16", help="Requests in flight, one level each.", callback=positive_int_list)
]
BenchMaxTokens = Annotated[int, option(128, min=1, help="Tokens per request (ignore_eos).")]
NumPrompts = Annotated[int, option(32, min=1, help="Requests per run of a level (prompts cycled).")]
BenchTemperature = Annotated[
    float, option(0.0, min=0.0, help="Sampling temperature of the requests (0 = greedy).")
]
BenchOut = Annotated[str, option("bench-out", help="Directory for bench.json, bench.md and plots.")]
Timeout = Annotated[float, option(600.0, help="Seconds per request.")]
BenchRepeats = Annotated[
    int,
    option(
        3,
        min=1,
        help="Runs per level: tokens/s and speedup are reported as mean and "
        "standard deviation, and a level is a win or a loss only beyond that noise "
        "(1 run: speedups without a verdict).",
    ),
]
BenchWait = Annotated[
    float,
    option(
        120.0,
        min=0,
        help="Seconds to wait for a server that refuses connections (still "
        "starting, e.g. just launched with serve ... &) before failing; 0: try once.",
    ),
]
Warmup = Annotated[
    int,
    option(
        1,
        min=0,
        help="Requests sent to each server, one at a time, before any timing "
        "(first requests pay for compilation and caches; SGLang bench_serving's "
        "--warmup-requests).",
    ),
]
BenchSuite = Annotated[
    str,
    option(
        "",
        help="A bundled suite (mt-bench, humaneval, gsm8k): chats per category at the first "
        "--concurrency, multi-turn questions turn by turn; tau, p_k and speedup per category.",
    ),
]
SuiteFormat = Annotated[
    str,
    option(
        "",
        "--format",
        help="With --prompts FILE: run FILE as a suite of this format "
        "(spec-bench, mt-bench, humaneval, gsm8k).",
    ),
]


def _same_server(a: str, b: str) -> bool:
    """Whether two URLs (passed `url_option`) name one server: scheme and host in any case, a
    default port written or not, a trailing slash or /v1 or not (`client.base_url`), any loopback
    name (`LOCAL_HOSTS`) for this machine."""
    import httpx

    from specdraft.client import base_url

    def key(url: str) -> tuple:
        u = httpx.URL(base_url(url))  # lower-cases scheme and host, drops a default port
        return u.scheme, "loopback" if u.host in LOCAL_HOSTS else u.host, u.port, u.path.rstrip("/")

    return key(a) == key(b)


LOCAL_HOSTS = (
    "127.0.0.1",
    "localhost",
    "0.0.0.0",
    "::1",
)  # servers whose speed this machine's load sets


def refuse_same_server(url: str, baseline_url: str) -> None:
    """bench --baseline-url naming --url's server (`_same_server`): a usage error, nothing measured."""
    if baseline_url and _same_server(url, baseline_url):
        raise typer.BadParameter(
            f"{url} and {baseline_url} are the same server: measuring one server twice "
            "gives no speedup; give the server without speculation as --baseline-url, or "
            "leave --baseline-url out",
            param_hint="'--url' / '--baseline-url'",
        )


@app.command()
def bench(
    url: Url,
    baseline_url: BaselineUrl,
    prompts: BenchPrompts,
    concurrency: Concurrency,
    max_tokens: BenchMaxTokens,
    num_prompts: NumPrompts,
    temperature: BenchTemperature,
    out: BenchOut,
    timeout: Timeout,
    repeats: BenchRepeats,
    wait: BenchWait,
    warmup: Warmup,
    suite: BenchSuite,
    fmt: SuiteFormat,
) -> None:
    """Benchmark a server against its no-speculation baseline over a concurrency sweep (or a suite by category)."""
    from specdraft.bench.config import BenchConfig
    from specdraft.bench.report import refuse_file_out

    refuse_same_server(url, baseline_url)
    console = make_console()
    busy = _busy_note(url, baseline_url)
    with user_errors(console):
        refuse_file_out(out, "--out")  # before the benchmark, not after
        cfg = BenchConfig(
            url,
            baseline_url or None,
            prompts,
            concurrency,
            max_tokens,
            num_prompts,
            temperature,
            warmup=warmup,
            timeout_s=timeout,
            repeats=repeats,
            wait_s=wait,
        )
        if suite or fmt:
            _run_suite(console, cfg, suite, fmt, out, busy)
            return
        report, paths = _run_sweep(console, cfg, out)
    _render_bench(console, report, paths, busy)


def _run_sweep(console, cfg, out: str):
    """`bench`'s concurrency sweep and its report written to `out`: (report, paths). Ctrl-C writes
    the levels finished on every server first (`_write_interrupted`)."""
    from specdraft.bench.report import write_report
    from specdraft.bench.sweep import Sweep, run_bench

    sweep = Sweep()  # filled level by level: Ctrl-C keeps the levels finished on every server
    try:
        report = run_bench(
            cfg,
            progress=lambda text: console.print(text, markup=False, soft_wrap=True),
            sweep=sweep,
        )
        return report, write_report(report, out)
    except KeyboardInterrupt:
        console.print(_write_interrupted(sweep, out), style="red", markup=False, soft_wrap=True)
        raise


def _run_suite(console, cfg, suite: str, fmt: str, out: str, busy: str | None) -> None:
    """`bench --suite NAME` or `--prompts FILE --format F`: run it, print and write its report,
    then the busy-machine note when there is one, as the sweep's (`_render_bench`)."""
    from specdraft.bench.suite_run import run_suite, suite_markdown, write_suite_report
    from specdraft.bench.suites import SuiteError, load_suite, read_suite_file

    if suite and fmt:
        raise SuiteError(
            "give --suite NAME (a bundled suite) or --prompts FILE --format F, not both"
        )
    if fmt and cfg.prompts == "builtin":
        raise SuiteError(f"--format {fmt} needs --prompts FILE (the {fmt} file to run)")
    chosen = load_suite(suite) if suite else read_suite_file(cfg.prompts, fmt)
    report = run_suite(
        cfg, chosen, progress=lambda text: console.print(text, markup=False, soft_wrap=True)
    )
    paths = write_suite_report(report, out)
    console.print(suite_markdown(report), markup=False, highlight=False, soft_wrap=True)
    console.print(f"wrote {', '.join(str(p) for p in paths)}", markup=False, soft_wrap=True)
    if busy:
        console.print(busy, style="yellow", markup=False, soft_wrap=True)
    if report.warnings:
        raise typer.Exit(1)


def _busy_note(url: str, baseline_url: str) -> str | None:
    """`machine_load.busy_note` when either server is on this machine (`LOCAL_HOSTS`), else None."""
    import httpx

    from specdraft.machine_load import busy_note

    local = any(
        httpx.URL(u).host in LOCAL_HOSTS for u in (url, baseline_url) if u.startswith("http")
    )
    return (
        busy_note(
            "the tokens/s of servers on this machine",
            "servers of one thread each (serve's default --threads 1) compete less",
        )
        if local
        else None
    )


def _render_bench(console, report, paths, busy: str | None) -> None:
    """The report's markdown, the files written, the busy note and the warnings last, where they
    are seen; exit 1 after a report with warnings (the comparison is invalid: scripts notice)."""
    from specdraft.bench.report import markdown

    console.print(markdown(report), markup=False, highlight=False, soft_wrap=True)
    console.print(f"wrote {', '.join(str(p) for p in paths)}", markup=False, soft_wrap=True)
    if busy:
        console.print(busy, style="yellow", markup=False, soft_wrap=True)
    for warning in report.warnings:
        console.print(warning, style="bold red", markup=False, soft_wrap=True)
    if report.warnings:
        raise typer.Exit(1)


def _write_interrupted(sweep, out: str) -> str:
    """Write the report of an interrupted bench sweep (`sweep.partial_report`: the levels finished
    on every server) to `out`; the one line saying what was written, or that nothing was."""
    from specdraft.bench.report import write_report
    from specdraft.bench.sweep import partial_report

    report = partial_report(sweep)
    if report is None:
        return (
            f"interrupted: no concurrency level was measured on every server yet, so nothing was written "
            f"to {out}"
        )
    paths = ", ".join(str(p) for p in write_report(report, out))
    if not report.partial:  # interrupted while the report was being written
        return f"interrupted after every level was measured: wrote {paths}"
    measured = ", ".join(str(lv.concurrency) for lv in report.spec.levels)
    return (
        f"interrupted: wrote a partial report of concurrency {measured} (not measured on every server: "
        f"{', '.join(map(str, report.not_measured))}) to {paths}"
    )
