"""Incremental detokenization for streamed responses, with stop strings (`TextStream`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from specdraft.engine.requests import CONTEXT_TOKENS, decode_continuation

REPLACEMENT = "\ufffd"  # what a decode shows for bytes that do not (yet) form a UTF-8 character
MAX_WINDOW = 8  # window ids past which TextStream settles without waiting for a clean end
UNFINISHED_IDS = 3  # byte ids an unfinished UTF-8 character may already have (4 bytes at most)


class TextStream:
    """Incremental detokenization with stop strings: text is released only when no stop string
    can still begin in it (and not inside an unfinished UTF-8 character). The output is decoded
    as the continuation of prompt_ids (`decode_continuation`: a completion of "Once upon"
    starts " a time", not "a time").

    Each push decodes only the window of ids not yet settled, after the ids of context before
    it (as vLLM's incremental detokenizer does), not the whole output again. A window settles
    when its text ends in a whole character; the next context is then the longest run of its
    last ids (at most CONTEXT_TOKENS) that decodes alone to text without U+FFFD: context ids
    that begin inside a byte-fallback character would turn the next window's bytes into U+FFFD.
    A window longer than MAX_WINDOW ids settles anyway (each push then decodes at most
    CONTEXT_TOKENS + MAX_WINDOW + its own ids): up to its last ids that may still finish a
    character, or, where even without its last UNFINISHED_IDS ids its text ends in U+FFFD, with
    those U+FFFD (bytes that never form a character: the whole decode shows them too; the
    context then stays inside their byte run, so the run's next bytes decode as the whole
    decode does). Settled text stays `settled` (from character `base` on) only as far back as
    the release and the stop search need it.

    A decoder whose text for a byte run depends on bytes further back than the context cannot
    be followed exactly: `tokenizers`' ByteFallback turns every byte of a run into U+FFFD when
    any of them is invalid, so characters released before an invalid byte of their run arrives
    (by any stream, the old decode-everything one too) differ from the whole decode, and while a
    long run's last character is unfinished the whole decode shows the run as U+FFFD where this
    stream may already have settled its characters (and found a stop string in them).
    """

    def __init__(self, tokenizer: Any, stop: tuple[str, ...], prompt_ids: Sequence[int]) -> None:
        self.tokenizer, self.stop = tokenizer, stop
        self.context = list(prompt_ids[-CONTEXT_TOKENS:])  # the ids before the window
        self.window: list[int] = []  # ids whose text may still change
        self.settled, self.base = (
            "",
            0,
        )  # settled text from character `base` of the output's text on
        self.tail = ""  # the window's text
        self.end: int | None = None  # where the first stop string begins, once found
        self.sent = 0  # characters of the output's text released
        self.keep = max(
            (len(s) - 1 for s in stop), default=0
        )  # settled characters a stop may start in

    def push(self, ids: list[int]) -> str:
        """Add new ids; return the newly releasable text."""
        if self.end is not None:
            return ""
        self.window += ids
        self.tail = self.decode(self.context, self.window)
        self.settle()
        text = self.settled + self.tail
        cuts = [text.find(s) for s in self.stop if s in text]
        if cuts:
            self.end = self.base + min(cuts)
            return self.release(self.end)
        unfinished = len(self.tail) - len(
            self.tail.rstrip(REPLACEMENT)
        )  # more ids may make them a character
        visible = text[
            : len(text) - unfinished
        ]  # a stop string may begin before an unfinished character too
        safe = len(visible) - max(
            (n for s in self.stop for n in range(1, len(s)) if visible.endswith(s[:n])), default=0
        )
        while (
            safe > max(self.sent - self.base, len(self.settled)) and text[safe - 1] == REPLACEMENT
        ):
            safe -= 1
        return self.release(self.base + safe)

    def decode(self, context: list[int], ids: list[int]) -> str:
        """The text ids add after context."""
        return decode_continuation(self.tokenizer, context, ids, skip_special_tokens=True)

    def release(self, end: int) -> str:
        """The output's text from `sent` to `end` (none if end is not past it)."""
        text = self.settled + self.tail
        out = text[self.sent - self.base : end - self.base] if end > self.sent else ""
        self.sent = max(self.sent, end)
        return out

    def settle(self) -> None:
        """Move the window's final text into `settled` (all of the window, or when it is longer
        than MAX_WINDOW its final part); drop settled text no longer needed."""
        forced = len(self.window) > MAX_WINDOW
        if not forced and (not self.tail or self.tail.endswith(REPLACEMENT)):
            return
        num, text = self.final_part() if forced else (len(self.window), self.tail)
        ids = self.context + self.window[:num]
        if text.endswith(REPLACEMENT):  # bytes that never form a character: stay inside their run
            context = ids[-CONTEXT_TOKENS:]
        elif (context := self.clean_context(ids)) is None:
            if not forced:
                return
            # no ids to begin the next decode from cleanly; ids without text (skipped special ids) add nothing
            context = ids[-CONTEXT_TOKENS:] if text else self.context
        self.settled += text
        self.context, self.window = context, self.window[num:]
        self.tail = self.decode(self.context, self.window) if self.window else ""
        drop = min(self.sent, self.base + len(self.settled) - self.keep) - self.base
        if drop > 0:
            self.settled, self.base = self.settled[drop:], self.base + drop

    def final_part(self) -> tuple[int, str]:
        """(num, text): the window's first num ids and their text, for a window that settles
        although it may end inside a character: the most ids whose text does not end in U+FFFD,
        without at most UNFINISHED_IDS of the last ids; else (their text ends in U+FFFD that no
        later id turns into a character) all but at least those last ids, so many that the next
        context does not decode alone to a whole character."""
        if not self.tail.endswith(REPLACEMENT):
            return len(self.window), self.tail
        for num in range(len(self.window) - 1, len(self.window) - 1 - UNFINISHED_IDS, -1):
            text = self.decode(self.context, self.window[:num])
            if not text.endswith(REPLACEMENT):
                return num, text
        # the next context must stay inside the invalid run: ids that decode alone to a character
        # would begin the next window's bytes cleanly, though the whole decode shows them as U+FFFD
        ids = self.context + self.window
        num = next(
            (
                n
                for n in range(len(self.window) - UNFINISHED_IDS, 0, -1)
                if REPLACEMENT
                in self.tokenizer.decode(
                    ids[: len(self.context) + n][-CONTEXT_TOKENS:], skip_special_tokens=True
                )
            ),
            len(self.window) - UNFINISHED_IDS,
        )
        return num, self.decode(self.context, self.window[:num])

    def clean_context(self, ids: list[int]) -> list[int] | None:
        """The longest run of ids' last ids (at most CONTEXT_TOKENS) that decodes alone to text
        without U+FFFD; None if none does. Empty text does not count: the next window's leading
        space would be stripped."""
        for num in range(min(CONTEXT_TOKENS, len(ids)), 0, -1):
            head = self.tokenizer.decode(ids[-num:], skip_special_tokens=True)
            if head and REPLACEMENT not in head:
                return ids[-num:]
        return None

    def finish(self) -> str:
        """The rest of the text at the end of generation."""
        return self.release(
            self.base + len(self.settled + self.tail) if self.end is None else self.end
        )
