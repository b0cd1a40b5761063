"""Commands that decode with specdraft's engine: generate, serve, demo."""

from __future__ import annotations

import typer

from specdraft.cli.common import (
    AUX_OVERRIDE_HELP,
    DRAFTER_HELP,
    NUM_DRAFT_TOKENS_HELP,
    NUM_STEPS_HELP,
    TOPK_HELP,
    USAGE_ERROR,
    EngineDtype,
    app,
    aux_override,
    check_device,
    check_drafter,
    check_model_dir,
    check_top_p,
    engine_dtype,
    flag,
    id_reading,
    make_console,
    read_target,
    refuse_bad_configs,
    set_threads,
    sglang_version_option,
    spec_from_flags,
    threads_option,
    user_errors,
)
from specdraft.client import MAX_PORT

COMPILE_HELP = (
    "CUDA: compiled target layers replayed as CUDA graphs, decode / verify through Triton kernels "
    "with bf16 / fp16 (a warm-up generation compiles first, a minute or more on large targets)."
)


AUX_NEEDS_DRAFT = " Used only with --draft (refused without it or with --no-spec)."


ENGINE_DEVICE_HELP = "Device the target and drafter run on: cpu, cuda or cuda:N."


WARM_UP_TOKENS = 16  # the --compile warm-up: enough steps to compile and capture decode and verify


WARM_UP_PROMPT = "Hello"  # serve's warm-up prompt (generate warms up on the user's prompt)


def _refuse_compile_off_cuda(compile: bool, device: str) -> None:
    """--compile replays CUDA graphs: ValueError naming the fix on a non-CUDA --device (call it
    before any model loads)."""
    if compile and not device.startswith("cuda"):
        raise ValueError(
            f"--compile needs a CUDA device (CUDA graphs), not --device {device}: "
            f"pass --device cuda, or drop --compile"
        )


def _warm_up_compiled(
    engine, prompt_ids: list[int], max_new_tokens: int, console, **sampling
) -> None:
    """--compile: one short generation that compiles the target layers and captures the CUDA
    graphs, timed in one line, so what runs next (generate's metrics, serve's requests) is the
    engine's time, not the compiler's. `sampling`: `SpeculativeEngine.generate` keywords."""
    import time

    started = time.perf_counter()
    engine.generate(prompt_ids, max_new_tokens, **sampling)
    console.print(
        f"compiled and captured CUDA graphs in {time.perf_counter() - started:.1f} s "
        f"(a warm-up generation, not in the metrics)",
        markup=False,
    )


def _spec_of_flags(
    no_spec: bool,
    draft: str,
    given: dict,
    compile: bool,
    device: str,
    plain_without_draft: bool = False,
):
    """generate's / serve's SpecConfig of the drafting flags (`given`: flag -> value, None when left
    out; --topk 1 and --num-steps 3 by default), None for plain decoding (--no-spec, or no --draft
    when `plain_without_draft`; else --draft is required). A combination of options
    that cannot run (`_refuse_compile_off_cuda`, `_refuse_unused_drafting_flags`, `spec_from_flags`)
    is a usage error: one line, exit `USAGE_ERROR`, as click's for a bad value, before anything loads."""
    with user_errors(None, exit_code=USAGE_ERROR):  # no Ctrl-C message: nothing runs yet
        _refuse_compile_off_cuda(compile, device)
        _refuse_unused_drafting_flags(no_spec, draft, given)
        topk, num_steps = given["--topk"], given["--num-steps"]
        return spec_from_flags(
            no_spec or (plain_without_draft and not draft),
            draft,
            3 if num_steps is None else num_steps,
            1 if topk is None else topk,
            given["--num-draft-tokens"] or 0,
        )


def _refuse_unused_drafting_flags(no_spec: bool, draft: str, given: dict) -> None:
    """ValueError when drafting flags are given explicitly (`given`: flag -> value, None when left
    out) but would be ignored: with --no-spec, or without --draft."""
    named = ", ".join(name for name, value in given.items() if value is not None)
    if named and no_spec:
        raise ValueError(
            f"{named}: drafting settings, but --no-spec decodes plainly (they would be "
            f"ignored): drop {named}, or drop --no-spec"
        )
    if named and not draft:
        raise ValueError(
            f"{named}: drafting settings, but no --draft is given (plain decoding): "
            f"add --draft CKPT, or drop {named}"
        )


