"""serve's TextStream: incremental detokenization with stop strings. Each push decodes a short
window of recent ids after a few ids of context (not the whole output again), also inside long
runs of byte ids (characters spelled in bytes, bytes that never form a character), and
everything it releases joined is the whole output's decode cut before the first stop string."""

from __future__ import annotations

import random
from typing import Any

import pytest

from specdraft.engine.requests import CONTEXT_TOKENS, decode_continuation
from specdraft.serve.text_stream import MAX_WINDOW, TextStream
from specdraft.stories260k import (
    TOKENIZER_FILE,
    build_tokenizer,
    bundled_dir,
    read_llama2c_tokenizer,
)


class OldTextStream:
    """TextStream as it was before it became incremental (decodes all ids on every push): the
    reference for the randomized test."""

    def __init__(self, tokenizer: Any, stop: tuple[str, ...], prompt_ids: list[int]) -> None:
        self.tokenizer, self.stop, self.prompt_ids = tokenizer, stop, prompt_ids
        self.ids: list[int] = []
        self.sent = 0

    def text(self) -> tuple[str, bool]:
        text = decode_continuation(
            self.tokenizer, self.prompt_ids, self.ids, skip_special_tokens=True
        )
        cuts = [text.find(s) for s in self.stop if s in text]
        return (text[: min(cuts)], True) if cuts else (text, False)

    def push(self, ids: list[int]) -> str:
        self.ids += ids
        text, stopped = self.text()
        safe = len(text)
        if not stopped:
            hold = max(
                (n for s in self.stop for n in range(1, len(s)) if text.endswith(s[:n])), default=0
            )
            safe -= hold
            while safe > self.sent and text[safe - 1] == "\ufffd":
                safe -= 1
        out = text[self.sent : safe] if safe > self.sent else ""
        self.sent = max(self.sent, safe)
        return out

    def finish(self) -> str:
        text, _ = self.text()
        out, self.sent = text[self.sent :], len(text)
        return out


class CountingTokenizer:
    """Records how many ids each decode call gets. Decodes as `inner` does; without one, word i
    decodes to " w{i}", the first word of a decode without its space (SentencePiece-like)."""

    def __init__(self, inner: Any = None) -> None:
        self.inner, self.calls = inner, []

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        self.calls.append(len(ids))
        if self.inner is not None:
            return self.inner.decode(ids, skip_special_tokens=skip_special_tokens)
        return "".join(f" w{i}" for i in ids).removeprefix(" ")


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer(read_llama2c_tokenizer(bundled_dir() / TOKENIZER_FILE))


def stream_all(stream: Any, ids: list[int], sizes: list[int]) -> list[str]:
    """Push ids in pieces of the given sizes (the last piece takes the rest); the pieces released,
    finish's last."""
    pieces, at = [], 0
    for size in sizes:
        if at >= len(ids):
            break
        pieces.append(stream.push(ids[at : at + size]))
        at += size
    if at < len(ids):
        pieces.append(stream.push(ids[at:]))
    return pieces + [stream.finish()]


def cut(text: str, stop: tuple[str, ...]) -> str:
    """text before the first stop string."""
    return text[: min([text.find(s) for s in stop if s in text], default=len(text))]


def test_each_push_decodes_a_bounded_window():
    tokenizer, rng = CountingTokenizer(), random.Random(0)
    prompt_ids, ids = [7, 8, 9], [rng.randrange(100) for _ in range(500)]
    ids[450:452] = [200, 201]
    stop = ("w1000", "w200 w201")  # the second near the end, found across pushes
    pieces = stream_all(
        TextStream(tokenizer, stop, prompt_ids), ids, [rng.randint(1, 3) for _ in ids]
    )
    assert max(tokenizer.calls) < 40  # the whole output was decoded again on every push: 500 ids
    assert "".join(pieces) == cut(decode_continuation(tokenizer, prompt_ids, ids), stop)


