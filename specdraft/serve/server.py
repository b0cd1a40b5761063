"""OpenAI-compatible server over specdraft's engine, continuously batching or one sequence at
a time.

Endpoints: `/v1/completions` and `/v1/chat/completions` (SSE streaming or not; chat through
the tokenizer's chat template; a list of prompts, `n`, `echo`, `logprobs` / `top_logprobs`,
presence / frequency penalties), `/v1/models` and `/v1/models/{id}`, `/health`, `/metrics`
(Prometheus, own registry), and vLLM's `/version`, `/tokenize`, `/detokenize`.

- One worker thread runs the engine, requests queued and cancelled on disconnect: in batches
  of up to max_num_seqs sequences admitted and retired at every round (`serve.batch_worker`;
  logprobs and penalties through the batch-1 path, alone), or one at a time (`serve.worker`).
- A body over `max_request_bytes` gets 413 before the rest of it is read; bodies are parsed and
  tokenized on a thread, off the event loop (`serve.routes`).
- A malformed request (bad JSON, missing field, wrong type, unsupported option) gets 400 with
  OpenAI's error body `{"error": {"message", "type", "param", "code"}}`; an unknown model 404;
  a prompt that does not fit the context 400 (`engine.check_limits`) before any compute.
- `usage` carries the raw speculative counts and `accept_length` = 1 + accepted / drafts.
  `return_token_ids: true` (vLLM's extension) adds the prompt's and the output's token ids
  (`prompt_token_ids`, `token_ids`): the ids the engine ran, which the text, decoded without
  special tokens, does not always give back when re-tokenized (`specdraft doctor --server`).
  `/metrics` exposes the speculative counters under specdraft's names and vLLM's
  (`vllm:spec_decode_*` with vLLM's labels), the rest under specdraft's: `specdraft.serve.metrics`.
The generation routes are `serve.routes`, their answers `serve.answers`, the other routes
`serve.info_routes`; request parsing `serve.protocol`, response shapes `serve.responses` and
`serve.logprobs`, streamed text `serve.text_stream`, the target's scores and penalties in the
engine's round `serve.scoring`.
FastAPI, uvicorn and prometheus_client are imported only when a server is built.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specdraft.checkpoint.id_reading import IdReading
from specdraft.engine.schedule import BatchSchedule
from specdraft.engine.speculate import SpeculativeEngine
from specdraft.serve import info_routes
from specdraft.serve.batch_worker import BatchWorker, batch_settings
from specdraft.serve.metrics import ServerMetrics
from specdraft.serve.protocol import RequestError
from specdraft.serve.routes import (
    DEFAULT_MAX_REQUEST_BYTES,
    ServerState,
    chat_completions,
    completions,
    request_error_response,
)
from specdraft.serve.worker import DEFAULT_MAX_QUEUE, EngineWorker, ServeError


def create_app(
    engine: SpeculativeEngine,
    tokenizer: Any,
    model_name: str,
    max_queue: int = DEFAULT_MAX_QUEUE,
    log_every: int = 0,
    *,
    end_ids: Sequence[int],
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    batching: tuple[int, BatchSchedule | None] = (1, None),
) -> Any:
    """A FastAPI app serving `engine` under `model_name`; its worker thread starts now.

    tokenizer: the target's (transformers) tokenizer: prompts, chat template, text.
    end_ids: the ids a generation ends at (`target.config.end_token_ids`; a request's
    `ignore_eos` runs past them).
    max_queue: requests that may wait besides the running one (429 beyond); log_every:
    verification steps between log lines (0 = off); max_request_bytes: the largest request
    body taken (413 beyond). The engine gets the tokenizer when it has none (stop strings).
    batching: (max_num_seqs, K by batch size or None); max_num_seqs > 1 or a schedule:
    continuous batching where the engine batches (`serve.batch_worker`), else one sequence at
    a time (`serve.worker`).
    Raises ServeError for max_queue < 1 or max_request_bytes < 1, what `BatchWorker` raises.
    """
    from fastapi import FastAPI

    if max_request_bytes < 1:
        raise ServeError(f"max_request_bytes {max_request_bytes}: must be >= 1")
    if engine.tokenizer is None:
        engine.tokenizer = tokenizer
    steps = engine.spec.num_steps if engine.spec else 0
    metrics = ServerMetrics(steps, model_name)
    state = ServerState(
        engine,
        tokenizer,
        model_name,
        metrics,
        new_worker(engine, end_ids, metrics, (max_queue, log_every), *batching),
        max_request_bytes,
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        yield
        state.worker.close()

    app = FastAPI(title="specdraft", lifespan=lifespan)
    app.state.server = state
    add_routes(app)
    return app


def add_routes(app: Any) -> None:
    """The generation routes, `INFO_ROUTES` and the RequestError handler on `app`."""
    app.add_route("/v1/completions", completions, methods=["POST"])
    app.add_route("/v1/chat/completions", chat_completions, methods=["POST"])
    for path, route in INFO_ROUTES.items():
        app.add_route(path, getattr(info_routes, route), methods=[INFO_METHODS.get(path, "GET")])
    app.add_exception_handler(RequestError, request_error_response)


def new_worker(
    engine: SpeculativeEngine,
    end_ids: Sequence[int],
    metrics: ServerMetrics,
    queueing: tuple[int, int],
    max_num_seqs: int,
    schedule: BatchSchedule | None,
) -> EngineWorker:
    """`create_app`'s worker: batching or one sequence at a time; queueing = (max_queue,
    log_every)."""
    if max_num_seqs > 1 or schedule is not None:
        return BatchWorker(engine, end_ids, metrics, queueing, (max_num_seqs, schedule))
    return EngineWorker(engine, end_ids, metrics, *queueing)


# path -> handler in `serve.info_routes` (GET unless INFO_METHODS says otherwise)
INFO_ROUTES = {
    "/v1/models": "models",
    "/v1/models/{model_id:path}": "model",
    "/health": "health",
    "/metrics": "prometheus_metrics",
    "/version": "version",
    "/tokenize": "tokenize",
    "/detokenize": "detokenize",
}
INFO_METHODS = {"/tokenize": "POST", "/detokenize": "POST"}


# ---- running ----------------------------------------------------------------------------------
@dataclass
class RunningServer:
    """A uvicorn server on a background thread (tests, benchmarks); `stop()` shuts it down."""

    url: str
    server: Any
    thread: threading.Thread

    def stop(self, timeout_s: float = 10.0) -> None:
        """Ask uvicorn to exit (runs the app's shutdown: the worker stops) and join the thread."""
        self.server.should_exit = True
        self.thread.join(timeout_s)

    def __enter__(self) -> RunningServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve_in_thread(
    app: Any, host: str = "127.0.0.1", port: int = 0, timeout_s: float = 20.0
) -> RunningServer:
    """Start uvicorn for `app` on a thread, bound to host:port (0 = a free port); return once
    it accepts connections. Raises RuntimeError when it has not started within timeout_s."""
    import socket

    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(
        socket.IPPROTO_TCP, socket.TCP_NODELAY, 1
    )  # accepted sockets inherit it (Linux)
    sock.bind((host, port))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=2))
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [sock]}, daemon=True, name="specdraft-uvicorn"
    )
    thread.start()
    deadline = time.monotonic() + timeout_s
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            server.should_exit = True
            raise RuntimeError(
                f"uvicorn did not start on {host}:{sock.getsockname()[1]} within {timeout_s} s"
            )
        time.sleep(0.01)
    return RunningServer(f"http://{host}:{sock.getsockname()[1]}", server, thread)


