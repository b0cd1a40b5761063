"""The engine behind specdraft's server: one worker thread runs the queued requests through
`SpeculativeEngine.generate`, one at a time (the engine is batch 1), and the engine's limits a
request must fit before it is queued (`checked`, `context_room`). Every call into the engine the
server makes is in this module.

- Requests wait in a bounded queue (`max_queue` waiting sequences besides the running one; 429
  beyond). A request of several sequences (a list of prompts, n > 1) queues them together, one
  job each, and they run one after another. No batching: concurrency only queues.
- A request that asks for logprobs or penalties runs with `serve.scoring.ScoredTarget` as the
  engine's round target; its events then carry the target's scores of its tokens (and of its
  prompt, for echo).
- A client that disconnects stops its generation at the next verification step: the engine's
  `on_tokens` callback raises `GenerationCancelled` (the engine restarts from a prefill on
  every request, so an interrupted `generate` leaves nothing behind); one that disconnects while
  its request waits has it dropped when its turn comes. Both count as cancelled, as do the
  requests `close` drops: a request that arrives counts once, as a success, a cancellation or a
  rejection (429), unless its generation fails.
- Every `log_every` verification steps the worker logs accept length, acceptance rate and
  tokens/s over the steps since the last line (like SGLang's decode log; counts kept tokens).
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from specdraft.engine.speculate import SpeculativeEngine
from specdraft.errors import SpecdraftError
from specdraft.serve.metrics import RequestTimes, ServerMetrics
from specdraft.serve.protocol import GenerationRequest, RequestError, parse_common
from specdraft.serve.scoring import ScoredTarget, scoring

log = logging.getLogger("specdraft.serve")
DEFAULT_MAX_QUEUE = 64


class ServeError(SpecdraftError, ValueError):
    """A server (or tune's engine) that cannot be built from what it was given: a setting that
    cannot work (--max-queue below 1), a target directory whose tokenizer cannot be loaded."""


class GenerationCancelled(Exception):
    """Raised from the engine's token callback to stop a request whose client went away."""


@dataclass
class Job:
    """One queued sequence. post(event) hands an event to the request's event loop (thread-safe);
    events: ("prompt", [TokenScore]) (echo with logprobs, before the first tokens), ("tokens",
    (ids, [TokenScore] or None)), ("done", GenerationResult), ("error", message),
    ("cancelled", None)."""

    request: GenerationRequest
    post: Callable[[tuple[str, Any]], None]
    cancelled: threading.Event = field(default_factory=threading.Event)
    arrival: float = field(default_factory=time.perf_counter)


class StepLog:
    """Verification steps since the last log line; logs every `every` steps (0 = never)."""

    def __init__(self, every: int, drafts_per_step: int) -> None:
        self.every, self.drafts_per_step = every, drafts_per_step
        self.steps, self.tokens, self.busy_s = 0, 0, 0.0

    def record(self, num_tokens: int, elapsed_s: float, num_waiting: int) -> None:
        """Count one verification step that kept `num_tokens` tokens in `elapsed_s`."""
        self.steps, self.tokens, self.busy_s = (
            self.steps + 1,
            self.tokens + num_tokens,
            self.busy_s + elapsed_s,
        )
        if not self.every or self.steps < self.every:
            return
        rate = (
            (self.tokens - self.steps) / (self.steps * self.drafts_per_step)
            if self.drafts_per_step
            else 0.0
        )
        log.info(
            "decode: %d verification steps, accept len %.2f, accept rate %.2f, gen throughput "
            "(token/s) %.1f, #queue-req %d",
            self.steps,
            self.tokens / self.steps,
            rate,
            self.tokens / self.busy_s if self.busy_s > 0 else 0.0,
            num_waiting,
        )
        self.steps, self.tokens, self.busy_s = 0, 0, 0.0


class EngineWorker:
    """Runs queued jobs on one thread, one at a time (the engine is batch 1); a request ends at
    an id of `end_ids` unless it asks `ignore_eos`. Raises ServeError (a ValueError) for
    max_queue < 1."""

    def __init__(
        self,
        engine: SpeculativeEngine,
        end_ids: Sequence[int],
        metrics: ServerMetrics,
        max_queue: int,
        log_every: int,
    ) -> None:
        if max_queue < 1:
            raise ServeError(
                f"max_queue {max_queue}: must be >= 1 (requests waiting besides the running one)"
            )
        self.engine, self.metrics = engine, metrics
        self.eos_ids = tuple(end_ids)
        self.jobs: queue.Queue[Job | None] = queue.Queue(maxsize=max_queue)
        self.running: Job | None = None
        self.step_log = StepLog(log_every, engine.spec.num_draft_tokens - 1 if engine.spec else 0)
        self.thread = threading.Thread(target=self.loop, name="specdraft-engine", daemon=True)
        self.thread.start()

    def submit(self, jobs: Sequence[Job]) -> None:
        """Queue a request's jobs, all or none (called from the event loop's thread only, so
        the room checked is there); RequestError 400 for more jobs than the queue holds, 429
        when the queue has no room for them now."""
        size = self.jobs.maxsize
        if len(jobs) > size:
            raise RequestError(
                f"this request needs {len(jobs)} sequences (prompts x n); the queue holds "
                f"{size} (--max-queue): send fewer prompts or a smaller n",
                param="n",
            )
        if self.jobs.qsize() + len(jobs) > size:
            self.metrics.rejected.inc()
            raise RequestError(
                f"server busy: {self.jobs.qsize()} of {size} sequences already waiting; retry "
                "later",
                code="queue_full",
                status=429,
                kind="server_busy",
            )
        for job in jobs:
            self.jobs.put_nowait(job)
        self.set_queue()

    @property
    def num_running(self) -> int:
        """Sequences generating now (0 or 1 here)."""
        return int(self.running is not None)

    @property
    def num_waiting(self) -> int:
        """Sequences queued, not yet generating."""
        return self.jobs.qsize()

    def set_queue(self) -> None:
        """The running / waiting gauges from the worker's state."""
        self.metrics.set_queue(self.num_running, self.num_waiting)

    def loop(self) -> None:
        """Take jobs until the stop sentinel (None)."""
        while (job := self.jobs.get()) is not None:
            if job.cancelled.is_set():  # its client left while it waited
                self.drop(job)
            else:
                self.run_one(job)

    def drop(self, job: Job) -> None:
        """A job whose client left before it ran: counted and answered as cancelled."""
        self.set_queue()
        self.metrics.cancelled.inc()
        job.post(("cancelled", None))

    def run_one(self, job: Job) -> None:
        """`run` one job as the running one (the gauges follow)."""
        self.running = job
        self.set_queue()
        try:
            self.run(job)
        finally:
            self.running = None
            self.set_queue()

    def run(self, job: Job) -> None:
        """Generate one sequence, streaming its tokens (and scores) through job.post."""
        req, times, start = job.request, [], time.perf_counter()
        target = None
        if req.scored:
            target = ScoredTarget(
                self.engine.runner,
                req.logprobs,
                req.presence_penalty,
                req.frequency_penalty,
                prompt_scores=req.echo,
            )

        def on_tokens(ids: list[int]) -> None:
            if job.cancelled.is_set():
                raise GenerationCancelled()
            times.append(time.perf_counter())
            if len(times) > 1:  # the first call is the prefill's token, not a verification step
                self.step_log.record(len(ids), times[-1] - times[-2], self.jobs.qsize())
            elif target is not None and target.prompt:
                job.post(("prompt", target.prompt))
            job.post(("tokens", (ids, None if target is None else target.take(ids))))

        try:
            with scoring(self.engine, target) if target else contextlib.nullcontext():
                result = self.generate(req, on_tokens)
        except GenerationCancelled:
            self.metrics.cancelled.inc()
            job.post(("cancelled", None))
            return
        except Exception as e:  # reported to this request's client; the server keeps serving
            log.exception("generation failed")
            job.post(("error", f"generation failed: {type(e).__name__}: {e}"))
            return
        speculative = self.engine.spec is not None
        self.metrics.record(result, speculative, RequestTimes(job.arrival, start, times))
        self.running = None
        self.set_queue()  # before the answer: a client that scrapes next sees it gone
        job.post(("done", result))

    def generate(self, req: GenerationRequest, on_tokens: Callable) -> Any:
        """The engine's generation of `req` (ending at the end ids unless it ignores EOS)."""
        return self.engine.generate(
            req.prompt_ids,
            req.max_tokens,
            req.temperature,
            req.top_p,
            req.top_k,
            () if req.ignore_eos else self.eos_ids,
            req.stop or None,
            req.seed,
            on_tokens,
        )

    def close(self, timeout_s: float = 10.0) -> None:
        """Cancel the running and waiting jobs and stop the thread."""
        if self.running is not None:
            self.running.cancelled.set()
        while True:
            try:
                job = self.jobs.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                self.metrics.cancelled.inc()
                job.post(("cancelled", None))
        self.jobs.put(None)
        self.thread.join(timeout_s)


def checked(
    engine: SpeculativeEngine,
    body: dict,
    prompt_ids: list[int],
    default_max: int,
    chat: bool = False,
) -> GenerationRequest:
    """parse_common + the context check (400 context_length_exceeded before any compute)."""
    req = parse_common(body, prompt_ids, default_max, chat)
    try:
        engine.check_limits(len(prompt_ids), req.max_tokens)
    except ValueError as e:
        raise RequestError(str(e), param="max_tokens", code="context_length_exceeded") from None
    return req


def context_room(engine: SpeculativeEngine, num_prompt_tokens: int) -> int:
    """New tokens that fit after the prompt (`engine.longest_request`, the rule every length
    error applies)."""
    return engine.longest_request() - num_prompt_tokens
