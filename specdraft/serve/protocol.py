"""OpenAI's request/response protocol for specdraft's server, without the server itself.

- Requests: `get_field` / `parse_common` check JSON fields against OpenAI's names and types (vLLM's
  `top_k` / `ignore_eos` / `return_token_ids` extensions) into a `GenerationRequest`;
  `prompt_ids_of` and `chat_prompt_ids` turn a completion prompt or chat `messages` (the
  tokenizer's chat template) into target token ids. A bad request raises `RequestError`, which
  carries the HTTP status and OpenAI's error body.
- Responses: `ResponseShape` builds completion / chat.completion bodies and SSE chunks (`sse`),
  with the prompt's and the output's token ids when asked (`return_token_ids`, vLLM's names: text does not round-trip to the same
  ids, so a client that measures on the tokens the server ran needs them); `usage_of` adds the
  raw speculative counts and `accept_length` = 1 + accepted / drafts to OpenAI's usage.
The fields the server does not implement are one table, `UNSUPPORTED`: any value but the
one that asks for nothing gets 400 naming the field.
Imports neither FastAPI, uvicorn nor prometheus_client (jinja2 only when a chat is rendered).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from specdraft.engine.requests import GenerationResult

FINISH_REASONS = {"eos": "stop", "stop": "stop", "length": "length"}  # engine -> OpenAI


class RequestError(Exception):
    """A request the server refuses: HTTP `status` with OpenAI's error body."""

    def __init__(
        self,
        message: str,
        param: str | None = None,
        code: str | None = None,
        status: int = 400,
        kind: str = "invalid_request_error",
    ) -> None:
        super().__init__(message)
        self.message, self.param, self.code, self.status, self.kind = (
            message,
            param,
            code,
            status,
            kind,
        )

    def body(self) -> dict[str, Any]:
        """`{"error": {"message", "type", "param", "code"}}`."""
        return {
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        }


# ---- request parsing --------------------------------------------------------------------------
@dataclass(frozen=True)
class GenerationRequest:
    """A validated completion or chat request (target token ids and sampling settings)."""

    prompt_ids: list[int]
    max_tokens: int
    temperature: float
    top_p: float
    top_k: int
    stop: tuple[str, ...]
    seed: int | None
    ignore_eos: bool
    stream: bool
    include_usage: bool
    return_token_ids: bool = False


_TYPES = {
    "int": (int,),
    "number": (int, float),
    "bool": (bool,),
    "str": (str,),
    "object": (dict,),
    "array": (list,),
}


def get_field(body: dict, name: str, kind: str, default: Any = None, required: bool = False) -> Any:
    """body[name] checked against a JSON type ("int", "number", "bool", "str", "object",
    "array"); default when absent or null. Raises RequestError naming the field."""
    value = body.get(name)
    if value is None:
        if required:
            raise RequestError(f"'{name}' is a required property", param=name, code="missing_field")
        return default
    is_bool = isinstance(value, bool)
    if not isinstance(value, _TYPES[kind]) or (is_bool and kind in ("int", "number")):
        raise RequestError(
            f"'{name}' must be of type {kind}, got {type(value).__name__} {value!r}",
            param=name,
            code="invalid_type",
        )
    return value


# OpenAI's (and vLLM's) request fields the server does not implement: name -> (the values that ask
# for nothing, which are accepted; what the server lacks). Any other value is refused with 400
# naming the field (`refuse_unsupported`), so that no client is silently served something else.
UNSUPPORTED: dict[str, tuple[tuple[Any, ...], str]] = {
    "n": ((1,), "the server returns one completion per request"),
    "best_of": ((1,), "the server returns one completion per request"),
    "echo": ((False,), "the prompt is not echoed"),
    "logprobs": ((False,), "no log-probabilities are returned"),
    "top_logprobs": ((0,), "no log-probabilities are returned"),
    "prompt_logprobs": ((), "no log-probabilities are returned"),
    "logit_bias": (({},), "the sampler has no logit bias"),
    "presence_penalty": ((0,), "the sampler has no penalties"),
    "frequency_penalty": ((0,), "the sampler has no penalties"),
    "repetition_penalty": ((1,), "the sampler has no penalties"),
    "min_p": ((0,), "the sampler has no min_p"),
    "min_tokens": ((0,), "EOS and stop strings are never held back"),
    "suffix": (("",), "there is no insertion mode"),
    "response_format": (({"type": "text"},), "there is no structured output"),
    "guided_json": ((), "there is no structured output"),
    "guided_regex": ((), "there is no structured output"),
    "guided_choice": ((), "there is no structured output"),
    "guided_grammar": ((), "there is no structured output"),
    "tools": (([],), "there are no tool calls"),
    "tool_choice": (("none",), "there are no tool calls"),
    "functions": (([],), "there are no function calls"),
    "function_call": (("none",), "there are no function calls"),
    "stop_token_ids": (([],), "stops are strings ('stop') and EOS only"),
    "include_stop_str_in_output": ((False,), "the stop string is never included"),
    "skip_special_tokens": ((True,), "special tokens are always skipped in the text"),
    "use_beam_search": ((False,), "there is no beam search"),
}


