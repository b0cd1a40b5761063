"""Rendering: records to tokenized `Sample`s with assistant loss masks, and the fingerprints of
how they were rendered.

`render_chat` uses the tokenizer's own chat template, so no template is written here. Where
each assistant turn is in the rendered chat (character spans; one text per turn for templates
that rewrite earlier turns, served turns for think blocks): `turns`. Tokens whose character span
overlaps an assistant span get loss_mask = 1. Nothing is approximated.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from specdraft.data.reasoning import reasoning_kwargs
from specdraft.data.records import BadRecord, DataError, Records, read_records, served_messages
from specdraft.data.template import template_fingerprint
from specdraft.data.turns import NO_TEMPLATE, assistant_char_spans, render_template

SLOW_TOKENIZER = (
    "a fast (Rust) tokenizer is needed for character offsets; load the target's "
    "tokenizer with use_fast=True"
)


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
            raise ValueError(
                f"Sample: {len(self.input_ids)} input_ids but "
                f"{len(self.loss_mask)} loss_mask entries"
            )

    def truncated(self, max_length: int) -> Sample:
        """The first `max_length` tokens (self when already short enough)."""
        if len(self.input_ids) <= max_length:
            return self
        return Sample(self.input_ids[:max_length], self.loss_mask[:max_length])


@dataclass(frozen=True)
class RenderInfo:
    """How samples were rendered: stored in the manifest and the capture index (FC-08).

    template_hash: `template_hash(tokenizer)` (None in no-chat mode). kwargs: the extra
    `apply_chat_template` keyword arguments rendered with (e.g. {"enable_thinking": False},
    the non-thinking switch included with --reasoning drop). chat: False for the plain-text
    mode. reasoning: "keep" or "drop" (`specdraft.data.reasoning`).
    """

    template_hash: str | None
    kwargs: dict[str, Any] = field(default_factory=dict)
    chat: bool = True
    reasoning: str = "keep"

    def to_dict(self) -> dict[str, Any]:
        return {
            "hash": self.template_hash,
            "kwargs": dict(self.kwargs),
            "chat": self.chat,
            "reasoning": self.reasoning,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RenderInfo:
        return cls(
            d.get("hash"),
            dict(d.get("kwargs") or {}),
            bool(d.get("chat", True)),
            d.get("reasoning", "keep"),
        )


@dataclass(frozen=True)
class SampleSet:
    """Rendered samples, how they were rendered, and how many inputs were skipped."""

    samples: list[Sample]
    render_info: RenderInfo
    num_skipped: int = 0


def template_hash(tokenizer) -> str | None:
    """`template.template_fingerprint` of the tokenizer's chat template (None without one)."""
    return template_fingerprint(getattr(tokenizer, "chat_template", None))


def tokenizer_fingerprint(tokenizer) -> dict[str, Any]:
    """What must match between training and serving tokenizers: dict(vocab_hash (sha256 of the
    sorted token -> id map, added tokens included), bos_id, eos_ids (list), pad_id, length)."""
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: (kv[1], kv[0]))
    vocab_hash = hashlib.sha256(json.dumps(vocab, ensure_ascii=False).encode("utf-8")).hexdigest()
    eos = tokenizer.eos_token_id
    eos_ids = sorted(eos) if isinstance(eos, (list, tuple)) else ([] if eos is None else [eos])
    return {
        "vocab_hash": vocab_hash,
        "bos_id": tokenizer.bos_token_id,
        "eos_ids": eos_ids,
        "pad_id": tokenizer.pad_token_id,
        "length": len(tokenizer),
    }


def tokenizer_changes(recorded: dict[str, Any] | None, tokenizer) -> list[str]:
    """What differs between a recorded `tokenizer_fingerprint` (a manifest's) and `tokenizer`'s:
    "key recorded -> now" per field, hashes cut to 12 characters; [] when nothing was recorded."""
    if not recorded:
        return []
    now = tokenizer_fingerprint(tokenizer)

    def short(key, value):
        return value[:12] if key == "vocab_hash" and isinstance(value, str) else value

    return [
        f"{key} {short(key, value)} -> {short(key, now.get(key))}"
        for key, value in recorded.items()
        if now.get(key) != value
    ]


def prompt_ids(tokenizer, prompt: str | list[dict]) -> list[int]:
    """The token ids a server runs for a prompt: a text as the tokenizer encodes it, a chat (a
    list of messages) rendered with the chat template, generation prompt added."""
    if isinstance(prompt, str):
        return list(tokenizer(prompt)["input_ids"])
    return list(
        tokenizer(render_template(tokenizer, prompt, True, {}), add_special_tokens=False)[
            "input_ids"
        ]
    )


