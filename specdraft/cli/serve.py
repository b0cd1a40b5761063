"""`specdraft serve`: specdraft's engine behind an OpenAI-compatible API."""

from __future__ import annotations

from typing import Annotated

from specdraft.cli.common import OptionError, app, make_console, set_threads, user_errors
from specdraft.cli.engine_setting import DraftingOptions, EngineRun, decoding_spec, warm_up_compiled
from specdraft.cli.options import (
    ChatTemplate,
    ServeDraft,
    TargetDir,
    flag,
    option,
)
from specdraft.cli.reading import engine_reading
from specdraft.client import MAX_PORT

WARM_UP_PROMPT = "Hello"  # serve's warm-up prompt (generate warms up on the user's prompt)

Host = Annotated[str, option("127.0.0.1", help="Bind address (loopback by default).")]
Port = Annotated[int, option(8000, min=1, max=MAX_PORT, help="Port to listen on.")]
NoSpec = flag(
    "--no-spec",
    help="Plain decoding on the same engine (a baseline; refuses the drafting flags).",
)
MaxQueue = Annotated[
    int, option(64, min=1, help="Requests waiting besides the running one (429 beyond).")
]
MaxNumSeqs = Annotated[
    int,
    option(
        0,
        min=0,
        help="Sequences batched per round (continuous batching; 1 = one at a time, the engine's "
        "compiled batch-1 path). 0: sized from memory: the KV cache one sequence takes at "
        "--max-seq-len (one drafter layer more) against half the free GPU memory (a quarter of "
        "the available host memory on the CPU), at most 256; at most the --spec-schedule's "
        "last batch size; 1 for a DFlash drafter. Batched rounds run eagerly (no CUDA graphs).",
    ),
]
SpecSchedule = Annotated[
    str,
    option(
        "",
        help='JSON file {"num_speculative_tokens_per_batch_size": [[min_batch, max_batch, K], '
        "...]} (vLLM's form; K = 0: plain at those sizes; `tune --concurrency` writes it): K "
        "for each round by its batch size.",
    ),
]
LogEvery = Annotated[
    int,
    option(100, min=0, help="Log accept length and tokens/s every N verification steps (0 = off)."),
]
MaxRequestBytes = Annotated[
    int,
    option(4 * 2**20, min=1, help="Largest request body taken, in bytes (HTTP 413 beyond)."),
]
ModelName = Annotated[
    str, option("", help="Served model name (default: the target directory's name).")
]


@app.command()
def serve(
    target: TargetDir,
    draft: ServeDraft,
    host: Host,
    port: Port,
    drafting: DraftingOptions,
    no_spec: NoSpec,
    max_queue: MaxQueue,
    max_num_seqs: MaxNumSeqs,
    spec_schedule: SpecSchedule,
    max_request_bytes: MaxRequestBytes,
    log_every: LogEvery,
    model_name: ModelName,
    chat_template: ChatTemplate,
    run: EngineRun,
) -> None:
    """Serve specdraft's engine over an OpenAI-compatible API, batching concurrent requests."""
    from specdraft.serve import server

    console = make_console()
    spec = decoding_spec(drafting, draft, no_spec, run.compile, run.device)
    with user_errors(console):
        reading = engine_reading(
            spec is not None, target, draft, drafting.aux_layers, drafting.sglang_version
        )
        check_port_free(host, port)  # before the model loads
        set_threads(run.threads)
        server_app = server.build_app(
            target,
            draft or None,
            spec,
            run.device,
            run.torch_dtype(),
            run.max_seq_len or None,
            model_name or None,
            max_queue,
            log_every,
            compile=run.compile,
            reading=reading,
            chat_template=chat_template or None,
            max_request_bytes=max_request_bytes,
            batching=(max_num_seqs or None, spec_schedule or None),
        )
        _announce_engine(console, server_app.state.server, run.compile)
    _run(console, server_app, target, draft, spec, host, port)


def _run(console, server_app, target: str, draft: str, spec, host: str, port: int) -> None:
    """Say what is served (`serving_line`), then serve it until interrupted."""
    from specdraft.serve import server

    name = server_app.state.server.model_name
    line = serving_line(name, target, draft, spec, host, port)
    console.print(line, markup=False, soft_wrap=True)
    server.serve(server_app, host, port)


def _announce_engine(console, state, compile: bool) -> None:
    """The drafter's method (`dflash.drafter_label`) and the loaded engine's notes; with
    --compile, its warm-up before the first request (no client waits on the compiler)."""
    from specdraft.dflash import drafter_label

    if state.engine.draft is not None:
        console.print(f"drafter: {drafter_label(state.engine.draft.cfg)}", markup=False)
    scheduler = getattr(state.worker, "scheduler", None)  # a continuously batching worker
    batch = f"batches of up to {scheduler.max_num_seqs}" if scheduler else "one at a time"
    console.print(f"sequences: {batch} (--max-num-seqs)", markup=False)
    if scheduler is not None and state.engine.draft is not None:
        console.print(f"speculation by batch size: {scheduler.schedule.describe()}", markup=False)
    for note in state.engine.notes:
        console.print(f"note: {note}", markup=False, soft_wrap=True)
    if compile:
        prompt_ids = state.tokenizer(WARM_UP_PROMPT)["input_ids"]
        warm_up_compiled(lambda n: state.engine.generate(prompt_ids, n), console)


def check_port_free(host: str, port: int) -> None:
    """OptionError naming the fix when host:port cannot be bound (in use, or not an address here)."""
    import socket

    try:
        with socket.create_server((host, port)):
            pass
    except OSError as e:
        raise OptionError(
            f"cannot listen on {host}:{port} ({e.strerror or e}): pass another --port, or stop "
            f"the process using it"
        ) from None


def serving_line(model_name: str, target: str, draft: str, spec, host: str, port: int) -> str:
    """What `serve` says once its model is loaded: the name clients use, the URL, what decodes."""
    how = (
        f"speculative decoding with drafter {draft} (steps {spec.num_steps}, topk {spec.topk}, draft tokens "
        f"{spec.num_draft_tokens})"
        if spec is not None
        else "plain decoding" + (" (--no-spec)" if draft else " (no --draft)")
    )
    return f"serving model '{model_name}' ({target}) at http://{host}:{port}/v1: {how}"
