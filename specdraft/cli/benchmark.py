"""Commands that measure a server: bench, tune."""

from __future__ import annotations

import json

import typer

from specdraft.cli.common import (
    DRAFTER_HELP,
    EngineDtype,
    app,
    check_device,
    check_drafter,
    check_model_dir,
    engine_dtype,
    make_console,
    positive_int_list,
    set_threads,
    spec_from_flags,
    threads_option,
    url_option,
    user_errors,
)
from specdraft.cli.decode import ENGINE_DEVICE_HELP


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


@app.command()
def bench(
    url: str = typer.Option(
        ...,
        help="Server with speculation (specdraft, vLLM, SGLang), e.g. "
        "http://127.0.0.1:8000 or http://127.0.0.1:8000/v1.",
        callback=url_option,
    ),
    baseline_url: str = typer.Option(
        "", help="The same engine without speculation (needed for a speedup).", callback=url_option
    ),
    prompts: str = typer.Option(
        "builtin",
        help='\'builtin\' or a JSONL file of {"prompt": ...}, {"text": ...} '
        'or chat {"messages": [...]} rows (plain text is refused).',
    ),
    concurrency: str = typer.Option(
        "1,4,16", help="Requests in flight, one level each.", callback=positive_int_list
    ),
    max_tokens: int = typer.Option(128, min=1, help="Tokens per request (ignore_eos)."),
    num_prompts: int = typer.Option(
        32, min=1, help="Requests per run of a level (prompts cycled)."
    ),
    temperature: float = typer.Option(
        0.0, min=0.0, help="Sampling temperature of the requests (0 = greedy)."
    ),
    out: str = typer.Option("bench-out", help="Directory for bench.json, bench.md and plots."),
    timeout: float = typer.Option(600.0, help="Seconds per request."),
    repeats: int = typer.Option(
        3,
        min=1,
        help="Runs per level: tokens/s and speedup are reported as mean and "
        "standard deviation, and a level is a win or a loss only beyond that noise "
        "(1 run: speedups without a verdict).",
    ),
    wait: float = typer.Option(
        120.0,
        min=0,
        help="Seconds to wait for a server that refuses connections (still "
        "starting, e.g. just launched with serve ... &) before failing; 0: try once.",
    ),
    warmup: int = typer.Option(
        1,
        min=0,
        help="Requests sent to each server, one at a time, before any timing "
        "(first requests pay for compilation and caches; SGLang bench_serving's "
        "--warmup-requests).",
    ),
    suite: str = typer.Option(
        "",
        help="A bundled suite (mt-bench, humaneval, gsm8k): chats per category at the first "
        "--concurrency, multi-turn questions turn by turn; tau, p_k and speedup per category.",
    ),
    fmt: str = typer.Option(
        "",
        "--format",
        help="With --prompts FILE: run FILE as a suite of this format "
        "(spec-bench, mt-bench, humaneval, gsm8k).",
    ),
) -> None:
    """Benchmark a server against its no-speculation baseline over a concurrency sweep (or a suite by category)."""
    from specdraft.bench.config import BenchConfig
    from specdraft.bench.report import refuse_file_out, write_report
    from specdraft.bench.sweep import Sweep, run_bench

    if baseline_url and _same_server(url, baseline_url):
        raise typer.BadParameter(
            f"{url} and {baseline_url} are the same server: measuring one server twice "
            "gives no speedup; give the server without speculation as --baseline-url, or "
            "leave --baseline-url out",
            param_hint="'--url' / '--baseline-url'",
        )
    console = make_console()
    busy = _busy_note(url, baseline_url)
    if suite or fmt:
        with user_errors(console):
            refuse_file_out(out, "--out")
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
            _run_suite(console, cfg, suite, fmt, out, busy)
        return
    sweep = Sweep()  # filled level by level: Ctrl-C keeps the levels finished on every server
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
        try:
            report = run_bench(
                cfg,
                progress=lambda text: console.print(text, markup=False, soft_wrap=True),
                sweep=sweep,
            )
            paths = write_report(report, out)
        except KeyboardInterrupt:
            console.print(_write_interrupted(sweep, out), style="red", markup=False, soft_wrap=True)
            raise
    _render_bench(console, report, paths, busy)


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
        busy_note("the tokens/s of servers on this machine", "serve --threads 1 competes less")
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


def _check_min_speedup(value: float) -> float:
    """--min-speedup: a positive number (TuneConfig's range), a usage error otherwise."""
    import math

    if not (math.isfinite(value) and value > 0):
        raise typer.BadParameter(
            f"{value}: must be a positive number, e.g. 1.05 (5 % faster than no speculation)"
        )
    return value


