"""The answer to one generation request from its sequences' events (`serve.worker.Job`): one
JSON body once every sequence is done (`wait_for_all`, `full_body`), or SSE chunks as the events
arrive (`stream_chunks`). `Choice` is one sequence's side of it: its text so far (`TextStream`,
with stop strings), its echoed prompt, its token ids and scores not yet sent, its logprobs
writer.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from specdraft.engine.requests import GenerationResult
from specdraft.serve.logprobs import LogprobsWriter, TokenScore
from specdraft.serve.protocol import GenerationRequest, RequestError
from specdraft.serve.responses import FINISH_REASONS, ResponseShape, sse, usage_of
from specdraft.serve.text_stream import TextStream
from specdraft.serve.worker import Job

DISCONNECT_POLL_S = 0.25


@dataclass
class Choice:
    """One sequence of a request. echo: the prompt's text to send first (completions' echo;
    "" otherwise); writer: its logprobs (None when none were asked)."""

    index: int
    request: GenerationRequest
    text: TextStream
    echo: str = ""
    writer: LogprobsWriter | None = None
    pending: list[int] = field(default_factory=list)  # output ids not yet sent in a chunk
    pending_scores: list[TokenScore] = field(default_factory=list)
    scores: list[TokenScore] = field(default_factory=list)  # every output token's
    prompt_scores: list[TokenScore] = field(default_factory=list)
    result: GenerationResult | None = None
    opened: bool = False  # streamed: its opening chunk went out

    @classmethod
    def of(cls, index: int, req: GenerationRequest, tokenizer: Any, chat: bool, echo: str):
        """A choice for `req` (echo: the prompt's text when the request echoes it)."""
        writer = None
        if req.logprobs is not None:
            context = [] if req.echo and not chat else list(req.prompt_ids)
            writer = LogprobsWriter(tokenizer, chat, req.logprobs, context)
        text = TextStream(tokenizer, req.stop, req.prompt_ids)
        return cls(index, req, text, echo if req.echo else "", writer)

    def push(self, ids: list[int], scores: list[TokenScore] | None) -> str:
        """New output ids and their scores; the newly releasable text."""
        self.pending += ids
        self.pending_scores += scores or []
        self.scores += scores or []
        return self.text.push(ids)

    def logprobs(self, scores: list[TokenScore]) -> dict | None:
        """The logprobs object of these scores (None when none were asked)."""
        return None if self.writer is None else self.writer.render(scores)

    def head_chunk(self, shape: ResponseShape) -> dict | None:
        """The chunk that opens a streamed choice: chat's role, or the echoed prompt (with its
        scores: sent at the choice's first event); None when nothing opens it."""
        self.opened = True
        if shape.chat:
            role = {"role": "assistant", "content": ""}
            return shape.chunk(role, None, index=self.index, prompt_ids=self.request.prompt_ids)
        if not self.echo:
            return None
        return shape.chunk(
            self.echo,
            None,
            index=self.index,
            prompt_ids=self.request.prompt_ids,
            logprobs=self.logprobs(self.prompt_scores),
        )

    def chunk(self, shape: ResponseShape, piece: str, reason: str | None) -> dict:
        """A chunk with `piece` and the ids / scores held until now."""
        out = shape.chunk(
            piece,
            reason,
            self.pending,
            index=self.index,
            prompt_ids=self.request.prompt_ids,
            logprobs=self.logprobs(self.pending_scores) if self.pending_scores else None,
        )
        self.pending, self.pending_scores = [], []
        return out

    def body_choice(self, shape: ResponseShape) -> dict:
        """This choice in the non-streamed body."""
        text = self.echo + self.text.push(self.result.token_ids) + self.text.finish()
        return shape.choice(
            self.index,
            text,
            self.result,
            self.request.prompt_ids,
            self.logprobs(self.prompt_scores + self.scores),
        )


def on_event(choice: Choice, kind: str, value: Any) -> None:
    """A non-streamed choice's bookkeeping of one event (prompt scores, token scores, result)."""
    if kind == "prompt":
        choice.prompt_scores = value
    elif kind == "tokens":
        choice.scores += value[1] or []
    elif kind == "done":
        choice.result = value


async def wait_for_all(
    request: Any, jobs: list[Job], events: asyncio.Queue, choices: list[Choice]
) -> tuple[str, Any]:
    """Wait until every sequence is done ("done", None), or the first error / cancellation
    (its kind and message); cancel the jobs left when the client disconnects or one fails."""
    left = len(jobs)
    try:
        while left:
            try:
                index, kind, value = await asyncio.wait_for(events.get(), DISCONNECT_POLL_S)
            except TimeoutError:
                if await request.is_disconnected():
                    return "cancelled", None
                continue
            if kind in ("error", "cancelled"):
                return kind, value
            on_event(choices[index], kind, value)
            left -= kind == "done"
        return "done", None
    finally:
        for job in jobs:
            job.cancelled.set()  # no-op once finished


def full_body(shape: ResponseShape, choices: list[Choice], num_prompt_tokens: int) -> dict:
    """The non-streamed body of finished choices."""
    usage = usage_of([c.result for c in choices], num_prompt_tokens)
    return shape.full([c.body_choice(shape) for c in choices], usage)


async def stream_chunks(
    jobs: list[Job],
    events: asyncio.Queue,
    shape: ResponseShape,
    choices: list[Choice],
    usage: Callable[[list[GenerationResult]], dict] | None,
) -> AsyncIterator[str]:
    """SSE: each choice's opening chunk, text chunks as its tokens arrive, its final chunk with
    finish_reason; once all are done the usage chunk (when `usage` is given), then [DONE]. Ids
    and scores held back with their text (a possible stop string) travel with the next chunk.
    An error or a cancellation ends the stream with an error body; closing the stream (a
    client disconnect) cancels every job."""
    left = len(jobs)
    try:
        for choice in choices if shape.chat else ():
            yield sse(choice.head_chunk(shape))
        while left:
            index, kind, value = await events.get()
            choice = choices[index]
            if kind == "prompt":  # before the choice's first tokens (echo with logprobs)
                choice.prompt_scores = value
            if not choice.opened and (head := choice.head_chunk(shape)) is not None:
                yield sse(head)
            if kind == "prompt":
                continue
            if kind == "tokens":
                if piece := choice.push(*value):
                    yield sse(choice.chunk(shape, piece, None))
                continue
            if kind != "done":
                message = value or "request cancelled"
                yield sse(RequestError(message, code=kind, kind="server_error").body())
                break
            choice.result, left = value, left - 1
            yield sse(
                choice.chunk(shape, choice.text.finish(), FINISH_REASONS[value.finish_reason])
            )
        if not left and usage is not None:
            results = [c.result for c in choices]
            yield sse({**shape.chunk("", None), "choices": [], "usage": usage(results)})
        yield "data: [DONE]\n\n"
    finally:
        for job in jobs:
            job.cancelled.set()
