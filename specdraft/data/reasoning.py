"""Reasoning in chat records: the message field a chat template reads it from, the template's
own non-thinking switch, and think blocks inside `content`.

A record's assistant message may carry its reasoning as `reasoning_content` (SGLang 0.5.23's
response field, read by the Qwen3 and Kimi-K2-Thinking templates), `reasoning` (vLLM 0.32's
response field), `thinking` (read by the gpt-oss harmony template), or as a think block at the
start of `content` (`<think>R</think>A`, or `R</think>A` when the prompt opened the block, as the
DeepSeek-R1 and Qwen3-Thinking templates do). `template_messages` hands the reasoning to the
template under the one field it reads (`reasoning_field`), never as rendered text: what the
tokens look like is the template's business. With `--reasoning drop` the reasoning is left out
and the template's own non-thinking switch is set (`THINKING_SWITCHES`).

Template facts, read from the chat templates kept under tests/unit/data/templates (each with its
source and license): Qwen3 reads `message.reasoning_content` and switches thinking off with
`enable_thinking=False`; Kimi-K2-Thinking reads `message.get('reasoning_content')`; gpt-oss reads
`message.thinking` and has no switch; DeepSeek-V3.1 reads no field (it cuts `...</think>` off
`content`) and switches with `thinking` (default off); DeepSeek-R1 reads no field and has no switch.
"""

from __future__ import annotations

import re
from typing import Any

from specdraft.data.records import DataError

REASONING_MODES = ("keep", "drop")
RECORD_FIELDS = ("reasoning_content", "reasoning", "thinking")  # accepted in records, this order
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"

# kwarg name -> the value that selects the template's non-thinking rendering.
THINKING_SWITCHES = {"enable_thinking": False, "thinking": False}

DROP_HINT = "pass --reasoning drop to train on the answers without the reasoning"


def check_mode(reasoning: str) -> str:
    """`reasoning` itself; ValueError naming --reasoning unless it is "keep" or "drop"."""
    if reasoning not in REASONING_MODES:
        raise ValueError(f"--reasoning {reasoning!r}: use one of {', '.join(REASONING_MODES)}")
    return reasoning


def _template_text(tokenizer) -> str:
    template = getattr(tokenizer, "chat_template", None) or ""
    return template if isinstance(template, str) else "\n".join(map(str, template.values()))


def reasoning_field(tokenizer) -> str | None:
    """The message field the tokenizer's chat template reads reasoning from ("reasoning_content",
    "thinking" or "reasoning"), found as an attribute / item / `.get` / `in` access in the
    template text; None when the template reads none."""
    text = _template_text(tokenizer)
    for name in ("reasoning_content", "thinking", "reasoning"):
        access = rf"""(\.{name}\b|\[\s*['"]{name}['"]\s*\]|\.get\(\s*['"]{name}['"]|['"]{name}['"]\s+in\s+\w)"""
        if re.search(access, text):
            return name
    return None


def thinking_switch(tokenizer) -> str | None:
    """The template's own thinking switch (a `THINKING_SWITCHES` kwarg it tests with
    `is defined`), or None."""
    text = _template_text(tokenizer)
    for name in THINKING_SWITCHES:
        if re.search(rf"(?<![\w.]){name}\s+is\s+(?:not\s+)?defined", text):
            return name
    return None


def reasoning_kwargs(tokenizer, template_kwargs: dict[str, Any], reasoning: str) -> dict[str, Any]:
    """The chat-template kwargs to render with: `template_kwargs`, plus the template's
    non-thinking switch for reasoning="drop". Raises DataError when the user's kwargs set that
    switch the other way (thinking on while dropping reasoning)."""
    kwargs = dict(template_kwargs)
    switch = thinking_switch(tokenizer) if check_mode(reasoning) == "drop" else None
    if switch is None:
        return kwargs
    if switch in kwargs and kwargs[switch] != THINKING_SWITCHES[switch]:
        raise DataError(f"--reasoning drop renders with {switch}={THINKING_SWITCHES[switch]}, but "
                        f"--template-kwargs sets {switch}={kwargs[switch]}; drop one of them")
    kwargs[switch] = THINKING_SWITCHES[switch]
    return kwargs


def split_think(text: str) -> tuple[str | None, str]:
    """(reasoning, answer) of a generated or recorded text: the text before the first `</think>`
    (one leading `<think>` removed) and the text after it, each as written; (None, text) when
    there is no `</think>`."""
    if THINK_CLOSE not in text:
        return None, text
    reasoning, _, answer = text.partition(THINK_CLOSE)
    stripped = reasoning.lstrip()
    if stripped.startswith(THINK_OPEN):
        reasoning = stripped[len(THINK_OPEN):]
    return reasoning, answer


def message_reasoning(message: dict[str, Any]) -> tuple[str | None, str | None]:
    """(reasoning, content) of an assistant message: its first reasoning field (`RECORD_FIELDS`)
    with `content` as is, else a think block split off `content`; (None, content) without one."""
    content = message.get("content")
    for name in RECORD_FIELDS:
        if isinstance(message.get(name), str):
            return message[name], content
    if isinstance(content, str):
        return split_think(content)
    return None, content


def template_messages(tokenizer, messages, reasoning: str) -> tuple[list[dict[str, Any]], dict[int, str]]:
    """The messages to hand the chat template, and {message index: reasoning} of those that have
    reasoning to train (reasoning="keep"). Every assistant message carries its reasoning under
    `reasoning_field(tokenizer)` only (keep), or none (drop); other fields pass unchanged."""
    field = reasoning_field(tokenizer)
    out, kept = [], {}
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            out.append(dict(m))
            continue
        r, content = message_reasoning(m)
        msg = {k: v for k, v in m.items() if k not in RECORD_FIELDS}
        msg["content"] = content
        if check_mode(reasoning) == "keep" and r is not None and r.strip():
            kept[i] = r
            if field is not None:
                msg[field] = r
        out.append(msg)
    return out, kept


def check_rendered(turn_text: str, reasoning: str, index: int) -> None:
    """Raise DataError (with DROP_HINT) when the rendered assistant turn `turn_text` lacks the
    message's reasoning: the template cannot render it (it reads no reasoning field, or drops
    it even from the last turn)."""
    if reasoning.strip() not in turn_text:
        raise DataError(f"the chat template does not render the reasoning of message {index} "
                        f"(it reads no reasoning field or drops it); {DROP_HINT}")