def _encode(tokenizer, text: str, add_special: bool, split: int | None):
    """(ids, character offsets into `text`): `text` tokenized whole, or as text[:split] then
    text[split:] (offsets of the second part shifted by `split`)."""
    if split is None:
        enc = tokenizer(text, add_special_tokens=add_special, return_offsets_mapping=True)
        return list(enc["input_ids"]), list(enc["offset_mapping"])
    head_ids, head_offsets = _encode(tokenizer, text[:split], add_special, None)
    tail_ids, tail_offsets = _encode(tokenizer, text[split:], False, None)
    return head_ids + tail_ids, head_offsets + [(s + split, e + split) for s, e in tail_offsets]


def _mask_from_spans(
    tokenizer,
    text: str,
    spans: list[tuple[int, int]],
    add_special: bool,
    first_supervised: int = 0,
    split: int | None = None,
) -> Sample:
    if not getattr(tokenizer, "is_fast", False):
        raise DataError(SLOW_TOKENIZER)
    ids, offsets = _encode(tokenizer, text, add_special, split)
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


def render_chat(
    tokenizer, messages: Sequence[dict[str, Any]], template_kwargs: dict | None = None, **given: Any
) -> list[Sample]:
    """Tokenize a chat with the tokenizer's chat template (no extra special tokens, as
    `apply_chat_template(tokenize=True)` does); loss_mask = 1 on the assistant turns' tokens
    (their reasoning, answer and tool calls as rendered; tool results are context). One Sample,
    or one per assistant turn for templates that rewrite history (`assistant_char_spans`, whose
    keywords `given` are: tools, reasoning).

    Raises DataError (no chat template, slow tokenizer, reasoning the template cannot render,
    template not prefix-stable)."""
    rendering = assistant_char_spans(tokenizer, messages, template_kwargs, **given)
    return [
        _mask_from_spans(tokenizer, text, spans, add_special=False, split=split)
        for text, spans, split in zip(rendering.texts, rendering.spans, rendering.splits)
    ]


def render_text(tokenizer, text: str, prompt: str = "") -> Sample:
    """Tokenize prompt + text as one document with the tokenizer's special tokens (e.g. BOS);
    loss_mask = 1 on the tokens of `text` (the continuation), never on the first token (it has
    no context). With prompt="" that is every token after the first."""
    full = prompt + text
    return _mask_from_spans(
        tokenizer, full, [(len(prompt), len(full))], add_special=True, first_supervised=1
    )


def check_chat_template(tokenizer, records: Records) -> None:
    """Raise DataError (NO_TEMPLATE, naming the file) when `records` hold chats and `tokenizer`
    has no chat template to render them."""
    has_chats = any(r.messages is not None for r in records.records)
    if has_chats and not getattr(tokenizer, "chat_template", None):
        raise DataError(f"{records.path}: {NO_TEMPLATE}")


def render_records(
    tokenizer,
    records: Records,
    *,
    template_kwargs: dict | None = None,
    skip_bad: bool = False,
    reasoning: str = "keep",
) -> SampleSet:
    """Render every record (chat records with the template, text records as documents).
    reasoning: "keep" trains the assistants' reasoning as the template renders it, "drop" renders
    without it, with the template's non-thinking switch (`specdraft.data.reasoning`).

    Raises DataError for a tokenizer that renders no record (no chat template for chats, a slow
    tokenizer), and BadRecord naming the record's file and line when one cannot be rendered,
    unless skip_bad=True (then it is counted in `num_skipped`, with the records skipped on
    reading)."""
    samples, num_skipped = [], records.num_skipped
    chat = records.chat
    check_chat_template(tokenizer, records)
    kwargs = reasoning_kwargs(tokenizer, dict(template_kwargs or {}), reasoning) if chat else {}
    if not getattr(tokenizer, "is_fast", False):
        raise DataError(f"{records.path}: {SLOW_TOKENIZER}")
    for r in records.records:
        try:
            if r.messages is not None:
                samples.extend(
                    render_chat(tokenizer, r.messages, kwargs, tools=r.tools, reasoning=reasoning)
                )
            else:
                samples.append(render_text(tokenizer, r.text, r.prompt))
        except DataError as e:
            if not skip_bad:
                raise BadRecord(f"{r.source}: {e}") from e
            num_skipped += 1
    if not samples:
        raise DataError(f"{records.path}: no record could be rendered; the dataset is empty")
    info = RenderInfo(
        template_hash(tokenizer) if chat else None, kwargs, chat, reasoning if chat else "keep"
    )
    return SampleSet(samples, info, num_skipped)


