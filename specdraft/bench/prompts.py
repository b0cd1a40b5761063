"""The prompts a bench sweep or tune sends: the bundled ones, or a JSONL file of texts or chats."""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

from specdraft.bench.config import BUILTIN, BenchInputError
from specdraft.data.records import chat_record, json_line, served_messages

PROMPT_ROW = '{"prompt": "<text>"}, {"text": "<text>"}, a chat {"messages": [...]} or a JSON string'


def load_prompts(source: str) -> list[str | list[dict[str, Any]]]:
    """Prompts from "builtin" (specdraft/assets/bench_prompts.jsonl: short stories and code) or
    a JSONL file (any name) of {"prompt": text} rows (a "completion" is left out), {"text": text}
    rows or JSON strings: texts; or of chats ({"messages"} / {"conversations"}, read by
    `data.records.chat_record`): each chat's messages before its last assistant turn, which
    `client.request_body` sends to /v1/chat/completions. Raises BenchInputError (a ValueError)
    naming the file (and line) of a missing or unreadable file, a bad row (plain text included),
    or for no prompts."""
    if source == BUILTIN:
        text, name = (
            (resources.files("specdraft.assets") / "bench_prompts.jsonl").read_text(),
            "builtin",
        )
    else:
        text, name = read_prompt_file(source), str(Path(source))
    prompts = [
        prompt_of_row(line, name, number)
        for number, line in enumerate(text.splitlines(), start=1)
        if line.strip()
    ]
    if not prompts:
        raise BenchInputError(f"{name}: no prompts")
    return prompts


def read_prompt_file(source: str) -> str:
    """The text of the prompts file `source` the user named; BenchInputError naming it when it is
    missing, cannot be read or is not UTF-8 text."""
    path = Path(source)
    if not path.is_file():
        raise BenchInputError(f"{source}: prompt file not found (give a JSONL file or 'builtin')")
    try:
        return path.read_text()
    except OSError as e:
        raise BenchInputError(
            f"{path}: cannot be read ({e.strerror or e}); give a readable JSONL file or 'builtin'"
        ) from None
    except UnicodeDecodeError:
        raise BenchInputError(
            f"{path}: not UTF-8 text; a prompts file is JSONL, one {PROMPT_ROW} per line"
        ) from None


def prompt_of_row(line: str, name: str, number: int) -> str | list[dict[str, Any]]:
    """The prompt of one JSONL row (`load_prompts`); a chat row's is its messages before its last
    assistant turn (`data.render.served_messages`)."""
    fix = f"a prompts file is JSONL, one {PROMPT_ROW} per line"
    row = json_line(line, BenchInputError, f"{name}:{number}", fix)
    if isinstance(row, dict) and ("messages" in row or "conversations" in row):
        prompt = served_messages(chat_record(f"{name}:{number}", row).messages)
    else:
        prompt = (row.get("prompt") or row.get("text")) if isinstance(row, dict) else row
    if not isinstance(prompt, (str, list)) or not prompt:
        raise BenchInputError(f"{name}:{number}: expected {PROMPT_ROW} per line")
    return prompt
