"""The continuously batching engine worker (`serve --max-num-seqs N`, N > 1): one thread runs
the queued sequences through an `engine.batch.BatchScheduler`, admitting new ones at every round
and retiring finished ones, each streaming its tokens as its rounds emit them.

- Up to max_num_seqs sequences run in one batch; the rest wait in the worker's bounded queue
  (429 beyond `max_queue`, as `serve.worker.EngineWorker`). K for each round comes from the
  schedule (`serve --spec-schedule`, `engine.schedule.read_schedule`), default the engine's
  num_steps at every batch size.
- A client that disconnects has its sequence aborted (`BatchScheduler.abort`) before the next
  round; the others keep running. One that leaves while waiting is dropped when its turn comes.
- A request the batched path cannot serve yet, one with logprobs or presence / frequency
  penalties (its target is `serve.scoring.ScoredTarget`, which wraps the batch-1 runner), runs
  through the batch-1 path (`EngineWorker.run`, the engine's own `generate`) alone: the worker
  admits nothing more, lets the batch drain, runs it, then goes on in arrival order. Its
  output is the one the batch-1 server gives.
- A round that raises fails the requests of that batch (each client gets the error); the
  scheduler is rebuilt and the server keeps serving.
"""

from __future__ import annotations

import logging
import os
import queue
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from specdraft.engine.batch import ABORTED, BatchScheduler
from specdraft.engine.requests import Request
from specdraft.engine.sampling import SamplingParams
from specdraft.engine.schedule import BatchSchedule, ScheduleError, read_schedule
from specdraft.engine.speculate import SpeculativeEngine
from specdraft.serve.metrics import RequestTimes, ServerMetrics
from specdraft.serve.worker import EngineWorker, Job

log = logging.getLogger("specdraft.serve")
MAX_NUM_SEQS_CAP = 256  # vLLM 0.32 engine/arg_utils.py get_batch_defaults: 256 below 70 GiB GPUs
CUDA_BUDGET = 0.5  # of the device memory free once the engine is loaded
CPU_BUDGET = 0.25  # of the host memory available once the engine is loaded


@dataclass
class Running:
    """A sequence in the batch: its job, its engine request, when it was admitted, and the
    perf_counter times of its token batches (the prefill's first, then each round's)."""

    job: Job
    req: Request | None = None
    start: float = field(default_factory=time.perf_counter)
    times: list[float] = field(default_factory=list)
    new_tokens: int = 0  # tokens of its rounds since the last log record


def kv_bytes_per_sequence(engine: SpeculativeEngine) -> int:
    """The KV cache one sequence takes at the engine's max_seq_len: the fast target's cache
    rows (`kv_stack` bytes / rows), else 2 x layers x hidden_size x 4 bytes per position (no
    grouped KV, fp32: an upper bound for a transformers-backed target); with a drafter, a
    target layer's more per draft layer (an EAGLE-3 drafter's one, a DFlash drafter's context
    K/V in each of its layers: `dflash_rows.DFlashRows`)."""
    target = engine.target
    stack = getattr(target, "kv_stack", None)
    if stack is not None and target.max_batch_size:
        per_seq = stack.numel() * stack.element_size() // target.max_batch_size
    else:
        args = target.args
        per_seq = 2 * args.num_layers * args.hidden_size * 4 * engine.max_seq_len
    layers = target.args.num_layers
    if engine.draft is None:
        return per_seq
    return per_seq * (layers + len(getattr(engine.draft, "layers", [None]))) // layers


def memory_budget(device: torch.device) -> int:
    """Bytes the batch's KV cache may take: CUDA_BUDGET of the device's free memory, else
    CPU_BUDGET of the host's available memory (`os.sysconf`)."""
    if device.type == "cuda":
        return int(CUDA_BUDGET * torch.cuda.mem_get_info(device)[0])
    available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return int(CPU_BUDGET * available)


