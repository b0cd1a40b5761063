"""Training data: read chats or texts, render them with the target's tokenizer, mask the loss.

Inputs (`read_records`):
- JSONL, one object per line: OpenAI `{"messages": [{"role", "content"}, ...]}`, ShareGPT
  `{"conversations": [{"from": "human"|"gpt"|"system", "value"}, ...]}`, or, for base models
  (`chat=False`), `{"text": ...}` or `{"prompt": ..., "completion": ...}`;
- a directory written by `datasets.Dataset.save_to_disk` with the same columns;
- any other file: plain text, documents separated by blank lines.

Rendering (`render_chat`) uses the tokenizer's own chat template, so no template is written here.
The assistant loss mask comes from character spans: for assistant message i, the chat rendered up
to message i with the generation prompt must be a prefix of the full rendering, and so must the
chat rendered through message i; the characters between those two prefixes are the assistant
turn (its content and the template's end-of-turn marker). Tokens of the full rendering whose
character span overlaps an assistant span get loss_mask = 1. Templates that rewrite earlier turns
once later turns exist (not prefix-stable) are refused for that chat, never approximated.

Label alignment (FC-07, DESIGN.md §2): at draft position t, step k, the drafter predicts token
x_{t+2+k}, and the target distribution it matches is the target's logits at position t+1+k. So the
first assistant token x_a is the label of draft position a-2 at step 0, predicted from the target's
logits at the last prompt position a-1. `draft_loss_mask` applies that shift.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

CHAT_ROLES = ("system", "user", "assistant", "tool")
SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                  "system": "system", "tool": "tool"}


class DataError(ValueError):
    """A bad input record or file; the message names the file, the line and the fix."""


class BadRecord(DataError):
    """One bad record, which skip_bad=True would skip and count (the message names its file and
    line). Commands with --skip-bad say so when they report it."""


NO_CHAT_HINT = "for text records pass --no-chat (capture, regenerate, train --online)"
NO_TEMPLATE = "the tokenizer has no chat template: for a base model pass --no-chat (capture, regenerate, " \
              "train --online), or give a tokenizer with a chat template"
SLOW_TOKENIZER = ("a fast (Rust) tokenizer is needed for character offsets; load the target's "
                  "tokenizer with use_fast=True")


@dataclass(frozen=True)
class Sample:
    """One tokenized training sequence.

    input_ids: token ids (length T). loss_mask: T ints in {0, 1}; 1 = the token belongs to an
    assistant turn (chat) or to the continuation (no-chat), i.e. it is a label to predict.
    """

    input_ids: list[int]
    loss_mask: list[int]

    def __post_init__(self) -> None:
        if len(self.input_ids) != len(self.loss_mask):
            raise ValueError(f"Sample: {len(self.input_ids)} input_ids but "
                             f"{len(self.loss_mask)} loss_mask entries")

    def truncated(self, max_length: int) -> Sample:
        """The first `max_length` tokens (self when already short enough)."""
        if len(self.input_ids) <= max_length:
            return self
        return Sample(self.input_ids[:max_length], self.loss_mask[:max_length])


@dataclass(frozen=True)
class RenderInfo:
    """How samples were rendered: stored in the manifest and the capture index (FC-08).

    template_hash: `template_hash(tokenizer)` (None in no-chat mode). kwargs: the extra
    `apply_chat_template` keyword arguments (e.g. {"enable_thinking": False}). chat: False
    for the plain-text mode.
    """

    template_hash: str | None
    kwargs: dict[str, Any] = field(default_factory=dict)
    chat: bool = True

    def to_dict(self) -> dict[str, Any]:
        return {"hash": self.template_hash, "kwargs": dict(self.kwargs), "chat": self.chat}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RenderInfo:
        return cls(d.get("hash"), dict(d.get("kwargs") or {}), bool(d.get("chat", True)))


@dataclass(frozen=True)
class Record:
    """One input example before tokenization, with where it came from ("file:line").

    Chat records have `messages` (dicts with role and content); text records have `text` (the
    continuation, supervised) and `prompt` (context, not supervised; "" for whole documents).
    """

    source: str
    messages: tuple[dict[str, str], ...] | None = None
    prompt: str = ""
    text: str = ""


@dataclass(frozen=True)
class Records:
    """Records read from `path`; `num_skipped` bad ones were skipped (skip_bad=True)."""

    path: Path
    records: list[Record]
    num_skipped: int = 0
    chat: bool = True


@dataclass(frozen=True)
class SampleSet:
    """Rendered samples, how they were rendered, and how many inputs were skipped."""

    samples: list[Sample]
    render_info: RenderInfo
    num_skipped: int = 0


# ---------------------------------------------------------------------------------------------
# Reading

def read_records(path: str | Path, *, chat: bool = True, skip_bad: bool = False,
                 require_assistant: bool = True) -> Records:
    """Read chat (chat=True) or text (chat=False) records from a JSONL file, a `save_to_disk`
    directory, or a plain-text file (documents separated by blank lines; chat=False only).

    require_assistant=False accepts chats without an assistant turn (prompts to regenerate).
    Raises DataError naming the file and line for a bad record (bad JSON, unknown role, empty
    content, no assistant turn, wrong fields) unless skip_bad=True (then it is counted), and
    for an empty dataset.
    """
    path = Path(path)
    if not path.exists():
        raise DataError(f"{path}: no such file or directory")
    if path.is_dir():
        rows = _dataset_rows(path)
    elif path.suffix in (".jsonl", ".json"):
        rows = _jsonl_rows(path)
    elif chat:
        raise DataError(f"{path} is plain text, not chats: pass --no-chat (or give a .jsonl file of "
                        f"'messages' or 'conversations' chats)")
    else:
        rows = _text_rows(path)
    records, num_skipped, other_mode = [], 0, None
    for source, row in rows:
        try:
            records.append(_to_record(source, row, chat, require_assistant))
        except DataError:
            other_mode = other_mode or _other_mode(row, chat)
            if not skip_bad:
                # records of the other mode all through (e.g. regenerate --no-chat's output): one line
                if not records and other_mode and all(_other_mode(r, chat) or isinstance(r, _BadRow)
                                                      for _, r in rows):
                    raise DataError(_mode_hint(path, other_mode)) from None
                raise
            num_skipped += 1
    if not records:
        if other_mode:  # every record skipped, and (some of) them for the mode: say so, not "empty"
            raise DataError(_mode_hint(path, other_mode))
        raise DataError(f"{path}: no usable records ({num_skipped} skipped); "
                        f"the dataset is empty")
    return Records(path, records, num_skipped, chat)


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
    """"bad JSON (<reason> at column N)" for one JSONL line (json's reason may end in " at");
    "at the end of the line" where json ran past the line's content into its newline."""
    where = "the end of the line" if e.lineno > 1 else f"column {e.colno}"
    return f"bad JSON ({e.msg.removesuffix(' at')} at {where})"


def _jsonl_rows(path: Path) -> Iterable[tuple[str, Any]]:
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, start=1):
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
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, start=1):
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
            raise DataError(f"{path}: DatasetDict without a 'train' split (splits: "
                            f"{', '.join(ds)}); save the split to use on its own")
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
        raise _bad(source, f"expected a JSON object, got {type(row).__name__}",
                   "write one JSON object per line")
    if chat:
        return Record(source, messages=_chat_messages(source, row, require_assistant))
    if isinstance(row.get("text"), str) and row["text"].strip():
        return Record(source, text=row["text"])
    if isinstance(row.get("completion"), str) and row["completion"].strip():
        prompt = row.get("prompt", "")
        if not isinstance(prompt, str):
            raise _bad(source, "'prompt' is not a string", "give the prompt as a string")
        return Record(source, prompt=prompt, text=row["completion"])
    raise _bad(source, "no non-empty 'text' or 'completion' field",
               "give {\"text\": ...} or {\"prompt\": ..., \"completion\": ...}")


