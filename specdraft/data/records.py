"""Input records: read chats or texts from a file or a `save_to_disk` directory (`read_records`).

Inputs:
- JSONL, one object per line: OpenAI `{"messages": [{"role", "content"}, ...], "tools": [...]}`
  (assistant messages may carry reasoning and `tool_calls`; see `Record`), ShareGPT
  `{"conversations": [{"from": "human"|"gpt"|"system", "value"}, ...]}`, or, for base models
  (`chat=False`), `{"text": ...}` or `{"prompt": ..., "completion": ...}`;
- a directory written by `datasets.Dataset.save_to_disk` with the same columns;
- any other file: plain text, documents separated by blank lines.

A bad record raises `BadRecord` naming its file, line and the fix, unless skip_bad=True (then
it is counted); a file of the other mode (chats given with --no-chat, texts without) is named
as such in one line.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specdraft.errors import SpecdraftError

CHAT_ROLES = ("system", "user", "assistant", "tool")
SHAREGPT_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "system": "system",
    "tool": "tool",
}


class DataError(SpecdraftError, ValueError):
    """A bad input record or file; the message names the file, the line and the fix."""


class BadRecord(DataError):
    """One bad record, which skip_bad=True would skip and count (the message names its file and
    line). Commands with --skip-bad say so when they report it."""


NO_CHAT_HINT = "for text records pass --no-chat (capture, regenerate, train --online)"


@dataclass(frozen=True)
class Record:
    """One input example before tokenization, with where it came from ("file:line").

    Chat records have `messages` (dicts with role and content; assistant messages may add
    `reasoning_content` / `reasoning` / `thinking` and `tool_calls`, tool messages
    `tool_call_id` and `name`) and `tools` (the OpenAI tool schemas handed to the chat template,
    None without); text records have `text` (the continuation, supervised) and `prompt`
    (context, not supervised; "" for whole documents).
    """

    source: str
    messages: tuple[dict[str, Any], ...] | None = None
    prompt: str = ""
    text: str = ""
    tools: tuple[dict[str, Any], ...] | None = None


@dataclass(frozen=True)
class Records:
    """Records read from `path`; `num_skipped` bad ones were skipped (skip_bad=True)."""

    path: Path
    records: list[Record]
    num_skipped: int = 0
    chat: bool = True


def read_records(
    path: str | Path, *, chat: bool = True, skip_bad: bool = False, require_assistant: bool = True
) -> Records:
    """Read chat (chat=True) or text (chat=False) records from a JSONL file, a `save_to_disk`
    directory, or a plain-text file (documents separated by blank lines; chat=False only).

    require_assistant=False accepts chats without an assistant turn (prompts to regenerate).
    Raises DataError naming the file and line for a bad record (bad JSON, unknown role, empty
    content, no assistant turn, wrong fields) unless skip_bad=True (then it is counted), and
    for an empty dataset.
    """
    path = Path(path)
    rows = _rows(path, chat)
    records, num_skipped, other_mode = [], 0, None
    for source, row in rows:
        try:
            records.append(_to_record(source, row, chat, require_assistant))
        except DataError:
            other_mode = other_mode or _other_mode(row, chat)
            if not skip_bad:
                # records of the other mode all through (e.g. regenerate --no-chat's output): one line
                if (
                    not records
                    and other_mode
                    and all(_other_mode(r, chat) or isinstance(r, _BadRow) for _, r in rows)
                ):
                    raise DataError(_mode_hint(path, other_mode)) from None
                raise
            num_skipped += 1
    if not records:
        if other_mode:  # every record skipped, and (some of) them for the mode: say so, not "empty"
            raise DataError(_mode_hint(path, other_mode))
        raise DataError(f"{path}: no usable records ({num_skipped} skipped); the dataset is empty")
    return Records(path, records, num_skipped, chat)


def _rows(path: Path, chat: bool) -> Iterable[tuple[str, Any]]:
    """(source, row) of every record in `path`, read as its kind says (directory, JSONL, text).
    Raises DataError for a missing path, or a plain-text file given for chats."""
    if not path.exists():
        raise DataError(f"{path}: no such file or directory")
    if path.is_dir():
        return _dataset_rows(path)
    if path.suffix in (".jsonl", ".json"):
        return _jsonl_rows(path)
    if chat:
        raise DataError(
            f"{path} is plain text, not chats: pass --no-chat (or give a .jsonl file of "
            f"'messages' or 'conversations' chats)"
        )
    return _text_rows(path)


def _other_mode(row: Any, chat: bool) -> str | None:
    """What a row that is no record of this mode holds when it is one of the other mode:
    "prompt/completion records" or "text records" (chat=True), "chats" (chat=False); else None."""
    if not isinstance(row, dict):
        return None
    has_chat = "messages" in row or "conversations" in row
    if chat and not has_chat:
        if "completion" in row:
            return "prompt/completion records"
        return "text records" if "text" in row else None
    if not chat and has_chat and not any(k in row for k in ("text", "completion")):
        return "chats"
    return None


def _mode_hint(path: Path, other_mode: str) -> str:
    if other_mode == "chats":
        return f"{path} holds chats, not plain text: drop --no-chat"
    return f"{path} holds {other_mode}, not chats: pass --no-chat"


def bad_json(e: json.JSONDecodeError) -> str:
    """ "bad JSON (<reason> at column N)" for one JSONL line (json's reason may end in " at");
    "at the end of the line" where json ran past the line's content into its newline."""
    where = "the end of the line" if e.lineno > 1 else f"column {e.colno}"
    return f"bad JSON ({e.msg.removesuffix(' at')} at {where})"


def json_line(line: str, error: type[SpecdraftError], where: str, fix: str) -> Any:
    """The JSON value on one JSONL line; `error` "<where>: bad JSON (<reason> at column N); <fix>"
    (`bad_json`) when the line holds none."""
    try:
        return json.loads(line)
    except json.JSONDecodeError as e:
        raise error(f"{where}: {bad_json(e)}; {fix}") from None


def _lines(path: Path) -> Iterable[tuple[int, str]]:
    """(line number, line) of the UTF-8 file `path`; DataError naming it when it cannot be read
    (permissions, not UTF-8)."""
    try:
        with open(path, encoding="utf-8") as f:
            yield from enumerate(f, start=1)
    except (OSError, UnicodeDecodeError) as e:
        reason = e.strerror if isinstance(e, OSError) else f"not UTF-8 text: {e.reason}"
        raise DataError(
            f"{path}: cannot be read ({reason}); give a UTF-8 JSONL or text file"
        ) from None


def _jsonl_rows(path: Path) -> Iterable[tuple[str, Any]]:
    for line_no, line in _lines(path):
        if not line.strip():
            continue
        source = f"{path}:{line_no}"
        try:
            yield source, json.loads(line)
        except json.JSONDecodeError as e:
            yield source, _BadRow(bad_json(e))


def _text_rows(path: Path) -> Iterable[tuple[str, Any]]:
    block: list[str] = []
    start = 0
    for line_no, line in _lines(path):
        if line.strip():
            if not block:
                start = line_no
            block.append(line.rstrip("\n"))
        elif block:
            yield f"{path}:{start}", {"text": "\n".join(block)}
            block = []
    if block:
        yield f"{path}:{start}", {"text": "\n".join(block)}


def _dataset_rows(path: Path) -> Iterable[tuple[str, Any]]:
    import datasets

    try:
        ds = datasets.load_from_disk(str(path))
    except FileNotFoundError as e:
        raise DataError(f"{path}: not a directory written by datasets' save_to_disk ({e})") from e
    if isinstance(ds, datasets.DatasetDict):
        if "train" not in ds:
            raise DataError(
                f"{path}: DatasetDict without a 'train' split (splits: "
                f"{', '.join(ds)}); save the split to use on its own"
            )
        ds = ds["train"]
    for i, row in enumerate(ds):
        yield f"{path}:row {i}", row


class _BadRow:
    def __init__(self, reason: str) -> None:
        self.reason = reason


def _bad(source: str, reason: str, fix: str) -> BadRecord:
    return BadRecord(f"{source}: {reason}; fix: {fix}")


def _to_record(source: str, row: Any, chat: bool, require_assistant: bool = True) -> Record:
    if isinstance(row, _BadRow):
        raise _bad(source, row.reason, "write one JSON object per line")
    if not isinstance(row, dict):
        raise _bad(
            source,
            f"expected a JSON object, got {type(row).__name__}",
            "write one JSON object per line",
        )
    if chat:
        return Record(
            source,
            messages=_chat_messages(source, row, require_assistant),
            tools=_tools(source, row),
        )
    if isinstance(row.get("text"), str) and row["text"].strip():
        return Record(source, text=row["text"])
    if isinstance(row.get("completion"), str) and row["completion"].strip():
        prompt = row.get("prompt", "")
        if not isinstance(prompt, str):
            raise _bad(source, "'prompt' is not a string", "give the prompt as a string")
        return Record(source, prompt=prompt, text=row["completion"])
    raise _bad(
        source,
        "no non-empty 'text' or 'completion' field",
        'give {"text": ...} or {"prompt": ..., "completion": ...}',
    )


def served_messages(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """A chat's messages before its last assistant turn (all of them when it has none): the
    prompt a server is sent to produce that turn."""
    last = max(
        (i for i, m in enumerate(messages) if m["role"] == "assistant"), default=len(messages)
    )
    return list(messages[:last])


def chat_record(source: str, row: Any) -> Record:
    """One chat row ({"messages"} or {"conversations"}) as a Record, no assistant turn needed (a
    prompt); BadRecord naming `source` (file:line) for a bad one, as `read_records` does."""
    return _to_record(source, row, chat=True, require_assistant=False)


MESSAGE_FIELDS = {
    "assistant": ("reasoning_content", "reasoning", "thinking", "tool_calls"),
    "tool": ("tool_call_id", "name"),
}


def _chat_messages(source: str, row: dict, require_assistant: bool) -> tuple[dict[str, Any], ...]:
    if "messages" in row:
        turns = [
            (m.get("role"), m) if isinstance(m, dict) else (None, {}) for m in row["messages"] or []
        ]
        known = CHAT_ROLES
    elif "conversations" in row:
        turns = [
            (SHAREGPT_ROLES.get(m.get("from")), {**m, "content": m.get("value")})
            if isinstance(m, dict)
            else (None, {})
            for m in row["conversations"] or []
        ]
        known = tuple(SHAREGPT_ROLES)
    else:
        raise _bad(
            source,
            "no 'messages' or 'conversations' field",
            'give OpenAI {"messages": [{"role", "content"}]} or ShareGPT '
            f'{{"conversations": [{{"from", "value"}}]}}, or {NO_CHAT_HINT}',
        )
    if not turns:
        raise _bad(source, "empty conversation", "remove the line")
    messages = tuple(_message(source, i, role, m, known) for i, (role, m) in enumerate(turns))
    if require_assistant and not any(m["role"] == "assistant" for m in messages):
        raise _bad(
            source,
            "no assistant turn (nothing to learn)",
            "add the assistant's answer, or regenerate it with `specdraft regenerate`",
        )
    return messages


def _message(source: str, i: int, role: str | None, m: dict, known) -> dict[str, Any]:
    """One chat message: role and content, plus the fields its role may carry (`MESSAGE_FIELDS`:
    an assistant's reasoning and tool calls, a tool result's call id and name)."""
    if role not in CHAT_ROLES:
        raise _bad(source, f"turn {i} has an unknown role", f"use one of {', '.join(known)}")
    content, tool_calls = m.get("content"), m.get("tool_calls")
    if tool_calls is not None and (
        role != "assistant"
        or not isinstance(tool_calls, list)
        or not all(isinstance(c, dict) for c in tool_calls)
    ):
        raise _bad(
            source,
            f"turn {i} ({role}) has a bad 'tool_calls'",
            "give tool calls on assistant turns, as a list of OpenAI tool-call objects",
        )
    calls_only = role == "assistant" and bool(tool_calls) and content in (None, "")
    if not calls_only and (
        not isinstance(content, str) or (role == "assistant" and not content.strip())
    ):
        raise _bad(
            source,
            f"turn {i} ({role}) has empty or non-string content",
            "give every turn text content",
        )
    message = {"role": role, "content": content}
    for name in MESSAGE_FIELDS.get(role, ()):
        if m.get(name) is not None:
            if name != "tool_calls" and not isinstance(m[name], str):
                raise _bad(
                    source, f"turn {i} ({role}) has a non-string '{name}'", f"give '{name}' as text"
                )
            message[name] = m[name]
    return message


def _tools(source: str, row: dict) -> tuple[dict[str, Any], ...] | None:
    tools = row.get("tools")
    if tools is None:
        return None
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise _bad(
            source, "'tools' is not a list of objects", "give the OpenAI tool schemas as a list"
        )
    return tuple(tools)


def skipped_line(num_skipped: int, path) -> str:
    """What --skip-bad commands print when they skipped records: "skipped 2 bad records in x.jsonl"."""
    return f"skipped {num_skipped} bad record{'' if num_skipped == 1 else 's'} in {path}"