def default_max_num_seqs(engine: SpeculativeEngine, budget: int | None = None) -> int:
    """Sequences whose KV cache at max_seq_len fits the budget (`memory_budget` unless given),
    1..MAX_NUM_SEQS_CAP."""
    budget = memory_budget(engine.device) if budget is None else budget
    return max(1, min(MAX_NUM_SEQS_CAP, budget // kv_bytes_per_sequence(engine)))


def batch_settings(
    engine: SpeculativeEngine, max_num_seqs: int | None, schedule_file: str | None
) -> tuple[int, BatchSchedule | None]:
    """`serve`'s (max_num_seqs, schedule): max_num_seqs as given, else `default_max_num_seqs`
    (at most the schedule's last batch size); the schedule read from schedule_file
    (`read_schedule`, K at most the engine's num_steps), None without one. Raises
    ScheduleError naming the file when it is refused or covers fewer than max_num_seqs."""
    depth = engine.spec.num_steps if engine.spec is not None else 0
    schedule = None if schedule_file is None else read_schedule(schedule_file, depth)
    num = default_max_num_seqs(engine) if max_num_seqs is None else max_num_seqs
    if schedule is None:
        return num, None
    if max_num_seqs is None:
        num = min(num, schedule.max_batch_size)
    if schedule.max_batch_size < num:
        raise ScheduleError(
            f"{schedule_file}: covers batch sizes 1..{schedule.max_batch_size}, --max-num-seqs is "
            f"{num}: extend its last entry to {num} or pass a smaller --max-num-seqs"
        )
    return num, schedule


class BatchWorker(EngineWorker):
    """`EngineWorker` whose thread runs a `BatchScheduler` (module docstring); queueing:
    (max_queue, log_every) as `EngineWorker`'s; batching: (max_num_seqs rows, K by batch size or
    None: the engine's num_steps). Raises what
    `EngineWorker` and `BatchScheduler` raise (ServeError for max_queue < 1, EngineError for
    max_num_seqs < 1, ScheduleError for a schedule short of max_num_seqs or too deep)."""

    def __init__(
        self,
        engine: SpeculativeEngine,
        end_ids: Sequence[int],
        metrics: ServerMetrics,
        queueing: tuple[int, int],
        batching: tuple[int, BatchSchedule | None],
    ) -> None:
        self.scheduler = BatchScheduler(engine, *batching)
        self.active: dict[int, Running] = {}  # id(request) -> its sequence
        self.held: Job | None = None  # a batch-1 job waiting for the batch to drain
        self.stopping = False
        super().__init__(engine, end_ids, metrics, *queueing)
        metrics.watch_batches(lambda: dict(self.scheduler.stats))

    @property
    def num_running(self) -> int:
        """Sequences in the batch, or the one running alone."""
        return len(self.active) + int(self.running is not None)

    @property
    def num_waiting(self) -> int:
        """Sequences queued, held for the batch-1 path, or admitted but not yet prefilled."""
        waiting = len(self.scheduler.waiting) + int(self.held is not None)
        return self.jobs.qsize() + waiting

    def loop(self) -> None:
        """Fill the batch, run one round (or a held job alone once the batch is empty), until
        the stop sentinel arrives and the batch has drained."""
        while not (self.stopping and not self.active):
            self.fill()
            if self.held is not None and not self.active:
                job, self.held = self.held, None
                self.drop(job) if self.stopping or job.cancelled.is_set() else self.run_one(job)
            elif self.active:
                self.step()

    def fill(self) -> None:
        """Take queued jobs while the batch has room (waiting for one when nothing runs); a
        scored job is held and stops the filling (`run_one` runs it once the batch drains)."""
        while not self.stopping and self.held is None:
            if len(self.active) >= self.scheduler.max_num_seqs:
                return
            try:
                job = self.jobs.get(block=not self.active)
            except queue.Empty:
                return
            if job is None:
                self.stopping = True
            elif job.cancelled.is_set():
                self.drop(job)
            elif job.request.scored:
                self.held = job
            else:
                self.admit(job)
        self.set_queue()

    def admit(self, job: Job) -> None:
        """Build the job's engine request (streaming through job.post) and add it to the batch."""
        r, seq = job.request, Running(job)

        def on_tokens(ids: list[int]) -> None:
            seq.times.append(time.perf_counter())
            seq.new_tokens += len(ids) if len(seq.times) > 1 else 0
            job.post(("tokens", (ids, None)))

        params = SamplingParams(r.temperature, r.top_p, r.top_k)
        eos = () if r.ignore_eos else self.eos_ids
        try:
            seq.req = self.engine.new_request(
                r.prompt_ids, r.max_tokens, params, eos, r.stop or None, r.seed, on_tokens
            )
        except ValueError as e:  # the engine's own checks (`checked` ran them before queueing)
            job.post(("error", str(e)))
            return
        self.active[id(seq.req)] = seq
        self.scheduler.add(seq.req)

    def step(self) -> None:
        """Abort the sequences whose clients left, run one round, answer the finished ones."""
        for seq in self.active.values():
            if seq.job.cancelled.is_set():
                self.scheduler.abort(seq.req)
        t0 = time.perf_counter()
        try:
            finished = self.scheduler.step()
        except Exception as e:  # reported to this batch's clients; the server keeps serving
            log.exception("batched generation failed")
            self.fail(f"generation failed: {type(e).__name__}: {e}")
            return
        self.log_round(time.perf_counter() - t0)
        done = [(self.active.pop(id(req)), result) for req, result in finished]
        self.set_queue()  # before the answers: a client that scrapes next sees them gone
        for seq, result in done:
            if result.finish_reason == ABORTED:
                self.drop(seq.job)
                continue
            times = RequestTimes(seq.job.arrival, seq.start, seq.times)
            self.metrics.record(result, self.engine.spec is not None, times)
            seq.job.post(("done", result))

    def log_round(self, elapsed_s: float) -> None:
        """Each row's tokens of the round into the step log, the round's time shared by them."""
        rows = [seq for seq in self.active.values() if seq.new_tokens]
        for seq in rows:
            self.step_log.record(seq.new_tokens, elapsed_s / len(rows), self.num_waiting)
            seq.new_tokens = 0

    def fail(self, message: str) -> None:
        """Answer every sequence of the batch with the error; a new, empty scheduler."""
        for seq in self.active.values():
            seq.job.post(("error", message))
        self.active.clear()
        old = self.scheduler
        self.scheduler = BatchScheduler(self.engine, old.max_num_seqs, old.schedule)
        self.set_queue()

    def close(self, timeout_s: float = 10.0) -> None:
        """Cancel the batch's, the held and the waiting jobs and stop the thread."""
        for seq in list(self.active.values()):
            seq.job.cancelled.set()
        if self.held is not None:
            self.held.cancelled.set()
        super().close(timeout_s)
