"""OpenAI's response bodies for specdraft's server: completion / chat.completion bodies and SSE
chunks (`ResponseShape`, `sse`), one choice per sequence (choice index = prompt index * n + j,
as vLLM numbers them), with the prompt's and the output's token ids when asked
(`return_token_ids`, vLLM's names: text does not round-trip to the same ids, so a client that
measures on the tokens the server ran needs them) and logprobs (`serve.logprobs`); `usage_of`
adds the raw speculative counts and `accept_length` = 1 + accepted / drafts to OpenAI's usage,
over all of a request's sequences (prompt tokens counted once per prompt, as vLLM does).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import reduce
from typing import Any

from specdraft.engine.requests import GenerationResult

FINISH_REASONS = {"eos": "stop", "stop": "stop", "length": "length"}  # engine -> OpenAI


def usage_of(results: Sequence[GenerationResult], num_prompt_tokens: int | None = None) -> dict:
    """OpenAI usage plus the raw speculative counts and accept length (1 + accepted / drafts)
    of these sequences' merged metrics; prompt_tokens: num_prompt_tokens (default: the one
    sequence's prompt)."""
    m = reduce(lambda a, b: a.merge(b), [r.metrics for r in results])
    m.check()
    prompt = m.num_prompt_tokens if num_prompt_tokens is None else num_prompt_tokens
    completion = sum(len(r.token_ids) for r in results)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "num_drafts": m.num_verify_steps,
        "num_draft_tokens": m.num_drafted_tokens,
        "num_accepted_tokens": m.num_accepted_tokens,
        "num_accepted_tokens_per_pos": list(m.accepted_per_position),
        "accept_length": m.accept_length,
        "acceptance_per_position": m.acceptance_per_position,
    }


def sse(payload: dict) -> str:
    """One server-sent event."""
    return f"data: {json.dumps(payload)}\n\n"


@dataclass
class ResponseShape:
    """OpenAI's completion / chat.completion bodies and chunks for one request.

    return_token_ids: whether choices carry token ids (vLLM's return_token_ids: the body's
    choice carries `prompt_token_ids` and `token_ids`; streamed, a choice's first chunk carries
    `prompt_token_ids` and each chunk the `token_ids` it adds).
    """

    model: str
    chat: bool
    return_token_ids: bool = False
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    created: int = field(default_factory=lambda: int(time.time()))
    prompt_sent: set[int] = field(default_factory=set)  # streamed choices that had a chunk

    def head(self, stream: bool) -> dict[str, Any]:
        """id, object, created, model."""
        kind = ("chat.completion" if self.chat else "text_completion") + (
            ".chunk" if stream and self.chat else ""
        )
        return {
            "id": ("chatcmpl-" if self.chat else "cmpl-") + self.id,
            "object": kind,
            "created": self.created,
            "model": self.model,
        }

    def chunk(
        self,
        piece: str | dict,
        finish_reason: str | None,
        token_ids: Sequence[int] = (),
        *,
        index: int = 0,
        prompt_ids: Sequence[int] = (),
        logprobs: dict | None = None,
    ) -> dict[str, Any]:
        """A streamed chunk of choice `index` carrying `piece` (text, or a chat delta dict),
        its tokens' logprobs, and, when token ids were asked for, the output ids it adds (the
        prompt's with the choice's first chunk)."""
        if self.chat:
            delta = piece if isinstance(piece, dict) else ({"content": piece} if piece else {})
            choice = {"index": index, "delta": delta}
        else:
            choice = {"index": index, "text": piece}
        choice.update(logprobs=logprobs, finish_reason=finish_reason)
        if self.return_token_ids:
            if index not in self.prompt_sent:
                choice["prompt_token_ids"] = list(prompt_ids)
                self.prompt_sent.add(index)
            choice["token_ids"] = list(token_ids)
        return {**self.head(stream=True), "choices": [choice]}

    def choice(
        self,
        index: int,
        text: str,
        result: GenerationResult,
        prompt_ids: Sequence[int],
        logprobs: dict | None = None,
    ) -> dict[str, Any]:
        """One choice of the non-streamed body."""
        reason = FINISH_REASONS[result.finish_reason]
        if self.chat:
            choice = {"index": index, "message": {"role": "assistant", "content": text}}
        else:
            choice = {"index": index, "text": text}
        choice.update(logprobs=logprobs, finish_reason=reason)
        if self.return_token_ids:
            choice.update(prompt_token_ids=list(prompt_ids), token_ids=list(result.token_ids))
        return choice

    def full(self, choices: list[dict], usage: dict) -> dict[str, Any]:
        """The non-streamed body with usage."""
        return {**self.head(stream=False), "choices": choices, "usage": usage}
