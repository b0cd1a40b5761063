"""Samples for the doctor's offline runs: a capture store, or a JSONL of token ids, chats or texts.

- a capture store directory (index.json): its samples' input_ids and loss_mask (the stored
  hidden states are not used: the target is re-run with the layers the engine would capture);
- JSONL rows {"input_ids": [...], "loss_mask": [...]} (loss_mask optional: all ones);
- chats ({"messages"} / {"conversations"}) or texts ({"text"} / {"prompt", "completion"}),
  rendered by specdraft.data with the target's tokenizer and the manifest's chat-template
  kwargs, as at training; prompts alone ({"prompt"}) are refused: nothing to score.

A file the user gave that cannot be read is a DataError naming the file and line (BadRecord for
one bad record, which skip_bad skips and counts: `SampleRead.skipped_text`), never a skip.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specdraft.data.records import BadRecord, DataError, json_line, read_records
from specdraft.data.render import DataHash, Sample, data_hash, render_records

MIN_TOKENS = 3  # a draft position t needs tokens t+1 and t+2
KINDS = "a capture store directory or a JSONL of input_ids, chats or texts"


@dataclass(frozen=True)
class SampleRead:
    """Samples read from a file, and the bad records skip_bad skipped on the way.

    num_records: records read (the whole file); num_skipped of them were bad; first_skipped: the first one's error, naming
    file:line ("" when none was skipped).
    """

    samples: list[Sample]
    num_records: int
    num_skipped: int = 0
    first_skipped: str = ""
    prompts_only: bool = False  # a suite's prompts: no target output to replay offline
    # `data.render.data_hash` of the whole file's samples, as a manifest records the data it was
    # trained on (a store's index; a chats or texts file rendered whole; token rows, every good one)
    data_hash: str | None = None

    def skipped_text(self) -> str:
        """ "skipped N of M records (first: file:line reason)"."""
        first = f" (first: {self.first_skipped})" if self.num_skipped else ""
        return f"skipped {self.num_skipped} of {self.num_records} records{first}"


def read_samples(
    path: Path,
    tokenizer: Callable[[], Any],
    template_kwargs: dict[str, Any],
    max_samples: int,
    max_length: int,
    skip_bad: bool = False,
) -> SampleRead:
    """Up to `max_samples` samples of at least 3 tokens, truncated to `max_length`.

    tokenizer: called only for chats and texts (after the file is read, so a bad file is named
    even when no tokenizer is at hand; its Unavailable passes through). Raises DataError naming
    the file (and line) for input that cannot be read or holds no usable sample, BadRecord for
    one bad record unless skip_bad (then it is skipped and counted).
    """
    suite = _suite_name(path)
    if suite is not None:
        return _suite_prompts(suite, tokenizer(), template_kwargs, max_samples, max_length)
    try:
        if (path / "index.json").is_file():
            samples, recorded = _store_samples(path, max_samples)
            read = SampleRead(samples, len(samples), data_hash=recorded)
        elif _first_row(path).get("input_ids") is not None:
            read = _token_rows(path, max_samples, skip_bad)
        else:
            read = _rendered(path, tokenizer, template_kwargs, skip_bad)
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"{path}: unreadable ({e}); give {KINDS}") from None
    samples = [s.truncated(max_length) for s in read.samples[:max_samples]]
    samples = [s for s in samples if len(s.input_ids) >= MIN_TOKENS]
    if not samples:
        raise DataError(f"{path}: no sample of {MIN_TOKENS} tokens or more; give longer samples")
    return SampleRead(
        samples, read.num_records, read.num_skipped, read.first_skipped, data_hash=read.data_hash
    )


def _rendered(
    path: Path, tokenizer: Callable[[], Any], template_kwargs: dict[str, Any], skip_bad: bool
) -> SampleRead:
    """Chats or texts rendered with the target's tokenizer (with the served chat template:
    `Evidence.tokenizer`). The first skipped record is found
    by reading (then rendering) again without skipping, only when one was skipped."""
    row = _first_row(path)
    chat = any(k in row for k in ("messages", "conversations"))
    if not chat and "prompt" in row and not any(k in row for k in ("text", "completion")):
        raise DataError(
            f"{path}: prompts without what follows them; doctor scores the drafter's guesses of "
            'the target\'s own text, so each row needs it: give {"prompt", "completion"} rows '
            '(the target\'s outputs) or {"text"} rows'
        )
    records = read_records(path, chat=chat, skip_bad=skip_bad)
    tok = tokenizer()
    if chat and not getattr(tok, "chat_template", None):
        raise DataError(
            f"{path}: chats, but the target's tokenizer has no chat template; pass the one "
            'serving uses (--chat-template FILE), or give texts ({"text": ...}) or token ids '
            '({"input_ids": [...]})'
        )
    rendered = render_records(tok, records, template_kwargs=template_kwargs, skip_bad=skip_bad)
    first = ""
    if rendered.num_skipped:
        try:
            if records.num_skipped:
                read_records(path, chat=chat)
            else:
                render_records(tok, records, template_kwargs=template_kwargs)
        except DataError as e:
            first = _reason(e)
    return SampleRead(
        rendered.samples,
        len(records.records) + records.num_skipped,
        rendered.num_skipped,
        first,
        data_hash=data_hash(rendered.samples),
    )


def _suite_name(path: Path) -> str | None:
    """The bundled suite `path` names (`bench.suites`: a name, not a file here), else None."""
    from specdraft.bench.suites import suite_names

    return str(path) if not path.exists() and str(path) in suite_names() else None


def suite_chats(name: str, max_chats: int) -> list[list[dict[str, str]]]:
    """The first turns of a bundled suite's first `max_chats` questions, as one-message chats."""
    from specdraft.bench.suites import load_suite

    return [
        [{"role": "user", "content": q.turns[0]}] for q in load_suite(name).questions[:max_chats]
    ]


