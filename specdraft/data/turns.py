"""Where each assistant turn is in a chat as the tokenizer's chat template renders it: the
character spans `render.render_chat` turns into a loss mask. For assistant message i, the chat
rendered up to message i with the generation prompt (what the server renders) must be a prefix
of the chat rendered through message i; the characters between the two are the assistant turn (its
reasoning and content as the template renders them, tool calls, the end-of-turn marker). Tokens
whose character span overlaps an assistant span get loss_mask = 1. When every such rendering is
a prefix of the full chat, the chat is one sample; templates that rewrite earlier turns once
later turns exist (Qwen3 drops earlier turns' reasoning) give one sample per assistant turn,
each the chat through that turn as the template renders it. A generation prompt that opens a
think block no rendered turn starts with (DeepSeek-R1; DeepSeek-V3.1 with thinking=True), or a
turn the template writes with an empty think block while it has reasoning (Kimi-K2-Thinking's
last answer turn), gives the turn as served instead: the prompt's tokens, then the target's
continuation (reasoning, `</think>`, answer, end marker) as its own tokens, the loss over the
continuation (`specdraft.data.reasoning.served_turn`). Nothing is approximated.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from specdraft.data.reasoning import (
    EMPTY_THINK,
    NO_DROP,
    NOT_PREFIX_STABLE,
    check_rendered,
    opens_think,
    served_turn,
    template_messages,
    thinking_switch,
)
from specdraft.data.records import DataError

NO_TEMPLATE = (
    "the tokenizer has no chat template: give one with --chat-template FILE (a Jinja file, as "
    "vLLM and SGLang take it), or pass --no-chat to train on plain text (base models)"
)


def render_template(
    tokenizer, messages, add_generation_prompt: bool, kwargs: dict, tools=None
) -> str:
    """`messages` rendered as text by the tokenizer's chat template, with the generation prompt
    when `add_generation_prompt`, the template `kwargs` and the OpenAI `tools` schemas (if any)."""
    if tools:
        kwargs = {**kwargs, "tools": list(tools)}
    return tokenizer.apply_chat_template(
        list(messages), tokenize=False, add_generation_prompt=add_generation_prompt, **kwargs
    )


@dataclass(frozen=True)
class ChatRendering:
    """A chat as the template renders it: `texts` (one, or one per assistant turn when the
    template rewrites earlier turns once later ones exist) and, per text, the (start, end)
    character spans of the assistant turns trained in it, and the character offset where the
    served prompt ends (the text is tokenized as prompt tokens + continuation tokens, as a server
    does) or None (tokenized whole)."""

    texts: list[str]
    spans: list[list[tuple[int, int]]]
    splits: list[int | None]


def _filled_turn(
    tokenizer, messages, i: int, kwargs: dict, tools, before: str, through: str, reasoning: str
) -> str | None:
    """The chat through assistant message i as served when the template writes the turn's think
    block empty (`EMPTY_THINK`, Kimi-K2-Thinking's last answer turn), else None. `before` is the
    served prompt, `through` the chat through the turn as rendered. A template that also drops the
    reasoning of the tool-call turns before the answer once the answer exists (Kimi-K2-Thinking)
    renders `through` unlike `before`: the turn is then located in the chat rendered with the
    earlier turns' reasoning left out, and put after `before`, the prompt the server renders."""
    if through.startswith(before + EMPTY_THINK):
        return served_turn(before, through, reasoning, i)
    if through.startswith(before):
        return None
    plain, _ = template_messages(tokenizer, messages[:i], "drop")
    header = render_template(tokenizer, plain, True, kwargs, tools)
    turn = render_template(tokenizer, plain + [messages[i]], False, kwargs, tools)
    if not turn.startswith(header + EMPTY_THINK):
        return None
    return before + served_turn(header, turn, reasoning, i)[len(header) :]


def _turn(
    tokenizer, messages, i: int, kwargs: dict, tools, kept: dict[int, str], reasoning: str
) -> tuple[str, str, bool]:
    """(prompt, chat through turn i, served) of assistant message i: served=True when the
    generation prompt opens a think block the rendered turn lacks, or the template writes the
    turn's think block empty while it has reasoning to train (Kimi-K2-Thinking), and the turn is
    the server's (`served_turn`)."""
    before = render_template(tokenizer, messages[:i], True, kwargs, tools)
    through = render_template(tokenizer, messages[: i + 1], False, kwargs, tools)
    if opens_think(before) and not through.startswith(before):
        if reasoning == "drop":
            raise DataError(NO_DROP)
        return before, served_turn(before, through, kept.get(i), i), True
    if i in kept and not opens_think(before):
        filled = _filled_turn(tokenizer, messages, i, kwargs, tools, before, through, kept[i])
        if filled is not None:
            return before, filled, True
    if i in kept:
        switch = thinking_switch(tokenizer)
        thinking_off = switch is not None and not kwargs.get(switch)
        check_rendered(through.removeprefix(before), kept[i], i, switch if thinking_off else None)
    if not through.startswith(before):
        raise DataError(NOT_PREFIX_STABLE.format(index=i))
    return before, through, False


def assistant_char_spans(
    tokenizer,
    messages: Sequence[dict[str, Any]],
    template_kwargs: dict | None = None,
    *,
    tools=None,
    reasoning: str = "keep",
) -> ChatRendering:
    """Render `messages` with the chat template (reasoning handed to it as
    `specdraft.data.reasoning.template_messages` says) and locate every assistant turn.

    Prefix-stable chats give one text with every assistant span. A template that rewrites
    earlier turns once later turns exist (Qwen3 and gpt-oss drop earlier turns' reasoning) gives
    one text per assistant turn: the chat through that turn as the template renders it, the
    context every later turn is served with, that turn its only span. Raises DataError when the
    template cannot render a turn's reasoning (the fix: --reasoning drop) or renders a turn
    differently from the prompt it serves it with (not prefix-stable even turn by turn).

    A generation prompt that opens a think block (DeepSeek-R1; DeepSeek-V3.1 with thinking=True)
    makes each turn the served one (`specdraft.data.reasoning.served_turn`): the prompt's tokens,
    then the continuation's, the continuation its span; such a turn needs its reasoning, and
    reasoning="drop" raises DataError (`NO_DROP`). So does a turn with reasoning that the template
    writes with an empty think block (Kimi-K2-Thinking's last answer turn; its earlier turns stay
    as the template renders them, in the prompt); with reasoning="drop" it renders as is."""
    kwargs = dict(template_kwargs or {})
    if not getattr(tokenizer, "chat_template", None):
        raise DataError(NO_TEMPLATE)
    messages, kept = template_messages(tokenizer, messages, reasoning)
    turns = [
        _turn(tokenizer, messages, i, kwargs, tools, kept, reasoning)
        for i, m in enumerate(messages)
        if m["role"] == "assistant"
    ]
    full = render_template(tokenizer, messages, False, kwargs, tools)
    if all(full.startswith(through) and not served for _, through, served in turns):
        return ChatRendering([full], [[(len(b), len(t)) for b, t, _ in turns]], [None])
    return ChatRendering(
        [t for _, t, _ in turns],
        [[(len(b), len(t))] for b, t, _ in turns],
        [len(b) if served else None for b, _, served in turns],
    )