def random_text(rng: random.Random) -> str:
    """Words, punctuation and newlines, with characters the 512-piece vocabulary spells in bytes
    (ü, CJK: 3 bytes each, emoji: 4), some of them in runs of several characters."""
    words = [
        "Once",
        "upon",
        "a",
        "time",
        "the",
        "cat",
        "sat",
        ".",
        ",",
        "!",
        "\n",
        "café",
        "€5",
        "über",
        "ü",
        "中文",
        "😀",
        "ü中😀",
        "naïve",
        "bird",
        "was",
    ]
    return "".join(
        rng.choice(words) + rng.choice([" ", " ", "", "\n"]) for _ in range(rng.randint(5, 60))
    )


# bytes that are no part of any UTF-8 character (lone continuation bytes, 0xC0, 0xC1, 0xF5-0xFF)
NEVER_IN_UTF8 = [*range(0x80, 0xC0), 0xC0, 0xC1, *range(0xF5, 0x100)]
UNFINISHED = [
    [0xE4],
    [0xE4, 0xB8],
    [0xF0, 0x9F, 0x98],
    [0xC3],
]  # the start of a character, never finished


def byte_id(tokenizer: Any, byte: int) -> int:
    """The byte-fallback piece of one byte."""
    return tokenizer.convert_tokens_to_ids(f"<0x{byte:02X}>")


def is_byte(tokenizer: Any, token_id: int) -> bool:
    return tokenizer.convert_ids_to_tokens(token_id).startswith("<0x")


def invalid_bytes(tokenizer: Any, rng: random.Random) -> list[int]:
    """Byte ids that never form a character: up to 40 bytes found in no UTF-8 text (the decode
    shows U+FFFD for each), some ending in a character's unfinished start."""
    run = [
        rng.choice(NEVER_IN_UTF8)
        for _ in range(rng.choice([rng.randint(1, 4), rng.randint(5, 40)]))
    ]
    if rng.random() < 0.3:
        run += rng.choice(UNFINISHED)
    return [byte_id(tokenizer, b) for b in run]


def random_case(tokenizer: Any, rng: random.Random) -> tuple[list[int], list[int], tuple[str, ...]]:
    """(prompt ids, output ids, stop strings): the encoded text cut at a random id (the prompt
    may end inside a character), runs of invalid bytes and an end-of-text id here and there
    between pieces, and stop strings drawn from the output's text (some not in it; none with
    U+FFFD: a character's bytes decode to U+FFFD until the last one, so where such a stop string
    is found depends on how ids are pushed and how many bytes are decoded together). An invalid
    run sits between pieces that are not bytes: joined to a character's bytes, it would turn
    them into U+FFFD too (see TextStream), even after the character was released."""
    ids = tokenizer("Once upon " + random_text(rng))["input_ids"]
    split = rng.randint(1, min(8, len(ids) - 1))
    for _ in range(rng.randint(0, 2)):
        at = rng.randint(split, len(ids))
        if not any(is_byte(tokenizer, i) for i in ids[at - 1 : at + 1]):
            ids[at:at] = invalid_bytes(tokenizer, rng)
    prompt_ids, output_ids = ids[:split], ids[split:]
    for _ in range(rng.randint(0, 3)):
        at = rng.randrange(len(output_ids) + 1)
        if not any(is_byte(tokenizer, i) for i in output_ids[at - 1 : at]):
            output_ids.insert(at, tokenizer.eos_token_id)
    text = decode_continuation(tokenizer, prompt_ids, output_ids, skip_special_tokens=True)
    stop = []
    for _ in range(rng.randint(0, 3)):
        start = rng.randrange(len(text))
        stop.append(text[start : start + rng.randint(1, 6)].split("\ufffd")[0] or "\n")
    if rng.random() < 0.2:
        stop.append("never in the text")
    return prompt_ids, output_ids, tuple(stop)


def expected_text(
    tokenizer: Any, prompt_ids: list[int], ids: list[int], stop: tuple[str, ...], sizes: list[int]
) -> str:
    """The whole output's text, cut where the first stop string begins: first in time, at the
    first push whose text (the whole output so far decoded) has one, the earliest there."""
    pushed = 0
    for size in sizes:
        pushed = min(pushed + size, len(ids))
        text = decode_continuation(tokenizer, prompt_ids, ids[:pushed], skip_special_tokens=True)
        if any(s in text for s in stop):
            return cut(text, stop)
    return decode_continuation(tokenizer, prompt_ids, ids, skip_special_tokens=True)