def _chat_messages(source: str, row: dict, require_assistant: bool) -> tuple[dict[str, str], ...]:
    if "messages" in row:
        turns = [(m.get("role"), m.get("content")) if isinstance(m, dict) else (None, None)
                 for m in row["messages"] or []]
        known = CHAT_ROLES
    elif "conversations" in row:
        turns = [(SHAREGPT_ROLES.get(m.get("from")), m.get("value")) if isinstance(m, dict)
                 else (None, None) for m in row["conversations"] or []]
        known = tuple(SHAREGPT_ROLES)
    else:
        raise _bad(source, "no 'messages' or 'conversations' field",
                   "give OpenAI {\"messages\": [{\"role\", \"content\"}]} or ShareGPT "
                   f"{{\"conversations\": [{{\"from\", \"value\"}}]}}, or {NO_CHAT_HINT}")
    if not turns:
        raise _bad(source, "empty conversation", "remove the line")
    for i, (role, content) in enumerate(turns):
        if role not in CHAT_ROLES:
            raise _bad(source, f"turn {i} has an unknown role", f"use one of {', '.join(known)}")
        if not isinstance(content, str) or (role == "assistant" and not content.strip()):
            raise _bad(source, f"turn {i} ({role}) has empty or non-string content",
                       "give every turn text content")
    if require_assistant and not any(role == "assistant" for role, _ in turns):
        raise _bad(source, "no assistant turn (nothing to learn)",
                   "add the assistant's answer, or regenerate it with `specdraft regenerate`")
    return tuple({"role": role, "content": content} for role, content in turns)


