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

Templates whose generation prompt opens a think block (DeepSeek-R1 always, `<｜Assistant｜><think>\n`;
DeepSeek-V3.1 with thinking=True, `<｜Assistant｜><think>`) render no assistant turn the way it is
served: they strip the reasoning and write the turn without the opened block. Kimi-K2-Thinking
writes its last final-answer turn with an empty think block (`<think></think>`, `EMPTY_THINK`) and
keeps `<think>R</think>` only for the tool-call turns after it, while the served target emits
`<think>` + reasoning + `</think>` + answer after the generation prompt. `served_turn` gives the
turn as the server produces it instead: the prompt, then what the target emits after it
(reasoning in its think block, the answer and end marker as the template writes them). A
template whose prompt opens the block has no rendering without reasoning unless it has a switch
(`NO_DROP`).
"""

from __future__ import annotations

import re
from typing import Any

from specdraft.data.records import DataError

REASONING_MODES = ("keep", "drop")
RECORD_FIELDS = ("reasoning_content", "reasoning", "thinking")  # accepted in records, this order
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
EMPTY_THINK = THINK_OPEN + THINK_CLOSE  # a turn written without its reasoning (Kimi-K2-Thinking)

# kwarg name -> the value that selects the template's non-thinking rendering.
THINKING_SWITCHES = {"enable_thinking": False, "thinking": False}

DROP_HINT = "pass --reasoning drop to train on the answers without the reasoning"
THINKING_HINT = (
    "or turn the template's thinking on (--template-kwargs '{{\"{switch}\": true}}'), "
    "the rendering the target reasons in"
)
NOT_PREFIX_STABLE = (
    "the chat template renders assistant message {index} differently from the prompt "
    "it serves it with (not prefix-stable), so the turn cannot be located exactly; "
    "check --template-kwargs / --reasoning"
)
NO_DROP = (
    "--reasoning drop: the chat template's generation prompt opens a think block the target "
    "always fills (DeepSeek-R1) and it has no non-thinking switch, so there is no rendering "
    "without reasoning; use --reasoning keep with the target's reasoning"
)


def check_mode(reasoning: str) -> str:
    """`reasoning` itself; DataError (a ValueError) naming --reasoning unless it is "keep" or
    "drop"."""
    if reasoning not in REASONING_MODES:
        raise DataError(f"--reasoning {reasoning!r}: use one of {', '.join(REASONING_MODES)}")
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
    switch the other way (thinking on while dropping reasoning), and `NO_DROP` for "drop" with a
    template that has no switch and a generation prompt opening a think block (DeepSeek-R1)."""
    kwargs = dict(template_kwargs)
    if check_mode(reasoning) == "keep":
        return kwargs
    switch = thinking_switch(tokenizer)
    if switch is None:
        probe = [{"role": "user", "content": "?"}]
        if _template_text(tokenizer) and opens_think(
            tokenizer.apply_chat_template(
                probe, tokenize=False, add_generation_prompt=True, **kwargs
            )
        ):
            raise DataError(NO_DROP)
        return kwargs
    if switch in kwargs and kwargs[switch] != THINKING_SWITCHES[switch]:
        raise DataError(
            f"--reasoning drop renders with {switch}={THINKING_SWITCHES[switch]}, but "
            f"--template-kwargs sets {switch}={kwargs[switch]}; drop one of them"
        )
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
        reasoning = stripped[len(THINK_OPEN) :]
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


def template_messages(
    tokenizer, messages, reasoning: str
) -> tuple[list[dict[str, Any]], dict[int, str]]:
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


def check_rendered(turn_text: str, reasoning: str, index: int, switch: str | None = None) -> None:
    """Raise DataError (with DROP_HINT, and THINKING_HINT for the template's thinking `switch`)
    when the rendered assistant turn `turn_text` lacks the message's reasoning: the template
    cannot render it (it reads no reasoning field, drops it even from the last turn, or renders
    with thinking off)."""
    if reasoning.strip() not in turn_text:
        hint = f" {THINKING_HINT.format(switch=switch)}" if switch else ""
        raise DataError(
            f"the chat template does not render the reasoning of message {index} "
            f"(it reads no reasoning field or drops it); {DROP_HINT}{hint}"
        )


def opens_think(prompt: str) -> bool:
    """Whether a rendered generation prompt ends in an opened think block (`<think>`, trailing
    whitespace allowed): the target's output starts inside its reasoning."""
    return prompt.rstrip().endswith(THINK_OPEN)


def served_turn(prompt: str, rendered: str, reasoning: str | None, index: int) -> str:
    """The chat through assistant message `index` as served, for a template that renders the turn
    without the reasoning the target emits. `prompt` is the chat before the turn
    (add_generation_prompt=True), `rendered` the chat through the turn as the template renders
    it. Reasoning and answer are taken as the record holds them (a think block in `content` as
    written).

    - `prompt` opens a think block (DeepSeek-R1, V3.1 with thinking=True): `prompt` + reasoning +
      `</think>` + the turn as the template writes it after its header (the header is `prompt`
      before the `<think>`; a leading `</think>` of a non-thinking turn, as DeepSeek-V3.1 writes
      it, is the one closing tag).
    - the rendered turn starts with `EMPTY_THINK` (Kimi-K2-Thinking's last answer turn): `prompt`
      + `<think>` + reasoning + `</think>` + the rest of the turn, the think block the template
      writes for the turns whose reasoning it keeps.

    Raises DataError when the message has no reasoning (the served turn starts with it) or when
    `rendered` does not start with the header (not prefix-stable)."""
    opened = opens_think(prompt)
    header = prompt[: prompt.rindex(THINK_OPEN)] if opened else prompt
    if not rendered.startswith(header):
        raise DataError(NOT_PREFIX_STABLE.format(index=index))
    if reasoning is None:
        raise DataError(
            f"assistant message {index} has no reasoning, but the chat template's "
            f"generation prompt opens a think block the target fills before answering; "
            f"give the reasoning the target produced (regenerate --reasoning keep)"
        )
    tail = rendered[len(header) :]
    if opened:
        return prompt + reasoning + THINK_CLOSE + tail.removeprefix(THINK_CLOSE)
    return prompt + THINK_OPEN + reasoning + THINK_CLOSE + tail.removeprefix(EMPTY_THINK)