def test_incremental_text_equals_the_whole_decode(tokenizer):
    """Random outputs (multi-byte characters split across pushes, runs of invalid bytes, stop
    strings across pushes): each push decodes a bounded window; joined, the pieces are the whole
    output's text cut before the first stop string, and every prefix released along the way is
    a prefix of it. The old (decode everything) stream gives the same text except where it
    released the start of a stop string that the next character of a split multi-byte run
    completed (see the test below)."""
    for seed in range(300):
        rng = random.Random(seed)
        prompt_ids, ids, stop = random_case(tokenizer, rng)
        sizes = [rng.randint(1, 3) for _ in ids]
        expected = expected_text(tokenizer, prompt_ids, ids, stop, sizes)
        counting = CountingTokenizer(tokenizer)
        pieces = stream_all(TextStream(counting, stop, prompt_ids), ids, sizes)
        assert max(counting.calls) <= CONTEXT_TOKENS + MAX_WINDOW + 3, (
            seed
        )  # also in long byte runs
        for n in range(len(pieces)):
            assert expected.startswith("".join(pieces[: n + 1])), (seed, stop)
        assert "".join(pieces) == expected, (seed, stop)
        old = "".join(stream_all(OldTextStream(tokenizer, stop, prompt_ids), ids, sizes))
        if (
            old != expected
        ):  # the old stream's only difference: it went on to release a stop string's start
            assert old.startswith(expected) and any(
                s.startswith(old[len(expected) :]) for s in stop
            ), seed


def test_a_stop_string_ending_in_a_split_character_is_held(tokenizer):
    """ü is two byte pieces; pushed one id at a time, after its first byte the text ends in an
    unfinished character. The "a" before it may begin the stop string "aü": it is held, not
    released (the old stream released it, then found "aü")."""
    prompt_ids = tokenizer("Once upon")["input_ids"]
    ids = tokenizer("Once upon a time aü", add_special_tokens=True)["input_ids"][len(prompt_ids) :]
    assert "<0xC3>" in tokenizer.convert_ids_to_tokens(ids)
    stop = ("aü",)
    pieces = stream_all(TextStream(tokenizer, stop, prompt_ids), ids, [1] * len(ids))
    assert "".join(pieces) == " a time "
    assert (
        "".join(stream_all(OldTextStream(tokenizer, stop, prompt_ids), ids, [1] * len(ids)))
        == " a time a"
    )


@pytest.mark.parametrize("run", ["invalid bytes", "characters in bytes", "end-of-text ids"])
def test_a_long_run_settles_in_a_bounded_window(tokenizer, run):
    """5,000 lone continuation bytes (each U+FFFD in the whole decode), 2,000 characters spelled
    in bytes, 5,000 skipped end-of-text ids: no push decodes more than a short window (it grew
    with the run: every push decoded the run so far again), the U+FFFD are released as they
    come, and the text is the whole decode."""
    counting = CountingTokenizer(tokenizer)
    prompt_ids = tokenizer("Once upon")["input_ids"]
    middle = {
        "invalid bytes": [byte_id(tokenizer, 0x80)] * 5000,
        "characters in bytes": tokenizer("中😀ü" * 500, add_special_tokens=False)["input_ids"][1:],
        "end-of-text ids": [tokenizer.eos_token_id] * 5000,
    }[run]
    assert all(is_byte(tokenizer, i) for i in middle) or run == "end-of-text ids"
    ids = (
        tokenizer("Once upon a time", add_special_tokens=True)["input_ids"][len(prompt_ids) :]
        + middle
        + tokenizer("the end.", add_special_tokens=False)["input_ids"]
    )
    rng = random.Random(0)
    stop = ("never in the text", ".")
    pieces = stream_all(
        TextStream(counting, stop, prompt_ids), ids, [rng.randint(1, 3) for _ in ids]
    )
    assert max(counting.calls) <= CONTEXT_TOKENS + MAX_WINDOW + 3
    assert (
        max(len(piece) for piece in pieces) <= MAX_WINDOW + 3
    )  # released along the way, not at the end
    assert "".join(pieces) == cut(
        decode_continuation(tokenizer, prompt_ids, ids, skip_special_tokens=True), stop
    )
    assert "".join(pieces).endswith(" the end")