def _suite_prompts(
    name: str, tok: Any, template_kwargs: dict[str, Any], max_samples: int, max_length: int
) -> SampleRead:
    """A suite's first turns rendered with the chat template and its generation prompt: prompts
    only (loss_mask all 0), for the online check; `SampleRead.prompts_only`."""
    samples = []
    for chat in suite_chats(name, max_samples):
        text = tok.apply_chat_template(
            chat, tokenize=False, add_generation_prompt=True, **template_kwargs
        )
        ids = list(tok(text, add_special_tokens=False)["input_ids"])[:max_length]
        samples.append(Sample(ids, [0] * len(ids)))
    return SampleRead(samples, len(samples), prompts_only=True)


def _reason(error: DataError) -> str:
    """A bad record's error without its fix: "file:line: reason"."""
    return str(error).split("; fix: ")[0]


def read_chats(path: Path, max_chats: int, skip_bad: bool = False) -> list[list[dict[str, str]]]:
    """The chats in a JSONL / save_to_disk file (empty for token ids, texts or a store).
    Raises DataError as `read_samples`."""
    if _suite_name(path) is not None:
        return suite_chats(str(path), max_chats)
    if (path / "index.json").is_file() or not path.exists():
        return []
    try:
        row = _first_row(path)
    except (OSError, UnicodeDecodeError) as e:  # read first: a file not UTF-8 is named here
        raise DataError(f"{path}: unreadable ({e}); give {KINDS}") from None
    if not any(k in row for k in ("messages", "conversations")):
        return []
    records = read_records(path, chat=True, skip_bad=skip_bad).records
    return [list(r.messages) for r in records[:max_chats]]


def _first_row(path: Path) -> dict[str, Any]:
    if path.is_dir():
        return {}
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, start=1):
            if line.strip():
                fix = f"give {KINDS}, one JSON object per line"
                row = json_line(line, DataError, f"{path}:{line_no}", fix)
                return row if isinstance(row, dict) else {}
    raise DataError(f"{path}: empty file; give {KINDS}")


def _store_samples(path: Path, max_samples: int) -> tuple[list[Sample], str | None]:
    """The store's first `max_samples` samples, and the data_hash its index records."""
    from specdraft.capture.store import CaptureStore

    store = CaptureStore(path)
    out = []
    for i in range(min(max_samples, len(store))):
        row = store[i]
        out.append(Sample(row["input_ids"].tolist(), row["loss_mask"].int().tolist()))
    return out, store.meta.get("data_hash")


def _token_rows(path: Path, max_samples: int, skip_bad: bool) -> SampleRead:
    """The first `max_samples` good rows, and the `data_hash` of every good row of the file: rows
    holding exactly the samples a store or training run hashed (ids and loss masks, in order,
    all of them) are recognised as that data."""
    out, num_rows, num_skipped, first, hashed = [], 0, 0, "", DataHash()
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            num_rows += 1
            try:
                sample = _token_row(line, f"{path}:{line_no}")
            except BadRecord as e:
                if not skip_bad:
                    raise
                num_skipped, first = num_skipped + 1, first or _reason(e)
                continue
            hashed.update(sample)
            if len(out) < max_samples:
                out.append(sample)
    if not out:
        raise DataError(f"{path}: no usable row (every one was skipped)")
    return SampleRead(out, num_rows, num_skipped, first, data_hash=hashed.hexdigest())


def _token_row(line: str, source: str) -> Sample:
    """One {"input_ids", "loss_mask"?} row; BadRecord naming `source` (file:line) otherwise."""
    row = json_line(line, BadRecord, source, "fix: write one JSON object per line")
    ids = row.get("input_ids") if isinstance(row, dict) else None
    if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
        raise BadRecord(
            f"{source}: input_ids must be a list of ints; fix: give every row "
            '{"input_ids": [...], "loss_mask": [...]} (loss_mask optional)'
        )
    mask = row.get("loss_mask") or [1] * len(ids)
    if not isinstance(mask, list) or len(mask) != len(ids) or not all(m in (0, 1) for m in mask):
        raise BadRecord(
            f"{source}: loss_mask must be {len(ids)} zeros and ones, one per input id; "
            "fix: give it per token, or leave it out (all ones)"
        )
    return Sample(ids, mask)