@app.command()
def generate(
    target: str = typer.Option(
        ..., help="Target directory (transformers, with its tokenizer).", callback=check_model_dir
    ),
    prompt: str = typer.Option(..., help="Prompt text (tokenized as is, no chat template)."),
    draft: str = typer.Option(
        "", help=DRAFTER_HELP + " (omit for plain decoding).", callback=check_drafter
    ),
    temperature: float = typer.Option(
        0.0, min=0.0, help="0 = greedy (output = the target's greedy output)."
    ),
    top_p: float = typer.Option(
        1.0, help="Nucleus sampling mass, in (0, 1] (1 = off).", callback=check_top_p
    ),
    sampling_top_k: int = typer.Option(
        0, min=0, help="Sample from the k most likely tokens (0 = off)."
    ),
    topk: int | None = typer.Option(
        None, min=1, help=TOPK_HELP + "; default 1; used only with --draft."
    ),
    num_steps: int | None = typer.Option(
        None, min=1, help=NUM_STEPS_HELP + "; default 3; used only with --draft."
    ),
    num_draft_tokens: int | None = typer.Option(
        None, min=0, help=NUM_DRAFT_TOKENS_HELP + " Used only with --draft."
    ),
    aux_layers: str | None = typer.Option(
        None, help=AUX_OVERRIDE_HELP + AUX_NEEDS_DRAFT, callback=aux_override
    ),
    sglang_version: str = sglang_version_option(),
    max_new_tokens: int = typer.Option(
        128,
        min=1,
        help="Most tokens to generate after the prompt (fewer at EOS "
        "unless --ignore-eos); prompt + these must fit the engine's longest request.",
    ),
    no_spec: bool = flag("--no-spec", help="Plain decoding on the same engine, even with --draft."),
    ignore_eos: bool = flag(
        "--ignore-eos",
        help="Do not stop at the target's EOS ids (the tokenizer's and "
        "generation_config.json's eos_token_id).",
    ),
    seed: int = typer.Option(0, help="Sampling seed."),
    max_seq_len: int = typer.Option(0, min=0, help="Cache size (0 = min(max positions, 4096))."),
    device: str = typer.Option("cpu", help=ENGINE_DEVICE_HELP, callback=check_device),
    dtype: EngineDtype = typer.Option("fp32", help="Dtype the target and drafter run in."),
    compile: bool = flag("--compile", help=COMPILE_HELP),
    threads: int | None = threads_option(),
) -> None:
    """Generate with specdraft's engine: speculative decoding with --draft, plain decoding without it
    (or with --no-spec). stdout: the prompt and its continuation, streamed (`> out.txt` keeps the text
    alone); stderr: notes, then the metrics table. Errors are one line on stderr; exit 2: a bad option
    value or combination (before anything loads) or an unusable input (a weights file cut short), 1:
    an input refused while loading or generating."""
    from transformers import AutoTokenizer

    from specdraft.engine.load import load_engine
    from specdraft.machine_load import busy_note

    console, info = make_console(), make_console(stderr=True)  # the text; what is said about it
    remedy = "fewer threads (e.g. --threads 1) compete less" if threads != 1 else ""
    busy = busy_note("the tokens/s above", remedy) if device == "cpu" else None
    spec = _spec_of_flags(
        no_spec,
        draft,
        {
            "--topk": topk,
            "--num-steps": num_steps,
            "--num-draft-tokens": num_draft_tokens,
            "--aux-layers": aux_layers,
            "--sglang-version": sglang_version or None,
        },
        compile,
        device,
        plain_without_draft=True,
    )
    with user_errors(info):
        torch_dtype = engine_dtype(dtype)
        set_threads(threads)
        refuse_bad_configs(draft if spec is not None else "", target)
        reading = (
            id_reading(read_target(target), aux_layers, sglang_version, draft, target)
            if spec is not None
            else None
        )
        tokenizer = AutoTokenizer.from_pretrained(target, local_files_only=True)
        engine = load_engine(
            target,
            draft if spec is not None else None,
            spec,
            device,
            torch_dtype,
            max_seq_len or None,
            tokenizer,
            compile=compile,
            reading=reading,
        )
        for note in engine.notes:
            info.print(f"note: {note}", markup=False, soft_wrap=True)
        ids = tokenizer(prompt, verbose=False)[
            "input_ids"
        ]  # the length check below says more than its warning
        engine.check_limits(len(ids), max_new_tokens)  # before the prompt is echoed
        sampling = {
            "temperature": temperature,
            "top_p": top_p,
            "top_k": sampling_top_k,
            "seed": seed,
        }
        if (
            compile
        ):  # compile and capture first: the metrics below are then the engine's, not the compiler's
            _warm_up_compiled(engine, ids, min(max_new_tokens, WARM_UP_TOKENS), info, **sampling)
        result = _echo_and_generate(
            console, engine, prompt, ids, max_new_tokens, tokenizer, sampling, target, ignore_eos
        )
    console.print()
    _print_generate_summary(info, engine, result, no_spec, compile, busy)