@app.command()
def tune(
    target: str = typer.Option(
        ..., help="Target directory (transformers, with its tokenizer).", callback=check_model_dir
    ),
    draft: str = typer.Option(..., help=DRAFTER_HELP + ".", callback=check_drafter),
    prompts: str = typer.Option(
        "builtin",
        help='\'builtin\' or a JSONL file of {"prompt": ...}, {"text": ...} '
        'or chat {"messages": [...]} rows.',
    ),
    max_tokens: int = typer.Option(64, min=1, help="New tokens per prompt (temperature 0)."),
    num_steps: int = typer.Option(
        0,
        min=0,
        help="Current setting to evaluate too (0 = none): draft depth; "
        "--topk and --num-draft-tokens need it.",
    ),
    topk: int | None = typer.Option(
        None, min=1, help="Current setting: children per node (1 with --num-steps alone)."
    ),
    num_draft_tokens: int = typer.Option(
        0,
        min=0,
        help="Current setting: verified nodes (0 = num_steps + 1 "
        "for a chain; a tree, --topk > 1, needs a value).",
    ),
    probe_steps: int = typer.Option(8, min=1, help="Depth of the acceptance probes."),
    topks: str = typer.Option(
        "1,2,4", help="Children per node to consider.", callback=positive_int_list
    ),
    max_tree_tokens: int = typer.Option(16, min=2, help="Cap on a tree's verified nodes."),
    num_measure: int = typer.Option(3, min=1, help="Best predictions to measure for real."),
    min_speedup: float = typer.Option(
        1.05,
        help="Median speedup a recommended setting needs (its lower "
        "quartile must also be above 1x), as the demo's rule; > 0.",
        callback=_check_min_speedup,
    ),
    repeats: int = typer.Option(
        5,
        min=1,
        help="Timing rounds: each measured setting and plain decoding run "
        "once per round, order rotated; speedups are medians and quartiles of "
        "same-round ratios.",
    ),
    json_out: str = typer.Option("", help="Also write the report as JSON here."),
    device: str = typer.Option("cpu", help=ENGINE_DEVICE_HELP, callback=check_device),
    dtype: EngineDtype = typer.Option("fp32", help="Dtype the target and drafter run in."),
    threads: int | None = threads_option(),
    suite: str = typer.Option(
        "",
        help="Tune on a bundled suite's chats (mt-bench, humaneval, gsm8k; instead of --prompts), "
        "turn by turn with the target's own answers; then tau, p_k and speedup per category.",
    ),
) -> None:
    """Predict and measure tokens/s of speculative settings; recommend one, or no speculation."""
    from specdraft.bench.tune import tune_paths
    from specdraft.bench.tune_model import TuneConfig
    from specdraft.bench.tune_render import render
    from specdraft.files import atomic_write_text

    console = make_console()
    with user_errors(console):
        _refuse_bad_json_out(json_out)
        current = _current_setting(draft, num_steps, topk, num_draft_tokens)
        cfg = TuneConfig(
            max_tokens,
            probe_steps,
            topks,
            max_tree_tokens,
            num_measure,
            min_speedup,
            current,
            repeats=repeats,
        )
        set_threads(threads)
        say = lambda text: console.print(text, markup=False)  # noqa: E731
        if suite:
            from specdraft.bench.suites import load_suite
            from specdraft.bench.tune_suite import render_categories, tune_suite_paths

            chosen = load_suite(suite)
            report, rows = tune_suite_paths(
                target, draft, chosen, cfg, device, engine_dtype(dtype), progress=say
            )
        else:
            report, rows = (
                tune_paths(target, draft, prompts, cfg, device, engine_dtype(dtype), progress=say),
                [],
            )
    console.print(render(report), markup=False, highlight=False, soft_wrap=True)
    if rows:
        console.print(
            render_categories(chosen, rows, report.recommendation is not None),
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
    if json_out:
        data = {**report.to_dict(), **({"categories": [r.to_dict() for r in rows]} if rows else {})}
        atomic_write_text(json_out, json.dumps(data, indent=2))


def _refuse_bad_json_out(json_out: str) -> None:
    """--json-out: empty, or a file path in an existing directory (ValueError before tuning)."""
    from pathlib import Path

    if json_out and (Path(json_out).is_dir() or not Path(json_out).resolve().parent.is_dir()):
        raise ValueError(f"--json-out {json_out}: give a file path in an existing directory")


def _current_setting(draft: str, num_steps: int, topk: int | None, num_draft_tokens: int):
    """The SpecConfig of tune's current-setting flags (None without --num-steps); ValueError for
    --topk / --num-draft-tokens without --num-steps (SGLang refuses these without num_steps too)."""
    if not num_steps and (topk or num_draft_tokens):
        given = " ".join(
            f"--{name} {v}"
            for name, v in (("topk", topk), ("num-draft-tokens", num_draft_tokens))
            if v
        )
        raise ValueError(
            f"{given} without --num-steps: the current setting needs --num-steps N as well "
            "(as SGLang's --speculative-eagle-topk / --speculative-num-draft-tokens need "
            "--speculative-num-steps); add --num-steps N, or drop them"
        )
    return (
        spec_from_flags(False, draft, num_steps, topk or 1, num_draft_tokens) if num_steps else None
    )
