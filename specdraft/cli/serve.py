"""`specdraft serve`: specdraft's engine behind an OpenAI-compatible API."""

from __future__ import annotations

from typing import Annotated

import typer

from specdraft.cli.common import OptionError, app, make_console, set_threads, user_errors
from specdraft.cli.engine_setting import (
    WARM_UP_TOKENS,
    DraftingOptions,
    decoding_spec,
    engine_dtype,
    warm_up_compiled,
)
from specdraft.cli.options import (
    ChatTemplate,
    Compile,
    DraftAuxOverride,
    EngineDevice,
    EngineDtypeOption,
    MaxSeqLen,
    ServeDraft,
    ServeNumDraftTokens,
    ServeNumSteps,
    ServeTopk,
    SglangVersion,
    TargetDir,
    Threads,
    flag,
)
from specdraft.cli.reading import engine_reading
from specdraft.client import MAX_PORT
from specdraft.machine_load import DEFAULT_THREADS

WARM_UP_PROMPT = "Hello"  # serve's warm-up prompt (generate warms up on the user's prompt)

Host = Annotated[str, typer.Option(help="Bind address (loopback by default).")]
Port = Annotated[int, typer.Option(min=1, max=MAX_PORT, help="Port to listen on.")]
NoSpec = Annotated[
    bool,
    flag(
        "--no-spec",
        help="Plain decoding on the same engine (a baseline; refuses the drafting flags).",
    ),
]
MaxQueue = Annotated[
    int, typer.Option(min=1, help="Requests waiting besides the running one (429 beyond).")
]
LogEvery = Annotated[
    int,
    typer.Option(
        min=0, help="Log accept length and tokens/s every N verification steps (0 = off)."
    ),
]
ModelName = Annotated[
    str, typer.Option(help="Served model name (default: the target directory's name).")
]


@app.command()
def serve(
    target: TargetDir,
    draft: ServeDraft = "",
    host: Host = "127.0.0.1",
    port: Port = 8000,
    topk: ServeTopk = None,
    num_steps: ServeNumSteps = None,
    num_draft_tokens: ServeNumDraftTokens = None,
    aux_layers: DraftAuxOverride = None,
    sglang_version: SglangVersion = "",
    no_spec: NoSpec = False,
    max_queue: MaxQueue = 64,
    log_every: LogEvery = 100,
    model_name: ModelName = "",
    chat_template: ChatTemplate = "",
    max_seq_len: MaxSeqLen = 0,
    device: EngineDevice = "cpu",
    dtype: EngineDtypeOption = "fp32",
    compile: Compile = False,
    threads: Threads = DEFAULT_THREADS,
) -> None:
    """Serve specdraft's engine over an OpenAI-compatible API (one sequence at a time)."""
    from specdraft.serve.server import build_app
    from specdraft.serve.server import serve as run_server

    console = make_console()
    drafting = DraftingOptions(topk, num_steps, num_draft_tokens, aux_layers, sglang_version)
    spec = decoding_spec(drafting, draft, no_spec, compile, device)
    with user_errors(console):
        reading = engine_reading(spec is not None, target, draft, aux_layers, sglang_version)
        check_port_free(host, port)  # before the model loads
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
            chat_template=chat_template or None,
        )
        _announce_engine(console, server_app.state.server, compile)
    line = serving_line(server_app.state.server.model_name, target, draft, spec, host, port)
    console.print(line, markup=False, soft_wrap=True)
    run_server(server_app, host, port)


def _announce_engine(console, state, compile: bool) -> None:
    """The drafter's method (`draft_config.method_label`) and the loaded engine's notes; with
    --compile, its warm-up before the first request (no client waits on the compiler)."""
    from specdraft.draft_config import method_label

    if state.engine.draft is not None:
        console.print(f"drafter: {method_label(state.engine.draft.cfg)}", markup=False)
    for note in state.engine.notes:
        console.print(f"note: {note}", markup=False, soft_wrap=True)
    if compile:
        prompt_ids = state.tokenizer(WARM_UP_PROMPT)["input_ids"]
        warm_up_compiled(lambda: state.engine.generate(prompt_ids, WARM_UP_TOKENS), console)


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
