"""Samples for the doctor's offline runs: a capture store, or a JSONL of token ids, chats or texts.

- a capture store directory (index.json): its samples' input_ids and loss_mask (the stored
  hidden states are not used: the target is re-run with the layers the engine would capture);
- JSONL rows {"input_ids": [...], "loss_mask": [...]} (loss_mask optional: all ones);
- chats ({"messages"} / {"conversations"}) or texts ({"text"}), rendered by specdraft.data with
  the target's tokenizer and the manifest's chat-template kwargs, as at training.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from specdraft.data import DataError, Sample, load_dataset, read_records
from specdraft.doctor.evidence import Unavailable

MIN_TOKENS = 3  # a draft position t needs tokens t+1 and t+2


def read_samples(path: Path, tokenizer: Callable[[], Any], template_kwargs: dict[str, Any],
                 max_samples: int, max_length: int) -> list[Sample]:
    """Up to `max_samples` samples of at least 3 tokens, truncated to `max_length`.

    tokenizer: called only for chats and texts. Raises Unavailable naming the file and the
    fix for unreadable input.
    """
    try:
        if (path / "index.json").is_file():
            samples = _store_samples(path, max_samples)
        elif _first_row(path).get("input_ids") is not None:
            samples = _token_rows(path, max_samples)
        else:
            chat = any(k in _first_row(path) for k in ("messages", "conversations"))
            samples = load_dataset(path, tokenizer(), chat=chat, template_kwargs=template_kwargs).samples
    except (DataError, ValueError, OSError, KeyError) as e:
        raise Unavailable(f"--samples {path}: {e}", "give a capture store or a JSONL of "
                          "input_ids, chats or texts") from None
    samples = [s.truncated(max_length) for s in samples[:max_samples]]
    samples = [s for s in samples if len(s.input_ids) >= MIN_TOKENS]
    if not samples:
        raise Unavailable(f"--samples {path}: no sample of {MIN_TOKENS} tokens or more",
                          "give longer samples")
    return samples


def read_chats(path: Path, max_chats: int) -> list[list[dict[str, str]]]:
    """The chats in a JSONL / save_to_disk file (empty for token ids, texts or a store)."""
    if (path / "index.json").is_file() or not path.exists():
        return []
    row = _first_row(path)
    if not any(k in row for k in ("messages", "conversations")):
        return []
    try:
        records = read_records(path, chat=True).records
    except DataError as e:
        raise Unavailable(f"--samples {path}: {e}", "fix the chat file") from None
    return [list(r.messages) for r in records[:max_chats]]


def _first_row(path: Path) -> dict[str, Any]:
    if path.is_dir():
        return {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                row = json.loads(line)
                return row if isinstance(row, dict) else {}
    raise DataError(f"{path}: empty file")


def _store_samples(path: Path, max_samples: int) -> list[Sample]:
    from specdraft.capture import CaptureStore

    store = CaptureStore(path)
    out = []
    for i in range(min(max_samples, len(store))):
        row = store[i]
        out.append(Sample(row["input_ids"].tolist(), row["loss_mask"].int().tolist()))
    return out


def _token_rows(path: Path, max_samples: int) -> list[Sample]:
    out = []
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            if len(out) == max_samples:
                break
            row = json.loads(line)
            ids = row.get("input_ids")
            if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
                raise DataError(f"{path}:{line_no}: input_ids must be a list of ints")
            out.append(Sample(ids, row.get("loss_mask") or [1] * len(ids)))
    return out