# ---------------------------------------------------------------------------------------------
# Rendering

def template_hash(tokenizer) -> str | None:
    """sha256 (hex) of the tokenizer's chat template text (a dict of named templates is hashed
    as sorted JSON); None when the tokenizer has no chat template."""
    template = getattr(tokenizer, "chat_template", None)
    if not template:
        return None
    if not isinstance(template, str):
        template = json.dumps(template, sort_keys=True)
    return hashlib.sha256(template.encode("utf-8")).hexdigest()


def tokenizer_fingerprint(tokenizer) -> dict[str, Any]:
    """What must match between training and serving tokenizers: dict(vocab_hash (sha256 of the
    sorted token -> id map, added tokens included), bos_id, eos_ids (list), pad_id, length)."""
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: (kv[1], kv[0]))
    vocab_hash = hashlib.sha256(json.dumps(vocab, ensure_ascii=False).encode("utf-8")).hexdigest()
    eos = tokenizer.eos_token_id
    eos_ids = sorted(eos) if isinstance(eos, (list, tuple)) else ([] if eos is None else [eos])
    return {"vocab_hash": vocab_hash, "bos_id": tokenizer.bos_token_id, "eos_ids": eos_ids,
            "pad_id": tokenizer.pad_token_id, "length": len(tokenizer)}


def _render(tokenizer, messages, add_generation_prompt: bool, kwargs: dict) -> str:
    return tokenizer.apply_chat_template(list(messages), tokenize=False,
                                         add_generation_prompt=add_generation_prompt, **kwargs)


def assistant_char_spans(tokenizer, messages: Sequence[dict[str, str]],
                         template_kwargs: dict | None = None) -> tuple[str, list[tuple[int, int]]]:
    """Render `messages` with the chat template; return (text, [(start, end) char spans of each
    assistant turn]). Raises DataError when the template is not prefix-stable for this chat."""
    kwargs = dict(template_kwargs or {})
    if not getattr(tokenizer, "chat_template", None):
        raise DataError(NO_TEMPLATE)
    full = _render(tokenizer, messages, False, kwargs)
    spans = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        before = _render(tokenizer, messages[:i], True, kwargs)
        through = _render(tokenizer, messages[: i + 1], False, kwargs)
        if not (full.startswith(before) and full.startswith(through) and len(before) <= len(through)):
            raise DataError(f"the chat template renders message {i} differently once later turns "
                            f"exist (not prefix-stable), so the assistant span cannot be located "
                            f"exactly; split the chat into one record per assistant turn")
        spans.append((len(before), len(through)))
    return full, spans


def _mask_from_spans(tokenizer, text: str, spans: list[tuple[int, int]], add_special: bool,
                     first_supervised: int = 0) -> Sample:
    if not getattr(tokenizer, "is_fast", False):
        raise DataError(SLOW_TOKENIZER)
    enc = tokenizer(text, add_special_tokens=add_special, return_offsets_mapping=True)
    ids, offsets = list(enc["input_ids"]), enc["offset_mapping"]
    mask = []
    for t, (s, e) in enumerate(offsets):
        # Overlap, not containment: a token merging template text with the turn's first
        # character is a label of the turn. A zero-width token (BOS/EOS added by the tokenizer)
        # takes the previous token's mask: a leading BOS is context, an appended EOS a label.
        if s == e:
            inside = bool(mask) and mask[-1] == 1
        else:
            inside = any(s < b and e > a for a, b in spans)
        mask.append(int(inside and t >= first_supervised))
    return Sample(ids, mask)


