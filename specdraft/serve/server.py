"""OpenAI-compatible server over specdraft's engine, one sequence at a time.

Endpoints: `/v1/completions` and `/v1/chat/completions` (SSE streaming or not; chat through
the tokenizer's chat template), `/v1/models` and `/v1/models/{id}`, `/health`, `/metrics`
(Prometheus, own registry).

- One worker thread runs the engine; requests wait in a bounded queue (`max_queue` waiting
  requests besides the running one; 429 beyond). No batching: concurrency only queues.
- A malformed request (bad JSON, missing field, wrong type, unsupported option) gets 400 with
  OpenAI's error body `{"error": {"message", "type", "param", "code"}}`; an unknown model 404;
  a prompt that does not fit the context 400 (`engine.check_limits`) before any compute.
- A client that disconnects stops its generation at the next verification step: the engine's
  `on_tokens` callback raises `GenerationCancelled` (the engine restarts from a prefill on
  every request, so an interrupted `generate` leaves nothing behind).
- `usage` carries the raw speculative counts and `accept_length` = 1 + accepted / drafts.
  `return_token_ids: true` (vLLM's extension) adds the prompt's and the output's token ids
  (`prompt_token_ids`, `token_ids`): the ids the engine ran, which the text, decoded without
  special tokens, does not always give back when re-tokenized (`specdraft doctor --server`).
  `/metrics` exposes the speculative counters under specdraft's names and vLLM's
  (`vllm:spec_decode_*` with vLLM's labels), the rest under specdraft's: `specdraft.serve.metrics`.
- Every `log_every` verification steps the worker logs accept length, acceptance rate and
  tokens/s over the steps since the last line (like SGLang's decode log; counts kept tokens).
Request parsing and response shapes live in `specdraft.serve.protocol`.
FastAPI, uvicorn and prometheus_client are imported only when a server is built.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from specdraft.engine.speculate import SpeculativeEngine
from specdraft.serve.metrics import ServerMetrics
from specdraft.serve.protocol import (
    FINISH_REASONS,
    GenerationRequest,
    RequestError,
    ResponseShape,
    TextStream,
    chat_prompt_ids,
    context_room,
    get_field,
    parse_common,
    prompt_ids_of,
    sse,
    usage_of,
)

log = logging.getLogger("specdraft.serve")
DEFAULT_MAX_QUEUE = 64
DISCONNECT_POLL_S = 0.25


class GenerationCancelled(Exception):
    """Raised from the engine's token callback to stop a request whose client went away."""


# ---- the worker -------------------------------------------------------------------------------
@dataclass
class Job:
    """One queued request. post(event) hands an event to the request's event loop (thread-safe);
    events: ("tokens", ids), ("done", GenerationResult), ("error", message), ("cancelled", None)."""

    request: GenerationRequest
    post: Callable[[tuple[str, Any]], None]
    cancelled: threading.Event = field(default_factory=threading.Event)
    arrival: float = field(default_factory=time.perf_counter)


class StepLog:
    """Verification steps since the last log line; logs every `every` steps (0 = never)."""

    def __init__(self, every: int, drafts_per_step: int) -> None:
        self.every, self.drafts_per_step = every, drafts_per_step
        self.steps, self.tokens, self.busy_s = 0, 0, 0.0

    def record(self, num_tokens: int, elapsed_s: float, num_waiting: int) -> None:
        """Count one verification step that kept `num_tokens` tokens in `elapsed_s`."""
        self.steps, self.tokens, self.busy_s = (
            self.steps + 1,
            self.tokens + num_tokens,
            self.busy_s + elapsed_s,
        )
        if not self.every or self.steps < self.every:
            return
        rate = (
            (self.tokens - self.steps) / (self.steps * self.drafts_per_step)
            if self.drafts_per_step
            else 0.0
        )
        log.info(
            "decode: %d verification steps, accept len %.2f, accept rate %.2f, gen throughput "
            "(token/s) %.1f, #queue-req %d",
            self.steps,
            self.tokens / self.steps,
            rate,
            self.tokens / self.busy_s if self.busy_s > 0 else 0.0,
            num_waiting,
        )
        self.steps, self.tokens, self.busy_s = 0, 0, 0.0


