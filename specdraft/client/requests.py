"""Streamed requests: `send` / `run_requests` stream /v1/completions (SGLang: the native
/generate; a chat: /v1/chat/completions) and time the first text and the end of each request
(`RequestRecord`)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from specdraft.client.servers import Server


@dataclass
class RequestRecord:
    """One request: TTFT (first text), latency, completion tokens, usage / meta_info or error,
    and the streamed answer text (a chat's content, without its reasoning)."""

    ttft_s: float | None
    latency_s: float
    num_tokens: int
    usage: dict[str, Any] | None = None
    error: str | None = None
    text: str = ""


def request_body(server: Server, prompt: str | list[dict], cfg: Any) -> tuple[str, dict[str, Any]]:
    """(path, JSON body): a chat (a list of messages) as streamed /v1/chat/completions on every
    kind; text as SGLang's native /generate, else streamed /v1/completions; usage included.
    cfg: the sampling settings (`max_tokens`, `temperature`, `ignore_eos`: bench's BenchConfig)."""
    if isinstance(prompt, list):
        return "/v1/chat/completions", _openai_body(server, cfg, messages=prompt)
    if server.kind == "sglang":
        params = {
            "temperature": cfg.temperature,
            "max_new_tokens": cfg.max_tokens,
            "ignore_eos": cfg.ignore_eos,
        }
        return "/generate", {"text": prompt, "sampling_params": params, "stream": True}
    return "/v1/completions", _openai_body(server, cfg, prompt=prompt)


def _openai_body(server: Server, cfg: Any, **request: Any) -> dict[str, Any]:
    """A streamed OpenAI request body with usage: `request` (the prompt or the messages), the
    sampling settings, and ignore_eos where asked for and the server is not OpenAI's own."""
    body = {
        "model": server.model,
        **request,
        "max_tokens": cfg.max_tokens,
        "temperature": cfg.temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if server.kind != "openai" and cfg.ignore_eos:
        body["ignore_eos"] = True
    return body


def _event_text(event: dict[str, Any], native: bool) -> tuple[str, str]:
    """(answer text, reasoning text) of one streamed event: SGLang /generate's `text`, a
    completion's `choices[].text`, or a chat delta's `content` and reasoning (vLLM's
    `reasoning`, SGLang's `reasoning_content`: `conventions.REASONING_RESPONSE_FIELDS`)."""
    from specdraft.conventions.engines import REASONING_RESPONSE_FIELDS

    if native:
        return event.get("text", ""), ""
    text = reasoning = ""
    for c in event.get("choices", []):
        delta = c.get("delta") or {}
        text += c.get("text") or delta.get("content") or ""
        reasoning += "".join(delta.get(k) or "" for k in REASONING_RESPONSE_FIELDS)
    return text, reasoning


def error_message(body: str) -> str:
    """The message of an OpenAI-style error body (`{"error": {"message": ...}}`, what vLLM,
    SGLang and specdraft answer), else the body's first 300 characters."""
    try:
        message = json.loads(body)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return body[:300]
    return message if isinstance(message, str) else body[:300]


async def send(
    client: httpx.AsyncClient,
    server: Server,
    prompt: str | list[dict],
    cfg: Any,
    clock: Callable[[], float] = time.perf_counter,
) -> RequestRecord:
    """Stream one request (`request_body`); time the first text and the end on `clock` (seconds
    now). A failure (HTTP status, error event, connection) is the record's `error`, never raised."""
    path, body = request_body(server, prompt, cfg)
    start, first, chunks, last, pieces = clock(), None, 0, {}, []
    try:
        async with client.stream("POST", path, json=body) as response:
            if response.status_code != 200:
                detail = error_message((await response.aread()).decode(errors="replace"))
                return RequestRecord(
                    None, clock() - start, 0, error=f"HTTP {response.status_code}: {detail}"
                )
            async for line in response.aiter_lines():
                if not line.startswith("data:") or line.strip() == "data: [DONE]":
                    continue
                event = json.loads(line[5:])
                if "error" in event:
                    return RequestRecord(None, clock() - start, 0, error=str(event["error"]))
                text, reasoning = _event_text(event, path == "/generate")
                if (text or reasoning) and first is None:
                    first = clock()
                chunks += bool(text or reasoning)
                pieces.append(text)
                last = event.get("meta_info") or event.get("usage") or last
    except (httpx.HTTPError, json.JSONDecodeError) as e:
        return RequestRecord(None, clock() - start, 0, error=f"{type(e).__name__}: {e}")
    tokens = int(last.get("completion_tokens", chunks))
    text = "".join(pieces)
    if path == "/generate":  # SGLang's native stream sends the whole text so far in each event
        text = pieces[-1] if pieces else ""
    return RequestRecord(first and first - start, clock() - start, tokens, last or None, text=text)


async def run_requests(
    server: Server,
    prompts: list[str] | list[list[dict]],
    concurrency: int,
    cfg: Any,
    clock: Callable[[], float] = time.perf_counter,
) -> tuple[list[RequestRecord], float]:
    """Send all prompts with `concurrency` in flight; (records, wall seconds on `clock`). cfg:
    `send`'s, with `timeout_s` per request."""
    limits = httpx.Limits(max_connections=concurrency + 1)
    async with httpx.AsyncClient(
        base_url=server.url, timeout=cfg.timeout_s, limits=limits
    ) as client:
        gate = asyncio.Semaphore(concurrency)

        async def one(prompt: str) -> RequestRecord:
            async with gate:
                return await send(client, server, prompt, cfg, clock)

        start = clock()
        records = await asyncio.gather(*(one(p) for p in prompts))
        return list(records), clock() - start