def render_chat(tokenizer, messages: Sequence[dict[str, str]],
                template_kwargs: dict | None = None) -> Sample:
    """Tokenize a chat with the tokenizer's chat template (no extra special tokens, as
    `apply_chat_template(tokenize=True)` does); loss_mask = 1 on assistant-turn tokens.

    Raises DataError (no chat template, slow tokenizer, template not prefix-stable)."""
    text, spans = assistant_char_spans(tokenizer, messages, template_kwargs)
    return _mask_from_spans(tokenizer, text, spans, add_special=False)


def render_text(tokenizer, text: str, prompt: str = "") -> Sample:
    """Tokenize prompt + text as one document with the tokenizer's special tokens (e.g. BOS);
    loss_mask = 1 on the tokens of `text` (the continuation), never on the first token (it has
    no context). With prompt="" that is every token after the first."""
    full = prompt + text
    return _mask_from_spans(tokenizer, full, [(len(prompt), len(full))], add_special=True,
                            first_supervised=1)


def check_chat_template(tokenizer, records: Records) -> None:
    """Raise DataError (NO_TEMPLATE, naming the file) when `records` hold chats and `tokenizer`
    has no chat template to render them."""
    has_chats = any(r.messages is not None for r in records.records)
    if has_chats and not getattr(tokenizer, "chat_template", None):
        raise DataError(f"{records.path}: {NO_TEMPLATE}")


def skipped_line(num_skipped: int, path) -> str:
    """What --skip-bad commands print when they skipped records: "skipped 2 bad records in x.jsonl"."""
    return f"skipped {num_skipped} bad record{'' if num_skipped == 1 else 's'} in {path}"


def render_records(tokenizer, records: Records, *, template_kwargs: dict | None = None,
                   skip_bad: bool = False) -> SampleSet:
    """Render every record (chat records with the template, text records as documents).

    Raises DataError for a tokenizer that renders no record (no chat template for chats, a slow
    tokenizer), and BadRecord naming the record's file and line when one cannot be rendered,
    unless skip_bad=True (then it is counted in `num_skipped`, with the records skipped on
    reading)."""
    kwargs = dict(template_kwargs or {})
    samples, num_skipped = [], records.num_skipped
    chat = records.chat
    check_chat_template(tokenizer, records)
    if not getattr(tokenizer, "is_fast", False):
        raise DataError(f"{records.path}: {SLOW_TOKENIZER}")
    for r in records.records:
        try:
            if r.messages is not None:
                samples.append(render_chat(tokenizer, r.messages, kwargs))
            else:
                samples.append(render_text(tokenizer, r.text, r.prompt))
        except DataError as e:
            if not skip_bad:
                raise BadRecord(f"{r.source}: {e}") from e
            num_skipped += 1
    if not samples:
        raise DataError(f"{records.path}: no record could be rendered; the dataset is empty")
    info = RenderInfo(template_hash(tokenizer) if chat else None, kwargs if chat else {}, chat)
    return SampleSet(samples, info, num_skipped)


def load_dataset(path: str | Path, tokenizer, *, chat: bool = True,
                 template_kwargs: dict | None = None, skip_bad: bool = False) -> SampleSet:
    """`read_records` then `render_records`: the samples of one file or directory."""
    records = read_records(path, chat=chat, skip_bad=skip_bad)
    return render_records(tokenizer, records, template_kwargs=template_kwargs, skip_bad=skip_bad)