def _echo_and_generate(
    console,
    engine,
    prompt: str,
    ids: list[int],
    max_new_tokens: int,
    tokenizer,
    sampling: dict,
    target: str,
    ignore_eos: bool,
):
    """Echo the prompt (dim), then stream the generated text after it on the same line, up to the
    target directory's end ids (`target.config.end_token_ids`, read before the echo) unless
    `ignore_eos`; an error raised by the engine (or Ctrl-C) first ends that line, so its message
    starts a line of its own."""
    from specdraft.targets.config import end_token_ids

    eos = [] if ignore_eos else end_token_ids(tokenizer, target)
    console.print(prompt, end="", style="dim", markup=False, highlight=False, soft_wrap=True)
    try:
        return engine.generate(
            ids,
            max_new_tokens,
            eos_ids=eos,
            on_tokens=_text_printer(console, tokenizer, ids),
            **sampling,
        )
    except BaseException:
        console.print()
        raise


def _text_printer(console, tokenizer, prompt_ids: list[int]):
    """generate's stream callback: prints the text each batch of new ids adds after the prompt
    (`decode_continuation` of the whole output so far, minus what was printed)."""
    from specdraft.engine.requests import decode_continuation

    output: list[int] = []
    shown = 0

    def stream(new_ids: list[int]) -> None:
        nonlocal shown
        output.extend(new_ids)
        text = decode_continuation(tokenizer, prompt_ids, output)
        console.print(text[shown:], end="", markup=False, highlight=False, soft_wrap=True)
        shown = len(text)

    return stream


def _print_generate_summary(
    console, engine, result, no_spec: bool, compile: bool, busy: str | None
) -> None:
    """generate's metrics table under the engine's setting (plain decoding: with --no-spec or
    without --draft), the kernels a --compile run used, and the busy-machine note when there is one."""
    from specdraft.engine.metrics import metrics_table

    spec = engine.spec
    setting = (
        f"speculative decoding (steps {spec.num_steps}, topk {spec.topk}, draft tokens {spec.num_draft_tokens})"
        if spec is not None
        else "plain decoding" + ("" if no_spec else " (no --draft)")
    )
    console.print(
        metrics_table(result.metrics, setting)
        if engine.spec is not None
        else plain_metrics_table(result.metrics, setting)
    )
    if compile:
        drafter = f"; drafter steps: {engine.draft_kernels}" if engine.spec is not None else ""
        console.print(
            f"target forwards of up to 16 tokens: {engine.target_kernels} kernels{drafter}",
            markup=False,
        )
    if busy:
        console.print(busy, style="yellow", markup=False, soft_wrap=True)


def plain_metrics_table(metrics, title: str):
    """A rich table of plain decoding's SpecMetrics: tokens and time only (tau is 1, nothing is drafted)."""
    from rich.table import Table

    table = Table(title=title)
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_row("output tokens", f"{metrics.num_output_tokens}")
    table.add_row(
        "time prefill / decode (s)",
        f"{metrics.time_prefill_s:.3f} / {metrics.time_total_s - metrics.time_prefill_s:.3f}",
    )
    table.add_row("tokens/s", f"{metrics.tokens_per_s:.1f}")
    return table


@app.command()
def demo(
    out: str = typer.Option("specdraft-demo", help="Working directory; a re-run resumes from it."),
    device: str = typer.Option("cpu", help="cpu | cuda", callback=check_device),
    target: str = typer.Option(
        "",
        help="A local transformers model (default: the bundled stories260K).",
        callback=check_model_dir,
    ),
    data: str = typer.Option(
        "",
        help="Text file of documents separated by blank lines, or JSONL with a "
        '"text" field per line (default: the TinyStories sample).',
    ),
    train_steps: int = typer.Option(1000, help="Drafter optimizer steps."),
    num_train: int = typer.Option(800, help="Training documents."),
    threads: int = typer.Option(
        1,
        min=1,
        help="CPU threads torch uses (1: the fastest for the bundled "
        "260K-parameter model, whose threads only compete); the try: / serve: lines "
        "printed at the end use the same.",
    ),
) -> None:
    """Run the whole pipeline on a real target and write report.md with plots. Stages, in the order
    they run and print: target, data, regenerate, capture, train, speculative generation vs plain
    decoding (picks the setting), export, doctor; then the generation table and where files are."""
    from pathlib import Path

    from specdraft.demo.config import DemoConfig
    from specdraft.demo.report import summary
    from specdraft.demo.run import run_demo

    console = make_console()
    # inputs are checked before any stage runs; a later stage's error is one line too
    with user_errors(
        console, interrupted=lambda: f"run the same command again to resume from {out}"
    ):
        cfg = DemoConfig(
            out=Path(out),
            device=device,
            target=Path(target) if target else None,
            data=Path(data) if data else None,
            train_steps=train_steps,
            num_train=num_train,
            threads=threads,
        )
        report = run_demo(cfg, console)
    console.print(summary(report, Path(out)), markup=False, highlight=False, soft_wrap=True)
    if report.busy:  # the load when the timing above ran (a re-run reuses both)
        console.print(report.busy, style="yellow", markup=False, soft_wrap=True)


