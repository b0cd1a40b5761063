"""OpenAI's request/response protocol for specdraft's server, without the server itself.

- Requests: `get_field` / `parse_common` check JSON fields against OpenAI's names and types (vLLM's
  `top_k` / `ignore_eos` / `return_token_ids` extensions) into a `GenerationRequest`;
  `prompt_ids_of` and `chat_prompt_ids` turn a completion prompt or chat `messages` (the
  tokenizer's chat template) into target token ids. A bad request raises `RequestError`, which
  carries the HTTP status and OpenAI's error body.
- `prompt_list` / `prompts_of`: a completion request's prompts (one, or a list as vLLM takes it); `num_choices`:
  `n`; `logprobs_of`: chat's `logprobs` / `top_logprobs` or completions' `logprobs`; presence /
  frequency penalties in OpenAI's range. The response bodies are `serve.responses`.
The fields the server does not implement are one table, `UNSUPPORTED`: any value but the
one that asks for nothing gets 400 naming the field.
Imports neither FastAPI, uvicorn nor prometheus_client (jinja2 only when a chat is rendered).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


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
    logprobs: int | None = None  # top alternatives per emitted token (None: no logprobs)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    echo: bool = False  # completions: the prompt (and its scores, with logprobs) comes first

    @property
    def scored(self) -> bool:
        """Whether the engine's verification needs `serve.scoring` (logprobs or penalties)."""
        return self.logprobs is not None or bool(self.presence_penalty or self.frequency_penalty)


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
    "best_of": ((1,), "the server returns one completion per request"),
    "prompt_logprobs": ((), "no prompt log-probabilities apart from echo with logprobs"),
    "logit_bias": (({},), "the sampler has no logit bias"),
    "repetition_penalty": ((1,), "the sampler has presence / frequency penalties only"),
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


MAX_LOGPROBS = 20  # vLLM's default --max-logprobs (and OpenAI's chat top_logprobs bound)
PENALTY_RANGE = (-2.0, 2.0)  # OpenAI's range of presence_penalty / frequency_penalty
MAX_CHOICES = 16  # n at most: choices run one after another on a batch-1 engine


def parse_common(
    body: dict, prompt_ids: list[int], default_max_tokens: int, chat: bool = False
) -> GenerationRequest:
    """The sampling and streaming fields shared by completions and chat (OpenAI names, vLLM's
    top_k / ignore_eos / return_token_ids extensions; `logprobs_of` reads chat's or completions'
    logprobs); raises RequestError for a bad value or a field the server does not implement
    (`refuse_unsupported`)."""
    refuse_unsupported(body)
    stop = body.get("stop")
    stop = (stop,) if isinstance(stop, str) else stop or ()
    if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) and s for s in stop):
        raise RequestError("'stop' must be a non-empty string or a list of them", param="stop")
    max_tokens = get_field(body, "max_tokens", "int", default_max_tokens)
    temperature = get_field(body, "temperature", "number", 1.0)
    top_p = get_field(body, "top_p", "number", 1.0)
    top_k = get_field(body, "top_k", "int", 0)
    presence = get_field(body, "presence_penalty", "number", 0.0)
    frequency = get_field(body, "frequency_penalty", "number", 0.0)
    low, high = PENALTY_RANGE
    checks = [
        ("max_tokens", max_tokens >= 1, ">= 1"),
        ("temperature", temperature >= 0, ">= 0"),
        ("top_p", 0 < top_p <= 1, "in (0, 1]"),
        ("top_k", top_k >= -1, ">= 0 (-1 or 0 = off)"),
        ("presence_penalty", low <= presence <= high, f"in [{low}, {high}]"),
        ("frequency_penalty", low <= frequency <= high, f"in [{low}, {high}]"),
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
        logprobs_of(body, chat),
        float(presence),
        float(frequency),
        echo_of(body, chat),
    )


def echo_of(body: dict, chat: bool) -> bool:
    """Completions' `echo`; chat's (vLLM: prepend the last message) is refused when true."""
    echo = get_field(body, "echo", "bool", False)
    if echo and chat:
        raise RequestError(
            "'echo' = true is not supported in chat: the last message is not prepended; leave "
            "it out (or send false)",
            param="echo",
            code="unsupported",
        )
    return echo


