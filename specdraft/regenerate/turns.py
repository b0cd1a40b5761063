"""What `run.regenerate` asks the backend for each record, and the row it writes back: chats
turn by turn (each assistant turn from the conversation so far, the reasoning sent and kept as
`reasoning_content` with reasoning="keep"), text records as continuations of their prompt.
"""

from __future__ import annotations

from specdraft.data.records import Record
from specdraft.regenerate.backends import Completion, Prompt


def _render_ids(tokenizer, messages, template_kwargs: dict, tools=None) -> tuple[str, list[int]]:
    kwargs = {**template_kwargs, "tools": list(tools)} if tools else template_kwargs
    text = tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True, **kwargs
    )
    return text, list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _request_messages(messages, reasoning: str) -> list[dict]:
    """Messages as sent to a server: an assistant's reasoning as `reasoning_content` (what vLLM
    and SGLang both take, `conventions.REASONING_RESPONSE_FIELDS`), none with reasoning="drop"."""
    from specdraft.data.reasoning import RECORD_FIELDS, message_reasoning

    out = []
    for m in messages:
        if m["role"] != "assistant":
            out.append(dict(m))
            continue
        r, content = message_reasoning(m)
        msg = {**{k: v for k, v in m.items() if k not in RECORD_FIELDS}, "content": content}
        if reasoning == "keep" and r:
            msg["reasoning_content"] = r
        out.append(msg)
    return out


def _chat_prompt(index, messages, tokenizer, template_kwargs, reasoning: str, tools=None) -> Prompt:
    from specdraft.data.reasoning import template_messages

    request = _request_messages(messages, reasoning)
    if tokenizer is None:
        return Prompt(index, messages=request, template_kwargs=template_kwargs, tools=tools)
    text, ids = _render_ids(
        tokenizer, template_messages(tokenizer, messages, reasoning)[0], template_kwargs, tools
    )
    return Prompt(index, request, text, ids, template_kwargs, tools)


def _assistant_turn(answer: Completion, reasoning: str) -> dict:
    """The regenerated assistant message: content, plus the reasoning (reasoning="keep")."""
    from specdraft.data.reasoning import split_think

    r, content = (
        (answer.reasoning, answer.content)
        if answer.reasoning is not None
        else split_think(answer.content)
    )
    turn = {"role": "assistant", "content": content}
    if reasoning == "keep" and r is not None and r.strip():
        turn["reasoning_content"] = r
    if answer.tool_calls:
        turn["tool_calls"] = answer.tool_calls
    return turn


def regenerate_chats(
    chunk: list[tuple[int, Record]], backend, sampling, tokenizer, template_kwargs, reasoning: str
) -> list[dict]:
    """The output rows of a chunk of (index, chat record): every assistant turn regenerated in
    order, each from the chat so far, one `backend.complete` call per turn position; a chat
    that ends in a user turn gets one assistant turn appended."""
    chats = {i: [dict(m) for m in r.messages] for i, r in chunk}
    records = dict(chunk)
    turns = {i: [j for j, m in enumerate(c) if m["role"] == "assistant"] for i, c in chats.items()}
    for i, c in chats.items():
        if c[-1]["role"] != "assistant":
            turns[i].append(len(c))  # a prompt-only chat gets one assistant turn appended
    for k in range(max(len(t) for t in turns.values())):
        active = [i for i in chats if len(turns[i]) > k]
        prompts = [
            _chat_prompt(
                i, chats[i][: turns[i][k]], tokenizer, template_kwargs, reasoning, records[i].tools
            )
            for i in active
        ]
        for i, answer in zip(active, backend.complete(prompts, sampling)):
            turn = _assistant_turn(answer, reasoning)
            if turns[i][k] == len(chats[i]):
                chats[i].append(turn)
            else:
                chats[i][turns[i][k]] = turn
    return [
        {
            "index": i,
            "source": r.source,
            "messages": chats[i],
            **({"tools": list(r.tools)} if r.tools else {}),
        }
        for i, r in chunk
    ]


def _text_prompt(index: int, record: Record, tokenizer, prompt_tokens: int) -> Prompt:
    if record.prompt:
        ids = list(tokenizer(record.prompt)["input_ids"])
        return Prompt(index, text=record.prompt, ids=ids)
    ids = list(tokenizer(record.text)["input_ids"])[:prompt_tokens]
    return Prompt(index, text=tokenizer.decode(ids, skip_special_tokens=True), ids=ids)


def regenerate_texts(chunk, backend, sampling, tokenizer, prompt_tokens) -> list[dict]:
    """The output rows of a chunk of (index, text record): the target's continuation of each
    record's prompt, or of its first `prompt_tokens` tokens."""
    prompts = [_text_prompt(i, r, tokenizer, prompt_tokens) for i, r in chunk]
    outs = backend.complete(prompts, sampling)
    return [
        {"index": i, "source": r.source, "prompt": p.text, "completion": o.content}
        for (i, r), p, o in zip(chunk, prompts, outs)
    ]
