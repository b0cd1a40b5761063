"""The server's routes: `/v1/completions` and `/v1/chat/completions` (SSE streaming or not),
`/v1/models` and `/v1/models/{id}`, `/health`, `/metrics`; what they share (`ServerState`), and
the answers: one JSON body, or SSE chunks as the worker's events arrive. Starlette and
prometheus_client are imported when a route runs.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass, field
from typing import Any

from specdraft.client import SPECULATIVE_SETTING_KEY
from specdraft.engine.speculate import SpeculativeEngine
from specdraft.serve.metrics import ServerMetrics
from specdraft.serve.protocol import (
    FINISH_REASONS,
    GenerationRequest,
    RequestError,
    ResponseShape,
    chat_prompt_ids,
    get_field,
    prompt_ids_of,
    sse,
    usage_of,
)
from specdraft.serve.text_stream import TextStream
from specdraft.serve.worker import EngineWorker, Job, checked, context_room

DISCONNECT_POLL_S = 0.25


@dataclass
class ServerState:
    """What the route handlers share: engine, tokenizer, served name, metrics, worker."""

    engine: SpeculativeEngine
    tokenizer: Any
    model_name: str
    metrics: ServerMetrics
    worker: EngineWorker
    created: int = field(default_factory=lambda: int(time.time()))


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


async def completions(request: Any) -> Any:
    """POST /v1/completions."""
    state: ServerState = request.app.state.server
    body = await read_body(request, state)
    if body.get("prompt") is None:
        raise RequestError("'prompt' is a required property", param="prompt", code="missing_field")
    ids = prompt_ids_of(body["prompt"], state.tokenizer, state.engine.target.args.vocab_size)
    return await respond(request, state, checked(state.engine, body, ids, 16), chat=False)


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
        checked(state.engine, body, ids, max(1, context_room(state.engine, len(ids)))),
        chat=True,
    )


def model_card(state: ServerState) -> dict[str, Any]:
    """The served model as OpenAI's model object (and vLLM's max_model_len: the room left), with
    the speculative setting the server runs under `SPECULATIVE_SETTING_KEY` (`num_steps`, `topk`,
    `num_draft_tokens`, SGLang's meanings; null without speculation), which doctor reads."""
    spec = state.engine.spec
    return {
        "id": state.model_name,
        "object": "model",
        "created": state.created,
        "owned_by": "specdraft",
        "max_model_len": context_room(state.engine, 0),
        SPECULATIVE_SETTING_KEY: None if spec is None else asdict(spec),
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
