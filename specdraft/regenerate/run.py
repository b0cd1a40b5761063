"""Regenerating a dataset with a backend (`regenerate`), and the `specdraft regenerate` stage.

Chat mode: every assistant turn is regenerated in order, each from the conversation so far (with
the earlier turns already regenerated); a chat that ends in a user turn gets one assistant turn
appended. With reasoning="keep" each regenerated assistant turn keeps the reasoning the target
produced, as `reasoning_content` (the server's reasoning field, or a local target's think block
split off its answer); with "drop" the prompts are rendered with the template's non-thinking
switch and no reasoning is written. No-chat mode (base models): the prompt is the record's `prompt` field, or the first
`prompt_tokens` tokens of a document; the target writes the continuation.

Every finished record is appended to the output at once (`specdraft.regenerate.output`), so an
interrupted run resumes where it stopped. A record with an empty answer (whitespace only) is not
written, only counted: the output holds records `capture` and `train` read without --skip-bad.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from specdraft.data.records import Record, Records
from specdraft.regenerate.backends import (
    Backend,
    Completion,
    EndpointBackend,
    LocalBackend,
    Prompt,
    RegenerationError,
    Sampling,
)
from specdraft.regenerate.output import (
    check_out_path,
    check_settings,
    finished_indices,
    records_hash,
    settings_path,
)


@dataclass(frozen=True)
class RegenResult:
    """num_done: records written by this run; num_kept: finished by an earlier run; num_empty:
    records not written because an answer came back empty (no text to train on, and a line
    `read_records` refuses); a resumed run asks for them again."""

    path: Path
    num_done: int
    num_kept: int
    num_empty: int


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


def _regenerate_chats(
    chunk: list[tuple[int, Record]], backend, sampling, tokenizer, template_kwargs, reasoning: str
) -> list[dict]:
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


def _regenerate_texts(chunk, backend, sampling, tokenizer, prompt_tokens) -> list[dict]:
    prompts = [_text_prompt(i, r, tokenizer, prompt_tokens) for i, r in chunk]
    outs = backend.complete(prompts, sampling)
    return [
        {"index": i, "source": r.source, "prompt": p.text, "completion": o.content}
        for (i, r), p, o in zip(chunk, prompts, outs)
    ]


def regenerate(
    records: Records,
    out_path: str | Path,
    backend: Backend,
    sampling: Sampling,
    *,
    tokenizer=None,
    template_kwargs: dict | None = None,
    prompt_tokens: int = 32,
    console=None,
    reasoning: str = "keep",
) -> RegenResult:
    """Regenerate every record of `records` into JSONL `out_path` (resumable; see module doc).

    records: `read_records(..., require_assistant=False)`; chat records regenerate assistant
    turns, text records continuations (needs `tokenizer`; prompt = `prompt` field or the first
    `prompt_tokens` tokens). tokenizer: the target's (local: the backend's own); with it, chat
    prompts are also rendered to exact token ids (used by api='completions').
    console: rich Console for a progress bar (None = silent). reasoning: "keep" | "drop" (module
    doc); "drop" needs the tokenizer (its template names the non-thinking switch).
    Raises RegenerationError (failed request after retries, output of other settings).
    """
    from specdraft.data.reasoning import check_mode, reasoning_kwargs
    from specdraft.data.render import check_chat_template

    out_path = check_out_path(out_path)
    tokenizer = tokenizer if tokenizer is not None else getattr(backend, "tokenizer", None)
    kwargs = dict(template_kwargs or {})
    if check_mode(reasoning) == "drop" and records.chat:
        if tokenizer is None:
            raise ValueError(
                "--reasoning drop with --endpoint needs --tokenizer (the target's "
                "tokenizer: its chat template names the non-thinking switch)"
            )
        kwargs = reasoning_kwargs(tokenizer, kwargs, reasoning)
    if not records.chat and tokenizer is None:
        raise ValueError("the no-chat mode needs the target's tokenizer to cut prompts")
    if tokenizer is not None:
        check_chat_template(tokenizer, records)
    created = not out_path.exists()
    check_settings(
        out_path,
        {
            "input": str(records.path.resolve()),
            "input_hash": records_hash(records),
            "num_records": len(records.records),
            "chat": records.chat,
            "backend": backend.describe(),
            "sampling": asdict(sampling),
            "template_kwargs": kwargs,
            "reasoning": reasoning,
            "prompt_tokens": None if records.chat else prompt_tokens,
        },
    )
    done = finished_indices(out_path)
    todo = [(i, r) for i, r in enumerate(records.records) if i not in done]
    try:
        num_written, num_empty = _write_rows(
            records,
            todo,
            out_path,
            backend,
            sampling,
            tokenizer,
            kwargs,
            prompt_tokens,
            console,
            reasoning,
        )
    except BaseException:
        if (
            created and out_path.exists() and out_path.stat().st_size == 0
        ):  # nothing produced: leave no files
            out_path.unlink()
            settings_path(out_path).unlink(missing_ok=True)
        raise
    return RegenResult(out_path, num_written, len(done), num_empty)


def _write_rows(
    records, todo, out_path, backend, sampling, tokenizer, kwargs, prompt_tokens, console, reasoning
) -> tuple[int, int]:
    """Regenerate `todo` in batches, appending each finished row with no empty answer to
    `out_path`; (rows written, rows left out as empty)."""
    num_written = num_empty = 0
    with open(out_path, "a", encoding="utf-8") as f, _progress(console, len(todo)) as advance:
        for start in range(0, len(todo), backend.batch_size):
            chunk = todo[start : start + backend.batch_size]
            try:
                rows = (
                    _regenerate_chats(chunk, backend, sampling, tokenizer, kwargs, reasoning)
                    if records.chat
                    else _regenerate_texts(chunk, backend, sampling, tokenizer, prompt_tokens)
                )
            except RegenerationError as e:
                if (
                    start == 0 and f.tell() == 0
                ):  # nothing written: the caller removes the empty file
                    raise
                raise RegenerationError(
                    f"{e}; finished records are kept in {out_path}: re-run "
                    f"the same command to resume"
                ) from e
            for row in rows:
                if _is_empty(row):
                    num_empty += 1
                    continue
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
                f.flush()
                num_written += 1
            advance(len(rows))
    return num_written, num_empty


def _is_empty(row: dict) -> bool:
    if "messages" in row:
        return any(
            m["role"] == "assistant"
            and not (m["content"] or "").strip()
            and not m.get("tool_calls")
            for m in row["messages"]
        )
    return not row["completion"].strip()


class _progress:
    """A rich progress bar over records (a no-op without a console); yields `advance(n)`."""

    def __init__(self, console, total: int):
        from rich.progress import Progress, TimeRemainingColumn

        columns = (
            *Progress.get_default_columns()[:-1],
            TimeRemainingColumn(elapsed_when_finished=True),
        )
        self.bar = Progress(
            *columns, console=console, disable=console is None
        )  # time taken once done, not 0:00:00
        self.task = self.bar.add_task("regenerate", total=total)

    def __enter__(self):
        self.bar.__enter__()
        return lambda n: self.bar.advance(self.task, n)

    def __exit__(self, *exc):
        return self.bar.__exit__(*exc)


@dataclass(frozen=True)
class RegenConfig:
    """Inputs of `specdraft regenerate`: exactly one of `target` (local model directory) or
    `endpoint` (OpenAI-compatible base URL, with `model`). tokenizer: the target's tokenizer
    directory (default: `target`); needed by an endpoint for the no-chat mode and for exact
    token-id prompts with api='completions'."""

    data: str
    out: str
    target: str | None = None
    endpoint: str | None = None
    model: str = ""
    api: str = "chat"
    tokenizer: str | None = None
    chat: bool = True
    prompt_tokens: int = 32
    sampling: Sampling = Sampling()
    template_kwargs: dict[str, Any] | None = None
    concurrency: int = 8
    batch_size: int = 8
    max_retries: int = 5
    timeout_s: float = 120.0
    api_key: str | None = None
    skip_bad: bool = False
    device: str = "cpu"
    reasoning: str = "keep"

    def __post_init__(self) -> None:
        if (self.target is None) == (self.endpoint is None):
            raise ValueError(
                "RegenConfig: give exactly one of target (a local model directory) "
                "or endpoint (an OpenAI-compatible URL)"
            )
        if self.endpoint and not self.model:
            raise ValueError("model is empty: an endpoint needs the served model's name (--model)")
        if self.prompt_tokens <= 0:
            raise ValueError(f"RegenConfig.prompt_tokens = {self.prompt_tokens}: must be positive")


def regenerate_file(cfg: RegenConfig, console=None) -> RegenResult:
    """Read cfg.data, build the backend, `regenerate` into cfg.out. Raises DataError (bad input),
    RegenerationError (failed requests, output of other settings), ValueError (bad config)."""
    from specdraft.data.records import read_records, skipped_line

    check_out_path(cfg.out, cfg.data)
    records = read_records(cfg.data, chat=cfg.chat, skip_bad=cfg.skip_bad, require_assistant=False)
    if console is not None and records.num_skipped:
        console.print(skipped_line(records.num_skipped, cfg.data), style="yellow", markup=False)
    tokenizer = None
    if cfg.target is not None:
        backend = LocalBackend(
            cfg.target, tokenizer_dir=cfg.tokenizer, batch_size=cfg.batch_size, device=cfg.device
        )
    else:
        backend = EndpointBackend(
            cfg.endpoint,
            cfg.model,
            api=cfg.api,
            concurrency=cfg.concurrency,
            timeout_s=cfg.timeout_s,
            max_retries=cfg.max_retries,
            api_key=cfg.api_key,
        )
        if cfg.tokenizer:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(cfg.tokenizer)
    return regenerate(
        records,
        cfg.out,
        backend,
        cfg.sampling,
        tokenizer=tokenizer,
        template_kwargs=cfg.template_kwargs,
        prompt_tokens=cfg.prompt_tokens,
        console=console,
        reasoning=cfg.reasoning,
    )