def serve(app: Any, host: str = "127.0.0.1", port: int = 8000) -> None:
    """Run uvicorn in the foreground until interrupted (binds loopback by default)."""
    import uvicorn

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    uvicorn.run(app, host=host, port=port, log_level="info")


def build_app(
    target_dir: str,
    draft_dir: str | None,
    spec: Any,
    device: str = "cpu",
    dtype: Any = None,
    max_seq_len: int | None = None,
    model_name: str | None = None,
    max_queue: int = DEFAULT_MAX_QUEUE,
    log_every: int = 0,
    compile: bool = False,
    reading: IdReading | None = None,
    chat_template: str | None = None,
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    batching: tuple[int | None, str | None] = (None, None),
) -> Any:
    """Load the target (with its tokenizer and `chat_template`: `target_tokenizer`) and the
    drafter (a manifest-less one read by `load_engine`'s `reading`), and `create_app` for them,
    ending generations at the target's end ids (`target.config.end_token_ids`). spec:
    SpecConfig, or None for plain decoding (draft_dir ignored). model_name defaults to the
    target directory's name. compile: `load_engine`'s (the app's engine then needs a warm-up
    generation). batching: (max_num_seqs or None: from memory, a --spec-schedule file or None)
    for `batch_worker.batch_settings`. Raises what it, `load_engine`, `target_tokenizer` raise."""
    import torch

    from specdraft.engine.load import load_engine
    from specdraft.targets.config import end_token_ids

    tokenizer = target_tokenizer(target_dir, chat_template)
    engine = load_engine(
        target_dir,
        draft_dir if spec is not None else None,
        spec,
        device,
        dtype or torch.float32,
        max_seq_len,
        tokenizer,
        compile=compile,
        reading=reading,
    )
    return create_app(
        engine,
        tokenizer,
        model_name or Path(target_dir).resolve().name,
        max_queue,
        log_every,
        end_ids=end_token_ids(tokenizer, target_dir),
        max_request_bytes=max_request_bytes,
        batching=batch_settings(engine, *batching),
    )


def target_tokenizer(target_dir: str | Path, chat_template: str | None = None) -> Any:
    """The target directory's tokenizer (`targets.tokenizer.load_target_tokenizer`), for serve and
    tune, its chat template replaced by the Jinja file `chat_template` when given (`data.template`).
    TargetTokenizerError (an UnusableInput) naming the directory when it does not load; DataError
    naming a template file that cannot be read."""
    from specdraft.data.template import use_chat_template
    from specdraft.targets.tokenizer import load_target_tokenizer

    tokenizer = load_target_tokenizer(target_dir)
    return use_chat_template(tokenizer, chat_template)
