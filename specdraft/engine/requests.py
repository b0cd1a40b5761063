"""One generation request: its validation, state, emitted tokens, stop strings and text.

`Request` is what the engine's round (`round.speculative_round`) advances: prompt, sampling settings,
output so far, the target cache's length and what the drafter still has to read; `emit`
appends tokens until EOS, a stop string or the length limit; `finish` turns it into a
`GenerationResult`, with the request's `SpecMetrics`. `decode_continuation` is the one rule for the text ids add after others
(the engine's stop strings and output, the server's streamed text).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import Tensor

from specdraft.engine.errors import EngineError
from specdraft.engine.sampling import SamplingParams

TokenCallback = Callable[[list[int]], None]
CONTEXT_TOKENS = 4  # prompt ids decoded before an output (`decode_continuation`)
TAU_TOLERANCE = 1e-9


@dataclass
class SpecMetrics:
    """Counts and timings of one request, or of several merged (`merge`). Times in seconds.

    Per verification step the target emits the accepted drafts plus one bonus token, so:
        accept length tau   = emitted tokens / verification steps
        acceptance p_k      = steps whose draft at depth k was accepted / verification steps
        tau                 = 1 + sum_k p_k        (checked in every report, to rounding)
    Plain decoding is the case with no drafts (tau = 1). Counts are of verification outcomes,
    not of tokens kept after a stop condition truncates the last step. The first output token
    (from the prefill) belongs to no verification step (DESIGN.md §2 "Metrics", case M1).
    """

    num_requests: int = 0
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    num_verify_steps: int = 0
    num_drafted_tokens: int = 0
    num_accepted_tokens: int = 0
    num_emitted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)  # index k-1 = depth k
    time_prefill_s: float = 0.0
    time_draft_s: float = 0.0
    time_verify_s: float = 0.0
    time_other_s: float = 0.0

    def record_step(self, num_drafted: int, accepted_depth: int) -> None:
        """Count one verification step that checked `num_drafted` drafts (tree nodes without
        the root) and accepted a path of `accepted_depth` drafts (plus the bonus token)."""
        self.num_verify_steps += 1
        self.num_drafted_tokens += num_drafted
        self.num_accepted_tokens += accepted_depth
        self.num_emitted_tokens += accepted_depth + 1
        if len(self.accepted_per_position) < accepted_depth:
            self.accepted_per_position += [0] * (accepted_depth - len(self.accepted_per_position))
        for k in range(accepted_depth):
            self.accepted_per_position[k] += 1

    @property
    def accept_length(self) -> float:
        """tau = emitted tokens / verification steps (0.0 before any step)."""
        return self.num_emitted_tokens / self.num_verify_steps if self.num_verify_steps else 0.0

    @property
    def acceptance_per_position(self) -> list[float]:
        """p_k = accepted at depth k / verification steps, k = 1..deepest accepted depth."""
        steps = self.num_verify_steps or 1
        return [a / steps for a in self.accepted_per_position]

    @property
    def acceptance_rate(self) -> float:
        """Accepted drafts / drafted tokens (0.0 without drafts)."""
        return (
            self.num_accepted_tokens / self.num_drafted_tokens if self.num_drafted_tokens else 0.0
        )

    @property
    def time_total_s(self) -> float:
        """Prefill + draft + verify + other."""
        return self.time_prefill_s + self.time_draft_s + self.time_verify_s + self.time_other_s

    @property
    def tokens_per_s(self) -> float:
        """Output tokens / total time (0.0 when no time was recorded)."""
        return self.num_output_tokens / self.time_total_s if self.time_total_s > 0 else 0.0

    def check(self) -> None:
        """Raise AssertionError unless the raw counts agree: emitted = accepted + steps,
        accepted = sum over positions, and tau = 1 + sum p_k to rounding (M1)."""
        assert self.num_emitted_tokens == self.num_accepted_tokens + self.num_verify_steps, (
            f"emitted {self.num_emitted_tokens} != accepted {self.num_accepted_tokens} + "
            f"steps {self.num_verify_steps}"
        )
        assert sum(self.accepted_per_position) == self.num_accepted_tokens, (
            f"per-position accepted {self.accepted_per_position} do not sum to "
            f"{self.num_accepted_tokens}"
        )
        if self.num_verify_steps:
            tau, from_p = self.accept_length, 1 + sum(self.acceptance_per_position)
            assert abs(tau - from_p) <= TAU_TOLERANCE * max(1.0, tau), (
                f"tau {tau} != 1 + sum p_k = {from_p}"
            )

    def merge(self, other: SpecMetrics) -> SpecMetrics:
        """A new SpecMetrics with every count and time summed (per-position lists aligned)."""
        n = max(len(self.accepted_per_position), len(other.accepted_per_position))
        pad = lambda xs: xs + [0] * (n - len(xs))  # noqa: E731
        merged = {
            k: getattr(self, k) + getattr(other, k)
            for k in asdict(self)
            if k != "accepted_per_position"
        }
        return SpecMetrics(
            **merged,
            accepted_per_position=[
                a + b
                for a, b in zip(pad(self.accepted_per_position), pad(other.accepted_per_position))
            ],
        )

    def to_dict(self) -> dict[str, Any]:
        """Raw counts and times plus the derived values (after `check`)."""
        self.check()
        return {
            **asdict(self),
            "accept_length": self.accept_length,
            "acceptance_per_position": self.acceptance_per_position,
            "acceptance_rate": self.acceptance_rate,
            "time_total_s": self.time_total_s,
            "tokens_per_s": self.tokens_per_s,
        }


@dataclass
class GenerationResult:
    """token_ids: generated ids (EOS / the token completing a stop string included); text: their
    decoding, cut before a stop string (None without tokenizer); finish_reason: "length",
    "eos" or "stop"; metrics: this request's SpecMetrics."""

    token_ids: list[int]
    text: str | None
    finish_reason: str
    metrics: SpecMetrics


def sampling_generator(
    params: SamplingParams, seed: int | None, device: torch.device
) -> torch.Generator | None:
    """A request's sampling generator on `device` seeded with `seed` (None = random), or None
    for a greedy request (it draws nothing)."""
    if params.greedy:
        return None
    generator = torch.Generator(device=device)
    generator.manual_seed(seed) if seed is not None else generator.seed()
    return generator


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
    greedy: bool = field(init=False)  # params.greedy, read once (every round reads it)

    def __post_init__(self) -> None:
        self.greedy = self.params.greedy

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
