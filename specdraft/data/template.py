"""A chat template given as a file (`--chat-template FILE`, a Jinja file as vLLM's and SGLang's
servers take it), read as the engine that serves it reads it and set on the tokenizer, so that
every rendering (capture, regenerate, train --online, serve, doctor) applies it through
`apply_chat_template` and `render.template_hash` fingerprints it as it does a tokenizer's own.

How the engines read the file: vLLM (`vllm/entrypoints/chat_utils.py`, `load_chat_template`)
as written, passed on as `apply_chat_template(chat_template=...)`, as transformers reads a
model's `chat_template.jinja`; SGLang (`srt/managers/template_manager.py`,
`_load_jinja_template`) with its leading and trailing newlines stripped and each literal `\\n`
made a newline, set as `tokenizer.chat_template`. A `.json` file is SGLang's own conversation
format, not a Jinja template.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from specdraft.data.records import DataError
from specdraft.files import unreadable

TEMPLATE_READERS = ("vllm", "sglang")  # how each engine reads a --chat-template file


def template_fingerprint(template: str | dict | None) -> str | None:
    """sha256 (hex) of a chat template's text (a dict of named templates is hashed as sorted
    JSON); None for no template. What manifests and capture stores record as its "hash"."""
    if not template:
        return None
    if not isinstance(template, str):
        template = json.dumps(template, sort_keys=True)
    return hashlib.sha256(template.encode("utf-8")).hexdigest()


def read_chat_template(path: str | Path, engine: str = "vllm") -> str:
    """The template text of the Jinja file `path` as `engine` ("vllm" | "sglang") reads it.

    Raises DataError naming the file for a file that cannot be read, is empty, or is SGLang's
    JSON conversation format."""
    if engine not in TEMPLATE_READERS:
        raise ValueError(f"engine {engine!r}: expected one of {TEMPLATE_READERS}")
    path = Path(path)
    if path.suffix == ".json":
        raise DataError(
            f"--chat-template {path}: a JSON file (SGLang's conversation format), not a "
            "chat template; give a Jinja file (e.g. template.jinja)"
        )
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(
            f"--chat-template {path}: cannot read it ({unreadable(e)}); give a Jinja chat template "
            "file"
        ) from None
    if not text.strip():
        raise DataError(f"--chat-template {path}: the file is empty; give a Jinja chat template")
    if engine == "sglang":
        text = text.strip("\n").replace("\\n", "\n")
    return text


def use_chat_template(
    tokenizer: Any, path: str | Path | None, *, chat: bool = True, engine: str = "vllm"
) -> Any:
    """`tokenizer`, its chat template replaced by the file `path`'s (read as `engine` does:
    `read_chat_template`); unchanged when `path` is None or "". Returns the tokenizer.

    Raises DataError for a template given with chat=False (`check_template_mode`)."""
    if not path:
        return tokenizer
    check_template_mode(path, chat)
    tokenizer.chat_template = read_chat_template(path, engine)
    return tokenizer


def check_template_mode(path: str | Path | None, chat: bool) -> None:
    """DataError when a template file `path` is given for plain text (chat=False: rendered
    without a template), so that a stage refuses it before loading anything."""
    if path and not chat:
        raise DataError(
            f"--chat-template {path} with --no-chat: plain text is rendered without a chat "
            "template; drop one of them"
        )