class EngineWorker:
    """Runs queued jobs on one thread, one at a time (the engine is batch 1); a request ends at
    an id of `end_ids` unless it asks `ignore_eos`."""

    def __init__(
        self,
        engine: SpeculativeEngine,
        end_ids: Sequence[int],
        metrics: ServerMetrics,
        max_queue: int,
        log_every: int,
    ) -> None:
        if max_queue < 1:
            raise ValueError(
                f"max_queue {max_queue}: must be >= 1 (requests waiting besides the running one)"
            )
        self.engine, self.metrics = engine, metrics
        self.eos_ids = tuple(end_ids)
        self.jobs: queue.Queue[Job | None] = queue.Queue(maxsize=max_queue)
        self.running: Job | None = None
        self.step_log = StepLog(log_every, engine.spec.num_draft_tokens - 1 if engine.spec else 0)
        self.thread = threading.Thread(target=self.loop, name="specdraft-engine", daemon=True)
        self.thread.start()

    def submit(self, job: Job) -> None:
        """Queue a job; raises RequestError 429 when the queue is full."""
        try:
            self.jobs.put_nowait(job)
        except queue.Full:
            self.metrics.rejected.inc()
            raise RequestError(
                f"server busy: {self.jobs.maxsize} requests already waiting; retry later",
                code="queue_full",
                status=429,
                kind="server_busy",
            ) from None
        self.metrics.waiting.set(self.jobs.qsize())

    def loop(self) -> None:
        """Take jobs until the stop sentinel (None)."""
        while (job := self.jobs.get()) is not None:
            self.metrics.waiting.set(self.jobs.qsize())
            if job.cancelled.is_set():
                job.post(("cancelled", None))
                continue
            self.running = job
            self.metrics.running.set(1)
            try:
                self.run(job)
            finally:
                self.running = None
                self.metrics.running.set(0)

    def run(self, job: Job) -> None:
        """Generate one request, streaming its tokens through job.post."""
        req, times = job.request, []

        def on_tokens(ids: list[int]) -> None:
            if job.cancelled.is_set():
                raise GenerationCancelled()
            times.append(time.perf_counter())
            if len(times) > 1:  # the first call is the prefill's token, not a verification step
                self.step_log.record(len(ids), times[-1] - times[-2], self.jobs.qsize())
            job.post(("tokens", ids))

        try:
            result = self.engine.generate(
                req.prompt_ids,
                req.max_tokens,
                req.temperature,
                req.top_p,
                req.top_k,
                () if req.ignore_eos else self.eos_ids,
                req.stop or None,
                req.seed,
                on_tokens,
            )
        except GenerationCancelled:
            self.metrics.cancelled.inc()
            job.post(("cancelled", None))
            return
        except Exception as e:  # reported to this request's client; the server keeps serving
            log.exception("generation failed")
            job.post(("error", f"generation failed: {type(e).__name__}: {e}"))
            return
        self.metrics.record(result, self.engine.spec is not None, job.arrival, times[0], times[-1])
        job.post(("done", result))

    def close(self, timeout_s: float = 10.0) -> None:
        """Cancel the running and waiting jobs and stop the thread."""
        if self.running is not None:
            self.running.cancelled.set()
        while True:
            try:
                job = self.jobs.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                job.post(("cancelled", None))
        self.jobs.put(None)
        self.thread.join(timeout_s)


# ---- the app ----------------------------------------------------------------------------------
@dataclass
class ServerState:
    """What the route handlers share: engine, tokenizer, served name, metrics, worker."""

    engine: SpeculativeEngine
    tokenizer: Any
    model_name: str
    metrics: ServerMetrics
    worker: EngineWorker
    created: int = field(default_factory=lambda: int(time.time()))


