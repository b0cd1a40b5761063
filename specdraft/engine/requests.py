"""One generation request: its validation, state, emitted tokens, stop strings and text.

`Request` is what the engine's loop (`SpeculativeEngine`) advances: prompt, sampling settings,
output so far, the target cache's length and what the drafter still has to read; `emit`
appends tokens until EOS, a stop string or the length limit; `finish` turns it into a
`GenerationResult`. `decode_continuation` is the one rule for the text ids add after others
(the engine's stop strings and output, the server's streamed text).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from specdraft.engine.errors import EngineError
from specdraft.engine.metrics import SpecMetrics
from specdraft.engine.sampling import SamplingParams

TokenCallback = Callable[[list[int]], None]
CONTEXT_TOKENS = 4  # prompt ids decoded before an output (`decode_continuation`)


@dataclass
class GenerationResult:
    """token_ids: generated ids (EOS / the token completing a stop string included); text: their
    decoding, cut before a stop string (None without tokenizer); finish_reason: "length",
    "eos" or "stop"; metrics: this request's SpecMetrics."""

    token_ids: list[int]
    text: str | None
    finish_reason: str
    metrics: SpecMetrics


def check_request(
    prompt_ids: Sequence[int], max_new_tokens: int, stop: Sequence[str] | None, tokenizer: Any
) -> None:
    """Raise ValueError for an empty prompt, max_new_tokens < 1, or stop strings without a tokenizer."""
    if not prompt_ids:
        raise EngineError("empty prompt: need at least one token id")
    if max_new_tokens < 1:
        raise EngineError(f"max_new_tokens {max_new_tokens}: must be >= 1")
    if stop and tokenizer is None:
        raise EngineError("stop strings need a tokenizer: build the engine with tokenizer=...")


@dataclass
class Request:
    """State of one generation: sampling settings, output so far, cache lengths. tokenizer:
    anything with decode(list[int]) -> str, or None (then no stop strings and no text)."""

    prompt_ids: list[int]
    params: SamplingParams
    max_new_tokens: int
    eos_ids: frozenset[int]
    stop: tuple[str, ...]
    generator: torch.Generator | None
    on_tokens: TokenCallback | None
    metrics: SpecMetrics
    tokenizer: Any = None
    output_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    length: int = 0  # target cache entries = position of the root (last emitted token)
    pending_ids: Tensor | None = None  # [m] tokens following the m positions not yet drafted
    pending_aux: Tensor | None = None  # [m, n_aux*H] the target's aux states at those positions

    @classmethod
    def new(
        cls,
        prompt_ids: list[int],
        max_new_tokens: int,
        params: SamplingParams,
        eos_ids: Sequence[int],
        stop: Sequence[str] | None,
        seed: int | None,
        on_tokens: TokenCallback | None,
        tokenizer: Any,
        device: torch.device,
        num_steps: int,
    ) -> Request:
        """A fresh request (checked by `check_request` first): a sampling generator on `device`
        seeded with `seed` (None = random; none for greedy), metrics for num_steps draft steps."""
        generator = None
        if not params.greedy:
            generator = torch.Generator(device=device)
            generator.manual_seed(seed) if seed is not None else generator.seed()
        metrics = SpecMetrics(
            num_requests=1, num_prompt_tokens=len(prompt_ids), accepted_per_position=[0] * num_steps
        )
        return cls(
            prompt_ids,
            params,
            max_new_tokens,
            frozenset(eos_ids),
            tuple(stop or ()),
            generator,
            on_tokens,
            metrics,
            tokenizer,
        )

    def emit(self, tokens: list[int]) -> None:
        """Append tokens until a stop condition; call the stream callback with the kept ones."""
        kept = 0
        for token in tokens:
            self.output_ids.append(token)
            kept += 1
            if token in self.eos_ids:
                self.finish_reason = "eos"
            elif self.stop and self.stop_in_tail():
                self.finish_reason = "stop"
            elif len(self.output_ids) >= self.max_new_tokens:
                self.finish_reason = "length"
            if self.finish_reason is not None:
                break
        if self.on_tokens is not None and kept:
            self.on_tokens(tokens[:kept])

    def stop_in_tail(self) -> bool:
        """Whether a stop string is in the text of the output's last tokens. A new match ends in
        the newest token's text (an older one would have stopped the request) and spans at most
        4 tokens a character (UTF-8 bytes), so the last 4 * longest + 8 tokens are decoded, after
        the ids before them (`decode_continuation`): linear in the output's length, where
        decoding all of it after every token was quadratic."""
        ids, window = self.output_ids, 4 * max(map(len, self.stop)) + 8
        cut = max(0, len(ids) - window)
        context = (
            list(self.prompt_ids[-CONTEXT_TOKENS:]) + ids[max(0, cut - CONTEXT_TOKENS) : cut]
        )[-CONTEXT_TOKENS:]
        tail = decode_continuation(self.tokenizer, context, ids[cut:])
        return any(s in tail for s in self.stop)

    def text(self) -> str | None:
        """Decoded output, cut before the first stop string (None without tokenizer)."""
        if self.tokenizer is None:
            return None
        text = decode_continuation(self.tokenizer, self.prompt_ids, self.output_ids)
        cuts = [text.find(s) for s in self.stop if s in text]
        return text[: min(cuts)] if cuts else text

    def finish(self, start: float) -> GenerationResult:
        """The result of a finished request whose generation began at time.perf_counter() `start`:
        the wall time not spent in prefill, drafting or verifying is the metrics' time_other_s.
        Raises what `SpecMetrics.check` raises."""
        m = self.metrics
        m.time_other_s = max(
            0.0, time.perf_counter() - start - m.time_prefill_s - m.time_draft_s - m.time_verify_s
        )
        m.num_output_tokens = len(self.output_ids)
        m.check()
        return GenerationResult(self.output_ids, self.text(), self.finish_reason, m)


def decode_continuation(
    tokenizer: Any,
    prompt_ids: Sequence[int],
    output_ids: Sequence[int],
    skip_special_tokens: bool = False,
) -> str:
    """The text output_ids add after prompt_ids.

    Decoding the output alone loses what depends on the tokens before it: SentencePiece-style
    tokenizers drop the word-start space of a decode's first token ("▁a" alone is "a", after
    "Once upon" it is " a"), so "Once upon" + the output would read "Once upona time". The
    output is decoded after the prompt's last CONTEXT_TOKENS ids and their own text removed,
    as vLLM's incremental detokenizer does; where that text is not a prefix (a multi-byte
    character split across the boundary), the output alone. tokenizer: anything with
    decode(list[int]) -> str (and a skip_special_tokens keyword when that is asked for).
    """
    options = (
        {"skip_special_tokens": True} if skip_special_tokens else {}
    )  # plain decode(ids) suffices
    context = list(prompt_ids[-CONTEXT_TOKENS:])
    head = tokenizer.decode(context, **options)
    text = tokenizer.decode(context + list(output_ids), **options)
    if text.startswith(head):
        return text[len(head) :]
    return tokenizer.decode(list(output_ids), **options)