def load_dataset(
    path: str | Path,
    tokenizer,
    *,
    chat: bool = True,
    template_kwargs: dict | None = None,
    skip_bad: bool = False,
    reasoning: str = "keep",
) -> SampleSet:
    """`read_records` then `render_records`: the samples of one file or directory."""
    records = read_records(path, chat=chat, skip_bad=skip_bad)
    return render_records(
        tokenizer, records, template_kwargs=template_kwargs, skip_bad=skip_bad, reasoning=reasoning
    )


@dataclass(frozen=True)
class Rendering:
    """How a stage renders its data file (`load_dataset`'s settings, from capture's and online
    training's options): chat (False: plain text), the chat template's kwargs, skip_bad (skip and
    count bad records instead of refusing the file), reasoning ("keep" | "drop"), chat_template (a
    Jinja file replacing the tokenizer's template, `data.template`; applied by the loaders that
    open the tokenizer)."""

    chat: bool = True
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    skip_bad: bool = False
    reasoning: str = "keep"
    chat_template: str | None = None

    @classmethod
    def of(cls, settings: Any) -> Rendering:
        """The rendering a stage's settings name (capture's `CaptureConfig`, online training's
        `OnlineSource`: their chat, template_kwargs, skip_bad, reasoning and chat_template fields)."""
        return cls(
            settings.chat,
            settings.template_kwargs,
            settings.skip_bad,
            settings.reasoning,
            settings.chat_template,
        )

    def load(self, path: str | Path, tokenizer) -> SampleSet:
        """The samples of `path` rendered with `tokenizer` so (`load_dataset`)."""
        return load_dataset(
            path,
            tokenizer,
            chat=self.chat,
            template_kwargs=self.template_kwargs,
            skip_bad=self.skip_bad,
            reasoning=self.reasoning,
        )


def render_parity(
    tokenizer, chats: Iterable[Sequence[dict[str, str]]], kwargs_a: dict, kwargs_b: dict
) -> list[str]:
    """Render each chat with template kwargs `kwargs_a` (e.g. the manifest's) and `kwargs_b`
    (e.g. the server's) and list every difference in token ids (FC-08); [] means parity.

    Both the full chat and the serving prompt (messages before the last assistant turn, with the
    generation prompt) are compared; each difference names the chat, the part and the first
    differing token."""
    diffs = []
    for n, messages in enumerate(chats):
        messages = list(messages)
        parts = {"full chat": (messages, False), "prompt": (served_messages(messages), True)}
        for part, (msgs, gen) in parts.items():
            a = tokenizer(render_template(tokenizer, msgs, gen, kwargs_a), add_special_tokens=False)
            b = tokenizer(render_template(tokenizer, msgs, gen, kwargs_b), add_special_tokens=False)
            diff = _first_difference(tokenizer, a["input_ids"], b["input_ids"])
            if diff:
                diffs.append(f"chat {n} ({part}): {diff}")
    return diffs


def _first_difference(tokenizer, a: list[int], b: list[int]) -> str | None:
    if a == b:
        return None
    t = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    show = lambda ids: repr(tokenizer.decode(ids[t : t + 3])) if t < len(ids) else "end"  # noqa: E731
    return f"{len(a)} vs {len(b)} tokens, first difference at token {t}: {show(a)} vs {show(b)}"


class DataHash:
    """`data_hash` taken sample by sample (`update`), for data read as a stream."""

    def __init__(self) -> None:
        self._sha = hashlib.sha256()

    def update(self, s: Sample) -> None:
        self._sha.update(len(s.input_ids).to_bytes(8, "little"))
        self._sha.update(torch.tensor(s.input_ids, dtype=torch.int64).numpy().tobytes())
        self._sha.update(bytes(bytearray(s.loss_mask)))

    def hexdigest(self) -> str:
        return self._sha.hexdigest()


def data_hash(samples: Iterable[Sample]) -> str:
    """sha256 (hex) over every sample's input_ids (int64) and loss_mask (uint8), lengths included,
    in order: keys a vocab map or capture store to exactly this data."""
    h = DataHash()
    for s in samples:
        h.update(s)
    return h.hexdigest()