def create_app(
    engine: SpeculativeEngine,
    tokenizer: Any,
    model_name: str,
    max_queue: int = DEFAULT_MAX_QUEUE,
    log_every: int = 0,
    *,
    end_ids: Sequence[int],
) -> Any:
    """A FastAPI app serving `engine` under `model_name`; its worker thread starts now.

    tokenizer: the target's (transformers) tokenizer: prompts, chat template, text.
    end_ids: the ids a generation ends at (`target.config.end_token_ids`; a request's
    `ignore_eos` runs past them).
    max_queue: requests that may wait besides the running one (429 beyond); log_every:
    verification steps between log lines (0 = off). The engine gets the tokenizer when it has
    none (stop strings). Raises ValueError for max_queue < 1.
    """
    from fastapi import FastAPI

    if engine.tokenizer is None:
        engine.tokenizer = tokenizer
    steps = engine.spec.num_steps if engine.spec else 0
    metrics = ServerMetrics(steps, model_name)
    state = ServerState(
        engine,
        tokenizer,
        model_name,
        metrics,
        EngineWorker(engine, end_ids, metrics, max_queue, log_every),
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        yield
        state.worker.close()

    app = FastAPI(title="specdraft", lifespan=lifespan)
    app.state.server = state
    app.add_route("/v1/completions", completions, methods=["POST"])
    app.add_route("/v1/chat/completions", chat_completions, methods=["POST"])
    app.add_route("/v1/models", models, methods=["GET"])
    app.add_route("/v1/models/{model_id:path}", model, methods=["GET"])
    app.add_route("/health", health, methods=["GET"])
    app.add_route("/metrics", prometheus_metrics, methods=["GET"])
    app.add_exception_handler(RequestError, request_error_response)
    return app


async def request_error_response(request: Any, error: RequestError) -> Any:
    """The OpenAI error body with the error's status."""
    from starlette.responses import JSONResponse

    return JSONResponse(error.body(), status_code=error.status)


async def read_body(request: Any, state: ServerState) -> dict:
    """The request's JSON object; RequestError for bad JSON, a non-object or another model."""
    try:
        body = json.loads(await request.body())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RequestError(f"request body is not valid JSON: {e}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise RequestError("request body must be a JSON object", code="invalid_json")
    model = get_field(body, "model", "str")
    if model is not None:
        check_model(state, model)
    return body


def check_model(state: ServerState, model: str) -> None:
    """RequestError 404 unless `model` is the served name: type invalid_request_error, code
    model_not_found, as OpenAI's API answers an unknown model."""
    if model != state.model_name:
        raise RequestError(
            f"model '{model}' does not exist; this server serves '{state.model_name}'",
            param="model",
            code="model_not_found",
            status=404,
        )


def checked(
    state: ServerState, body: dict, prompt_ids: list[int], default_max: int
) -> GenerationRequest:
    """parse_common + the context check (400 context_length_exceeded before any compute)."""
    req = parse_common(body, prompt_ids, default_max)
    try:
        state.engine.check_limits(len(prompt_ids), req.max_tokens)
    except ValueError as e:
        raise RequestError(str(e), param="max_tokens", code="context_length_exceeded") from None
    return req


async def completions(request: Any) -> Any:
    """POST /v1/completions."""
    state: ServerState = request.app.state.server
    body = await read_body(request, state)
    if body.get("prompt") is None:
        raise RequestError("'prompt' is a required property", param="prompt", code="missing_field")
    ids = prompt_ids_of(body["prompt"], state.tokenizer, state.engine.target.args.vocab_size)
    return await respond(request, state, checked(state, body, ids, 16), chat=False)


async def chat_completions(request: Any) -> Any:
    """POST /v1/chat/completions (max_completion_tokens or max_tokens; default: the room left)."""
    state: ServerState = request.app.state.server
    body = await read_body(request, state)
    ids = chat_prompt_ids(body, state.tokenizer)
    if body.get("max_completion_tokens") is not None:
        body = {**body, "max_tokens": get_field(body, "max_completion_tokens", "int")}
    return await respond(
        request,
        state,
        checked(state, body, ids, max(1, context_room(state.engine, len(ids)))),
        chat=True,
    )


def model_card(state: ServerState) -> dict[str, Any]:
    """The served model as OpenAI's model object (and vLLM's max_model_len: the room left)."""
    return {
        "id": state.model_name,
        "object": "model",
        "created": state.created,
        "owned_by": "specdraft",
        "max_model_len": context_room(state.engine, 0),
    }


async def models(request: Any) -> Any:
    """GET /v1/models: the one served model."""
    from starlette.responses import JSONResponse

    return JSONResponse({"object": "list", "data": [model_card(request.app.state.server)]})


async def model(request: Any) -> Any:
    """GET /v1/models/{id}: the served model, or 404 model_not_found."""
    from starlette.responses import JSONResponse

    state: ServerState = request.app.state.server
    check_model(state, request.path_params["model_id"])
    return JSONResponse(model_card(state))


async def health(request: Any) -> Any:
    """GET /health: 200 while the worker thread lives (503 otherwise), with queue state."""
    from starlette.responses import JSONResponse

    worker = request.app.state.server.worker
    alive = worker.thread.is_alive()
    return JSONResponse(
        {
            "status": "ok" if alive else "dead",
            "running": int(worker.running is not None),
            "waiting": worker.jobs.qsize(),
        },
        status_code=200 if alive else 503,
    )


async def prometheus_metrics(request: Any) -> Any:
    """GET /metrics: Prometheus text exposition of the server's registry."""
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
    from starlette.responses import Response

    return Response(
        generate_latest(request.app.state.server.metrics.registry), media_type=CONTENT_TYPE_LATEST
    )


# ---- responses --------------------------------------------------------------------------------
async def respond(request: Any, state: ServerState, req: GenerationRequest, chat: bool) -> Any:
    """Queue the request; answer with SSE chunks (stream) or one JSON body."""
    from starlette.responses import JSONResponse, StreamingResponse

    loop, events = asyncio.get_running_loop(), asyncio.Queue()

    def post(event: tuple[str, Any]) -> None:
        try:
            loop.call_soon_threadsafe(events.put_nowait, event)
        except RuntimeError:  # the request's loop is gone (server shutting down)
            pass

    job = Job(req, post)
    state.worker.submit(job)
    shape = ResponseShape(state.model_name, chat, req.prompt_ids if req.return_token_ids else None)
    if req.stream:
        return StreamingResponse(
            stream_chunks(state, job, events, shape), media_type="text/event-stream"
        )
    kind, value = await wait_for_end(request, job, events)
    if kind != "done":
        return JSONResponse(
            RequestError(
                value or "request cancelled", code=kind, status=500, kind="server_error"
            ).body(),
            status_code=500,
        )
    text = TextStream(state.tokenizer, req.stop, req.prompt_ids)
    return JSONResponse(shape.full(text.push(value.token_ids) + text.finish(), value))


async def wait_for_end(request: Any, job: Job, events: asyncio.Queue) -> tuple[str, Any]:
    """Wait for the job's final event; cancel it when the client disconnects."""
    try:
        while True:
            try:
                kind, value = await asyncio.wait_for(events.get(), DISCONNECT_POLL_S)
            except TimeoutError:
                if await request.is_disconnected():
                    return "cancelled", None
                continue
            if kind != "tokens":
                return kind, value
    finally:
        job.cancelled.set()  # no-op once finished


async def stream_chunks(
    state: ServerState, job: Job, events: asyncio.Queue, shape: ResponseShape
) -> AsyncIterator[str]:
    """SSE: text chunks, a final chunk with finish_reason, the usage chunk when asked, [DONE].
    Token ids held back with their text (a possible stop string) travel with the next chunk.
    Closing the stream (client disconnect) cancels the job."""
    text = TextStream(state.tokenizer, job.request.stop, job.request.prompt_ids)
    pending: list[int] = []  # output ids not yet sent in a chunk
    try:
        if shape.chat:
            yield sse(shape.chunk({"role": "assistant", "content": ""}, None))
        while True:
            kind, value = await events.get()
            if kind == "tokens":
                pending += value
                if piece := text.push(value):
                    yield sse(shape.chunk(piece, None, pending))
                    pending = []
                continue
            if kind == "done":
                yield sse(shape.chunk(text.finish(), FINISH_REASONS[value.finish_reason], pending))
                if job.request.include_usage:
                    yield sse({**shape.chunk("", None), "choices": [], "usage": usage_of(value)})
            else:
                yield sse(
                    RequestError(
                        value or "request cancelled", code=kind, kind="server_error"
                    ).body()
                )
            yield "data: [DONE]\n\n"
            return
    finally:
        job.cancelled.set()


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
    reading: dict[str, Any] | None = None,
) -> Any:
    """Load the target (with its tokenizer) and the drafter (a manifest-less one read by
    `load_engine`'s `reading`), and `create_app` for them, ending generations at the target's
    end ids (`target.config.end_token_ids`: the tokenizer's EOS and generation_config.json's).

    spec: SpecConfig, or None for plain decoding (draft_dir is then ignored). model_name
    defaults to the target directory's name. compile: `load_engine`'s (CUDA graphs; the app's
    `state.server.engine` then needs a warm-up generation before it serves). Raises what
    `load_engine` raises (mismatched drafter, unreadable checkpoints) and OSError for a missing
    tokenizer."""
    from pathlib import Path

    import torch
    from transformers import AutoTokenizer

    from specdraft.engine.load import load_engine
    from specdraft.targets.config import end_token_ids

    tokenizer = AutoTokenizer.from_pretrained(target_dir, local_files_only=True)
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
    )