def refuse_unsupported(body: dict) -> None:
    """RequestError 400 (code "unsupported", naming the field) for a field of `UNSUPPORTED` with
    a value other than one that asks for nothing (null counts as absent; false is not 0)."""
    for name, (neutral, lacks) in UNSUPPORTED.items():
        value = body.get(name)
        if value is None or any(
            (type(value) is bool) == (type(v) is bool) and value == v for v in neutral
        ):
            continue
        shown = json.dumps(value)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        allowed = f" (or send {' / '.join(json.dumps(v) for v in neutral)})" if neutral else ""
        raise RequestError(
            f"'{name}' = {shown} is not supported: {lacks}; leave it out{allowed}",
            param=name,
            code="unsupported",
        )


def parse_common(body: dict, prompt_ids: list[int], default_max_tokens: int) -> GenerationRequest:
    """The sampling and streaming fields shared by completions and chat (OpenAI names, vLLM's
    top_k / ignore_eos / return_token_ids extensions); raises RequestError for a bad value or
    a field the server does not implement (`refuse_unsupported`)."""
    refuse_unsupported(body)
    stop = body.get("stop")
    stop = (stop,) if isinstance(stop, str) else stop or ()
    if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) and s for s in stop):
        raise RequestError("'stop' must be a non-empty string or a list of them", param="stop")
    max_tokens = get_field(body, "max_tokens", "int", default_max_tokens)
    temperature = get_field(body, "temperature", "number", 1.0)
    top_p = get_field(body, "top_p", "number", 1.0)
    top_k = get_field(body, "top_k", "int", 0)
    checks = [
        ("max_tokens", max_tokens >= 1, ">= 1"),
        ("temperature", temperature >= 0, ">= 0"),
        ("top_p", 0 < top_p <= 1, "in (0, 1]"),
        ("top_k", top_k >= -1, ">= 0 (-1 or 0 = off)"),
    ]
    for name, ok, rule in checks:
        if not ok:
            raise RequestError(f"'{name}' = {body.get(name)!r}: must be {rule}", param=name)
    options = get_field(body, "stream_options", "object", {})
    return GenerationRequest(
        prompt_ids,
        max_tokens,
        float(temperature),
        float(top_p),
        max(top_k, 0),
        tuple(stop),
        get_field(body, "seed", "int"),
        get_field(body, "ignore_eos", "bool", False),
        get_field(body, "stream", "bool", False),
        bool(get_field(options, "include_usage", "bool", False)),
        get_field(body, "return_token_ids", "bool", False),
    )


