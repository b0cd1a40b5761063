"""The server's generation routes, `/v1/completions` and `/v1/chat/completions` (SSE streaming
or not), what every route shares (`ServerState`), and the reading of a request: its body, read up
to `max_request_bytes` (413 beyond, before the rest arrives), then parsed and tokenized on a
thread (`asyncio.to_thread`), so that a large prompt does not hold the event loop (`/health`, the
streams of other requests). The answers are `serve.answers`; the other routes `serve.info_routes`.
Starlette is imported when a route runs.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field, replace
from typing import Any

from specdraft.engine.speculate import SpeculativeEngine
from specdraft.serve.answers import Choice, full_body, stream_chunks, wait_for_all
from specdraft.serve.metrics import ServerMetrics
from specdraft.serve.protocol import (
    GenerationRequest,
    RequestError,
    chat_prompt_ids,
    get_field,
    num_choices,
    prompt_list,
    prompts_of,
)
from specdraft.serve.responses import ResponseShape, usage_of
from specdraft.serve.worker import EngineWorker, Job, checked, context_room

DEFAULT_MAX_REQUEST_BYTES = 4 * 2**20  # a request body's limit (--max-request-bytes)


@dataclass
class ServerState:
    """What the route handlers share: engine, tokenizer, served name, metrics, worker, and the
    largest request body taken (bytes)."""

    engine: SpeculativeEngine
    tokenizer: Any
    model_name: str
    metrics: ServerMetrics
    worker: EngineWorker
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    created: int = field(default_factory=lambda: int(time.time()))


@dataclass
class Parsed:
    """A generation request read: its sequences (prompt-major, n per prompt), the echo text of
    each prompt, and the prompts' token count (usage counts each prompt once)."""

    requests: list[GenerationRequest]
    echoes: list[str]
    num_prompt_tokens: int


async def request_error_response(request: Any, error: RequestError) -> Any:
    """The OpenAI error body with the error's status."""
    from starlette.responses import JSONResponse

    return JSONResponse(error.body(), status_code=error.status)


async def read_raw(request: Any, state: ServerState) -> bytes:
    """The request's body, at most `state.max_request_bytes`: RequestError 413 when its
    Content-Length says more (before reading it) or, without one, once more has arrived."""
    limit = state.max_request_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_large(int(declared), limit)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large(size, limit, at_least=True)
        chunks.append(chunk)
    return b"".join(chunks)


def too_large(size: int, limit: int, at_least: bool = False) -> RequestError:
    """413 with the one-line reason."""
    return RequestError(
        f"request body of {'more than ' if at_least else ''}{size} bytes exceeds the server's "
        f"limit of {limit} bytes: send a shorter prompt, or start the server with a larger "
        "--max-request-bytes",
        code="request_too_large",
        status=413,
    )


def body_of(raw: bytes, state: ServerState) -> dict:
    """The request's JSON object; RequestError for bad JSON, a non-object or another model."""
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RequestError(f"request body is not valid JSON: {e}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise RequestError("request body must be a JSON object", code="invalid_json")
    model = get_field(body, "model", "str")
    if model is not None:
        check_model(state, model)
    return body


async def read_body(request: Any, state: ServerState) -> dict:
    """`read_raw`, then `body_of` on a thread."""
    return await asyncio.to_thread(body_of, await read_raw(request, state), state)


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


def sequences(
    state: ServerState, body: dict, prompts: list[list[int]], default_max: int | None, chat: bool
) -> list[GenerationRequest]:
    """n checked requests per prompt (`checked`; default_max None: the room each prompt
    leaves); with a seed, sequence j of a prompt samples with seed + j (distinct choices)."""
    n, out = num_choices(body), []
    for ids in prompts:
        room = default_max or max(1, context_room(state.engine, len(ids)))
        req = checked(state.engine, body, ids, room, chat)
        out += [req if req.seed is None else replace(req, seed=req.seed + j) for j in range(n)]
    return out


def parse_completion(raw: bytes, state: ServerState) -> Parsed:
    """A /v1/completions body read: its prompts tokenized (`prompts_of`), n sequences each."""
    body = body_of(raw, state)
    if body.get("prompt") is None:
        raise RequestError("'prompt' is a required property", param="prompt", code="missing_field")
    given = prompt_list(body["prompt"])
    prompts = prompts_of(given, state.tokenizer, state.engine.target.args.vocab_size)
    echoes = [""] * len(prompts)
    if get_field(body, "echo", "bool", False):
        echoes = [p if isinstance(p, str) else state.tokenizer.decode(p) for p in given]
    requests = sequences(state, body, prompts, 16, chat=False)
    return Parsed(requests, echoes, sum(map(len, prompts)))


def parse_chat(raw: bytes, state: ServerState) -> Parsed:
    """A /v1/chat/completions body read (max_completion_tokens or max_tokens; default: the room
    left), its messages rendered and tokenized (`chat_prompt_ids`)."""
    body = body_of(raw, state)
    ids = chat_prompt_ids(body, state.tokenizer)
    if body.get("max_completion_tokens") is not None:
        body = {**body, "max_tokens": get_field(body, "max_completion_tokens", "int")}
    return Parsed(sequences(state, body, [ids], None, chat=True), [""], len(ids))


async def completions(request: Any) -> Any:
    """POST /v1/completions."""
    state: ServerState = request.app.state.server
    raw = await read_raw(request, state)
    return await respond(request, state, await asyncio.to_thread(parse_completion, raw, state))


async def chat_completions(request: Any) -> Any:
    """POST /v1/chat/completions."""
    state: ServerState = request.app.state.server
    raw = await read_raw(request, state)
    parsed = await asyncio.to_thread(parse_chat, raw, state)
    return await respond(request, state, parsed, chat=True)


async def respond(request: Any, state: ServerState, parsed: Parsed, chat: bool = False) -> Any:
    """Queue the request's sequences; answer with SSE chunks (stream) or one JSON body."""
    from starlette.responses import JSONResponse, StreamingResponse

    loop, events = asyncio.get_running_loop(), asyncio.Queue()

    def poster(index: int):
        def post(event: tuple[str, Any]) -> None:
            try:
                loop.call_soon_threadsafe(events.put_nowait, (index, *event))
            except RuntimeError:  # the request's loop is gone (server shutting down)
                pass

        return post

    reqs, n = parsed.requests, len(parsed.requests) // len(parsed.echoes)
    jobs = [Job(req, poster(i)) for i, req in enumerate(reqs)]
    state.worker.submit(jobs)
    shape = ResponseShape(state.model_name, chat, reqs[0].return_token_ids)
    choices = [
        Choice.of(i, req, state.tokenizer, chat, parsed.echoes[i // n])
        for i, req in enumerate(reqs)
    ]
    if reqs[0].stream:
        usage = None
        if reqs[0].include_usage:
            usage = lambda results: usage_of(results, parsed.num_prompt_tokens)  # noqa: E731
        chunks = stream_chunks(jobs, events, shape, choices, usage)
        return StreamingResponse(chunks, media_type="text/event-stream")
    kind, value = await wait_for_all(request, jobs, events, choices)
    if kind != "done":
        error = RequestError(
            value or "request cancelled", code=kind, status=500, kind="server_error"
        )
        return JSONResponse(error.body(), status_code=500)
    return JSONResponse(full_body(shape, choices, parsed.num_prompt_tokens))