def _check_port_free(host: str, port: int) -> None:
    """ValueError naming the fix when host:port cannot be bound (in use, or not an address here)."""
    import socket

    try:
        with socket.create_server((host, port)):
            pass
    except OSError as e:
        raise ValueError(
            f"cannot listen on {host}:{port} ({e.strerror or e}): pass another --port, or stop "
            f"the process using it"
        ) from None


@app.command()
def serve(
    target: str = typer.Option(
        ..., help="Target directory (transformers, with its tokenizer).", callback=check_model_dir
    ),
    draft: str = typer.Option(
        "", help=DRAFTER_HELP + " (omit with --no-spec).", callback=check_drafter
    ),
    host: str = typer.Option("127.0.0.1", help="Bind address (loopback by default)."),
    port: int = typer.Option(8000, min=1, max=MAX_PORT, help="Port to listen on."),
    topk: int | None = typer.Option(None, min=1, help=TOPK_HELP + "; default 1."),
    num_steps: int | None = typer.Option(None, min=1, help=NUM_STEPS_HELP + "; default 3."),
    num_draft_tokens: int | None = typer.Option(None, min=0, help=NUM_DRAFT_TOKENS_HELP),
    aux_layers: str | None = typer.Option(
        None, help=AUX_OVERRIDE_HELP + AUX_NEEDS_DRAFT, callback=aux_override
    ),
    sglang_version: str = sglang_version_option(),
    no_spec: bool = flag(
        "--no-spec",
        help="Plain decoding on the same engine (a baseline; refuses the drafting flags).",
    ),
    max_queue: int = typer.Option(
        64, min=1, help="Requests waiting besides the running one (429 beyond)."
    ),
    log_every: int = typer.Option(
        100, min=0, help="Log accept length and tokens/s every N verification steps (0 = off)."
    ),
    model_name: str = typer.Option(
        "", help="Served model name (default: the target directory's name)."
    ),
    max_seq_len: int = typer.Option(0, min=0, help="Cache size (0 = min(max positions, 4096))."),
    device: str = typer.Option("cpu", help=ENGINE_DEVICE_HELP, callback=check_device),
    dtype: EngineDtype = typer.Option("fp32", help="Dtype the target and drafter run in."),
    compile: bool = flag("--compile", help=COMPILE_HELP),
    threads: int | None = threads_option(),
) -> None:
    """Serve specdraft's engine over an OpenAI-compatible API (one sequence at a time)."""
    from specdraft.serve.server import build_app
    from specdraft.serve.server import serve as run_server

    console = make_console()
    spec = _spec_of_flags(
        no_spec,
        draft,
        {
            "--topk": topk,
            "--num-steps": num_steps,
            "--num-draft-tokens": num_draft_tokens,
            "--aux-layers": aux_layers,
            "--sglang-version": sglang_version or None,
        },
        compile,
        device,
    )
    with user_errors(console):
        reading = (
            id_reading(read_target(target), aux_layers, sglang_version, draft, target)
            if spec is not None
            else None
        )
        _check_port_free(host, port)  # before the model loads
        set_threads(threads)
        server_app = build_app(
            target,
            draft or None,
            spec,
            device,
            engine_dtype(dtype),
            max_seq_len or None,
            model_name or None,
            max_queue,
            log_every,
            compile=compile,
            reading=reading,
        )
        state = server_app.state.server
        for note in state.engine.notes:
            console.print(f"note: {note}", markup=False, soft_wrap=True)
        if compile:  # before the first request: no client waits on the compiler
            _warm_up_compiled(
                state.engine, state.tokenizer(WARM_UP_PROMPT)["input_ids"], WARM_UP_TOKENS, console
            )
    console.print(
        serving_line(state.model_name, target, draft, spec, host, port),
        markup=False,
        soft_wrap=True,
    )
    run_server(server_app, host, port)


def serving_line(model_name: str, target: str, draft: str, spec, host: str, port: int) -> str:
    """What `serve` says once its model is loaded: the name clients use, the URL, what decodes."""
    how = (
        f"speculative decoding with drafter {draft} (steps {spec.num_steps}, topk {spec.topk}, draft tokens "
        f"{spec.num_draft_tokens})"
        if spec is not None
        else "plain decoding" + (" (--no-spec)" if draft else " (no --draft)")
    )
    return f"serving model '{model_name}' ({target}) at http://{host}:{port}/v1: {how}"