def logprobs_of(body: dict, chat: bool) -> int | None:
    """The top alternatives asked per emitted token, None when no logprobs are asked: chat's
    `logprobs` (bool) with `top_logprobs` (0..MAX_LOGPROBS, only with logprobs true), or
    completions' `logprobs` (an int 0..MAX_LOGPROBS; 0 = the emitted token's alone)."""
    if chat:
        top = get_field(body, "top_logprobs", "int")
        if not get_field(body, "logprobs", "bool", False):
            if top:
                raise RequestError("'top_logprobs' needs 'logprobs': true", param="top_logprobs")
            return None
        name, value = "top_logprobs", top or 0
    else:
        name, value = "logprobs", get_field(body, "logprobs", "int")
        if value is None:
            return None
    if not 0 <= value <= MAX_LOGPROBS:
        raise RequestError(f"'{name}' = {value}: must be in 0..{MAX_LOGPROBS}", param=name)
    return value


def num_choices(body: dict) -> int:
    """`n`, the choices per prompt (1..MAX_CHOICES); RequestError otherwise."""
    n = get_field(body, "n", "int", 1)
    if not 1 <= n <= MAX_CHOICES:
        raise RequestError(f"'n' = {n}: must be in 1..{MAX_CHOICES}", param="n")
    return n


def prompt_list(prompt: Any) -> list:
    """A completion request's prompts as given: a string, a list of ids, or a list of either (a
    batch, as vLLM takes it). Raises RequestError for anything else or an empty list."""
    if isinstance(prompt, str) or (
        isinstance(prompt, list) and prompt and not isinstance(prompt[0], (str, list))
    ):
        return [prompt]
    if not isinstance(prompt, list) or not prompt:
        raise RequestError(
            "'prompt' must be a string, a list of token ids, or a non-empty list of either",
            param="prompt",
            code="invalid_type",
        )
    return prompt


def prompts_of(prompts: list, tokenizer: Any, vocab_size: int) -> list[list[int]]:
    """Token ids of each prompt of `prompt_list` (`prompt_ids_of`)."""
    return [prompt_ids_of(p, tokenizer, vocab_size) for p in prompts]


def prompt_ids_of(prompt: Any, tokenizer: Any, vocab_size: int, param: str = "prompt") -> list[int]:
    """Token ids of one prompt (the field `param`): a string or a list of ids. Raises
    RequestError otherwise, or for an empty prompt or an id outside the vocabulary."""
    if isinstance(prompt, str):
        ids = list(tokenizer(prompt)["input_ids"])
    elif isinstance(prompt, list) and all(
        isinstance(t, int) and not isinstance(t, bool) for t in prompt
    ):
        ids = prompt
        if any(not 0 <= t < vocab_size for t in ids):
            raise RequestError(f"'{param}' token ids must be in 0..{vocab_size - 1}", param=param)
    else:
        raise RequestError(
            f"'{param}' must be a string or a list of token ids, or a list of them",
            param=param,
            code="invalid_type",
        )
    if not ids:
        raise RequestError(f"'{param}' is empty", param=param)
    return ids


def chat_prompt_ids(body: dict, tokenizer: Any) -> list[int]:
    """`render_chat` (generation prompt added), tokenized without extra special tokens."""
    text = render_chat(body, tokenizer, add_generation_prompt=True)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def render_chat(body: dict, tokenizer: Any, add_generation_prompt: bool) -> str:
    """`messages` rendered with the tokenizer's chat template (the request's
    `chat_template_kwargs` passed on). RequestError for bad messages, no template, or a
    template that refuses them."""
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
        return tokenizer.apply_chat_template(
            rendered, tokenize=False, add_generation_prompt=add_generation_prompt, **kwargs
        )
    except (TemplateError, ValueError, TypeError) as e:  # the template refuses these messages
        raise RequestError(
            f"the chat template failed on these messages: {e}", param="messages"
        ) from None


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