def prompt_ids_of(prompt: Any, tokenizer: Any, vocab_size: int) -> list[int]:
    """Token ids of a completion prompt: a string, a list of ids, or a one-element list of
    either (one prompt per request). Raises RequestError otherwise."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        ids = list(tokenizer(prompt)["input_ids"])
    elif isinstance(prompt, list) and all(
        isinstance(t, int) and not isinstance(t, bool) for t in prompt
    ):
        ids = prompt
        if any(not 0 <= t < vocab_size for t in ids):
            raise RequestError(f"'prompt' token ids must be in 0..{vocab_size - 1}", param="prompt")
    else:
        raise RequestError(
            "'prompt' must be a string or a list of token ids (one prompt per request)",
            param="prompt",
            code="invalid_type",
        )
    if not ids:
        raise RequestError("'prompt' is empty", param="prompt")
    return ids


def chat_prompt_ids(body: dict, tokenizer: Any) -> list[int]:
    """Render `messages` with the tokenizer's chat template (generation prompt added, the
    request's `chat_template_kwargs` passed on) and tokenize without extra special tokens."""
    messages = get_field(body, "messages", "array", required=True)
    if not messages:
        raise RequestError("'messages' is empty", param="messages")
    rendered = [message_of(m, i) for i, m in enumerate(messages)]
    if not getattr(tokenizer, "chat_template", None):
        raise RequestError(
            "this model's tokenizer has no chat template: use /v1/completions",
            param="messages",
            code="no_chat_template",
        )
    kwargs = get_field(body, "chat_template_kwargs", "object", {})
    from jinja2 import TemplateError

    try:
        text = tokenizer.apply_chat_template(
            rendered, tokenize=False, add_generation_prompt=True, **kwargs
        )
    except (TemplateError, ValueError, TypeError) as e:  # the template refuses these messages
        raise RequestError(
            f"the chat template failed on these messages: {e}", param="messages"
        ) from None
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def message_of(message: Any, index: int) -> dict[str, str]:
    """One chat message as {"role", "content"} (text content parts are joined)."""
    param = f"messages[{index}]"
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        raise RequestError(f"{param} must be an object with a string 'role'", param=param)
    content = message.get("content")
    if isinstance(content, list):
        parts = [p.get("text") for p in content if isinstance(p, dict) and p.get("type") == "text"]
        if len(parts) != len(content) or not all(isinstance(p, str) for p in parts):
            raise RequestError(f"{param}.content: only text parts are supported", param=param)
        content = "".join(parts)
    if not isinstance(content, str):
        raise RequestError(f"{param}.content must be a string", param=param, code="invalid_type")
    return {"role": message["role"], "content": content}


# ---- response bodies --------------------------------------------------------------------------
def usage_of(result: GenerationResult) -> dict[str, Any]:
    """OpenAI usage plus the raw speculative counts and accept length (1 + accepted / drafts)."""
    m = result.metrics
    m.check()
    prompt, completion = m.num_prompt_tokens, len(result.token_ids)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "num_drafts": m.num_verify_steps,
        "num_draft_tokens": m.num_drafted_tokens,
        "num_accepted_tokens": m.num_accepted_tokens,
        "num_accepted_tokens_per_pos": list(m.accepted_per_position),
        "accept_length": m.accept_length,
        "acceptance_per_position": m.acceptance_per_position,
    }


def sse(payload: dict) -> str:
    """One server-sent event."""
    return f"data: {json.dumps(payload)}\n\n"


@dataclass
class ResponseShape:
    """OpenAI's completion / chat.completion bodies and chunks for one request.

    prompt_token_ids: the prompt's ids when the request asked for token ids (vLLM's
    return_token_ids: the body's choice carries `prompt_token_ids` and `token_ids`; streamed,
    the first chunk carries `prompt_token_ids` and each chunk the `token_ids` it adds); None
    otherwise.
    """

    model: str
    chat: bool
    prompt_token_ids: list[int] | None = None
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    created: int = field(default_factory=lambda: int(time.time()))
    prompt_sent: bool = False  # streamed: the first chunk went out (with prompt_token_ids)

    def head(self, stream: bool) -> dict[str, Any]:
        """id, object, created, model."""
        kind = ("chat.completion" if self.chat else "text_completion") + (
            ".chunk" if stream and self.chat else ""
        )
        return {
            "id": ("chatcmpl-" if self.chat else "cmpl-") + self.id,
            "object": kind,
            "created": self.created,
            "model": self.model,
        }

    def chunk(
        self, piece: str | dict, finish_reason: str | None, token_ids: Sequence[int] = ()
    ) -> dict[str, Any]:
        """A streamed chunk carrying `piece` (text, or a chat delta dict) and, when token ids
        were asked for, the output ids it adds."""
        if self.chat:
            delta = piece if isinstance(piece, dict) else ({"content": piece} if piece else {})
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        else:
            choice = {"index": 0, "text": piece, "logprobs": None, "finish_reason": finish_reason}
        if self.prompt_token_ids is not None:
            if not self.prompt_sent:
                choice["prompt_token_ids"], self.prompt_sent = self.prompt_token_ids, True
            choice["token_ids"] = list(token_ids)
        return {**self.head(stream=True), "choices": [choice]}

    def full(self, text: str, result: GenerationResult) -> dict[str, Any]:
        """The non-streamed body with usage."""
        reason = FINISH_REASONS[result.finish_reason]
        choice = (
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": reason,
            }
            if self.chat
            else {"index": 0, "text": text, "logprobs": None, "finish_reason": reason}
        )
        if self.prompt_token_ids is not None:
            choice.update(prompt_token_ids=self.prompt_token_ids, token_ids=list(result.token_ids))
        return {**self.head(stream=False), "choices": [choice], "usage": usage_of(result)}
