"""The server's routes besides generation: `/v1/models` and `/v1/models/{id}`, `/health`,
`/metrics`, and vLLM's `/version`, `/tokenize` and `/detokenize` in vLLM's request and response
shapes (`conventions.vllm_serving.TOKENIZE_FIELDS`, read from TOKENIZE_SOURCE): tokenize takes a
completion `prompt` (add_special_tokens default true) or chat `messages` (rendered with the
chat template, add_generation_prompt default true, add_special_tokens default false) and
returns `count`, `max_model_len`, `tokens` and, with `return_token_strs`, `token_strs` (the
tokenizer's token strings); detokenize returns the ids' text as `prompt`. Bodies are read and
tokenized off the event loop (`routes.read_raw`). Starlette and prometheus_client are imported
when a route runs.
"""

from __future__ import annotations

import asyncio
from dataclasses import asdict
from typing import Any

from specdraft import __version__
from specdraft.client import SPECULATIVE_SETTING_KEY
from specdraft.serve.protocol import RequestError, get_field, prompt_ids_of, render_chat
from specdraft.serve.routes import ServerState, body_of, check_model, read_raw
from specdraft.serve.worker import context_room


def model_card(state: ServerState) -> dict[str, Any]:
    """The served model as OpenAI's model object (and vLLM's max_model_len: the longest prompt +
    output the engine takes, `engine.longest_request`), with the speculative setting the server
    runs under `SPECULATIVE_SETTING_KEY` (`num_steps`, `topk`, `num_draft_tokens`, SGLang's
    meanings; null without speculation), which doctor reads."""
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
            "running": worker.num_running,
            "waiting": worker.num_waiting,
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


async def version(request: Any) -> Any:
    """GET /version: `{"version": ...}` (vLLM's shape; specdraft's version)."""
    from starlette.responses import JSONResponse

    return JSONResponse({"version": __version__})


def tokenized(raw: bytes, state: ServerState) -> dict[str, Any]:
    """The /tokenize answer of a body (completion prompt or chat messages)."""
    body = body_of(raw, state)
    tokenizer = state.tokenizer
    if body.get("messages") is not None:
        text = render_chat(body, tokenizer, get_field(body, "add_generation_prompt", "bool", True))
        special = get_field(body, "add_special_tokens", "bool", False)
    else:
        text = get_field(body, "prompt", "str", required=True)
        special = get_field(body, "add_special_tokens", "bool", True)
    ids = list(tokenizer(text, add_special_tokens=special)["input_ids"])
    out = {"count": len(ids), "max_model_len": context_room(state.engine, 0), "tokens": ids}
    if get_field(body, "return_token_strs", "bool", False):
        out["token_strs"] = tokenizer.convert_ids_to_tokens(ids)
    return out


def detokenized(raw: bytes, state: ServerState) -> dict[str, Any]:
    """The /detokenize answer: the ids' text (special tokens kept, as vLLM decodes)."""
    body = body_of(raw, state)
    ids = get_field(body, "tokens", "array", required=True)
    if not ids:
        raise RequestError("'tokens' is empty", param="tokens")
    ids = prompt_ids_of(ids, state.tokenizer, state.engine.target.args.vocab_size, "tokens")
    return {"prompt": state.tokenizer.decode(ids)}


async def tokenize(request: Any) -> Any:
    """POST /tokenize."""
    from starlette.responses import JSONResponse

    state: ServerState = request.app.state.server
    raw = await read_raw(request, state)
    return JSONResponse(await asyncio.to_thread(tokenized, raw, state))


async def detokenize(request: Any) -> Any:
    """POST /detokenize."""
    from starlette.responses import JSONResponse

    state: ServerState = request.app.state.server
    raw = await read_raw(request, state)
    return JSONResponse(await asyncio.to_thread(detokenized, raw, state))