def render_parity(tokenizer, chats: Iterable[Sequence[dict[str, str]]], kwargs_a: dict,
                  kwargs_b: dict) -> list[str]:
    """Render each chat with template kwargs `kwargs_a` (e.g. the manifest's) and `kwargs_b`
    (e.g. the server's) and list every difference in token ids (FC-08); [] means parity.

    Both the full chat and the serving prompt (messages before the last assistant turn, with the
    generation prompt) are compared; each difference names the chat, the part and the first
    differing token."""
    diffs = []
    for n, messages in enumerate(chats):
        messages = list(messages)
        last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"),
                    default=len(messages))
        parts = {"full chat": (messages, False), "prompt": (messages[:last], True)}
        for part, (msgs, gen) in parts.items():
            a = tokenizer(_render(tokenizer, msgs, gen, kwargs_a), add_special_tokens=False)
            b = tokenizer(_render(tokenizer, msgs, gen, kwargs_b), add_special_tokens=False)
            diff = _first_difference(tokenizer, a["input_ids"], b["input_ids"])
            if diff:
                diffs.append(f"chat {n} ({part}): {diff}")
    return diffs


def _first_difference(tokenizer, a: list[int], b: list[int]) -> str | None:
    if a == b:
        return None
    t = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    show = lambda ids: repr(tokenizer.decode(ids[t:t + 3])) if t < len(ids) else "end"  # noqa: E731
    return f"{len(a)} vs {len(b)} tokens, first difference at token {t}: {show(a)} vs {show(b)}"


# ---------------------------------------------------------------------------------------------
# Label alignment (FC-07)

def label_position(t: int, step: int) -> int:
    """The token position whose id is the label of draft position t at step k: t + 2 + k."""
    return t + 2 + step


def target_logit_position(t: int, step: int) -> int:
    """The target position whose logits are the distribution that draft position t at step k
    matches: t + 1 + k (the target's next-token prediction for token t + 2 + k)."""
    return t + 1 + step


def draft_loss_mask(loss_mask: torch.Tensor, step: int) -> torch.Tensor:
    """Which draft positions are supervised at draft step `step` (0 = first step).

    loss_mask: [B, T] bool (or 0/1), 1 = token is a label (assistant / continuation).
    Returns [B, T] bool: out[b, t] = loss_mask[b, t + 2 + step], False where t + 2 + step >= T.
    """
    if step < 0:
        raise ValueError(f"draft_loss_mask: step {step} must be >= 0")
    mask = loss_mask.bool()
    shift = 2 + step
    out = torch.zeros_like(mask)
    if shift < mask.shape[1]:
        out[:, : mask.shape[1] - shift] = mask[:, shift:]
    return out


def check_has_supervision(loss_mask: torch.Tensor) -> None:
    """Raise ValueError if no draft position of the batch has a label at step 0.

    loss_mask: [B, T] bool. A batch whose labels are all outside assistant turns (or whose
    sequences are shorter than 3 tokens) would train on nothing and report a 0/0 accuracy."""
    if not bool(draft_loss_mask(loss_mask, 0).any()):
        raise ValueError(
            f"batch of {loss_mask.shape[0]} sequences has no supervised token: no position t+2 "
            f"(label of draft position t) is in an assistant turn; check the loss mask / chat "
            f"template, or drop samples without assistant tokens (or shorter than 3 tokens)")


# ---------------------------------------------------------------------------------------------
# Draft vocabulary and data identity

def token_counts(samples: Iterable[Sample], vocab_size: int) -> torch.Tensor:
    """How often each target token id is a label: LongTensor [vocab_size] counting loss-masked
    tokens only (the input to `conventions.build_vocab_map`). Raises ValueError for an id
    outside 0..vocab_size-1 (tokenizer and target disagree)."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for s in samples:
        ids = torch.tensor(s.input_ids, dtype=torch.long)[torch.tensor(s.loss_mask, dtype=torch.bool)]
        if ids.numel() and (int(ids.max()) >= vocab_size or int(ids.min()) < 0):
            raise ValueError(f"token id {int(ids.max())} outside the target vocabulary of "
                             f"{vocab_size}: the tokenizer does not belong to this target")
        counts += torch.bincount(ids, minlength=vocab_size)
    return counts


def data_hash(samples: Iterable[Sample]) -> str:
    """sha256 (hex) over every sample's input_ids (int64) and loss_mask (uint8), lengths included,
    in order: keys a vocab map or capture store to exactly this data."""
    h = hashlib.sha256()
    for s in samples:
        h.update(len(s.input_ids).to_bytes(8, "little"))
        h.update(torch.tensor(s.input_ids, dtype=torch.int64).numpy().tobytes())
        h.update(bytes(bytearray(s.loss_mask)))
    return h.hexdigest()
