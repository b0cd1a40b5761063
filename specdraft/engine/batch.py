"""Continuous batching on one target: `BatchScheduler` runs one batched round for every running
sequence per `step`, admits waiting requests between steps and retires finished ones.

The nouns are nano-vllm's (`engine/scheduler.py`, `engine/sequence.py`): a `Sequence` is a
running request with its drafter's cache and its proposers; the scheduler keeps the running
ones in cache rows 0..B-1 of a `batch_target.BatchRunner` (the drafter's K/V in the same rows
of a `batch_draft.DraftRows`). A round (`batched_round`): the proposals (EAGLE-3 chains or
trees of every row in one drafter forward per step, `batch_draft`; DFlash blocks of every row in
one drafter forward, `dflash_rows`; any other `round.Proposer` each sequence's in turn over its
row's cache and pending positions), the
target verifies all B proposals in ONE forward at each row's own length, and each sequence
accepts by its proposal's own rule, commits, tells its proposer and emits. A sequence's output
depends on its own tokens only, so at T = 0 it is the target's greedy output
(tests/unit/engine/test_batch.py). K, the draft depth, is read per round from a
`schedule.BatchSchedule` for the batch size (vLLM's `num_speculative_tokens_per_batch_size`);
K = 0 decodes plainly while the drafter's pending positions grow, read by its first step when
K > 0 returns (`CatchUp`). A range the schedule gives a tree runs that tree; otherwise K equal
to the engine's own num_steps uses the engine's setting (a tree with a tree's engine), any
other K a chain (`BatchScheduler.setting`). Each request's metrics count its drafting
time (a share of a batched drafting round's) and the whole batch's verify time.
"""

from __future__ import annotations

import time
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field

import torch
from torch import Tensor

from specdraft.dflash import DFlashDraft
from specdraft.engine.batch_draft import DraftRows, draft_chains, draft_trees
from specdraft.engine.batch_target import BatchRunner
from specdraft.engine.dflash_block import DFlashBlock
from specdraft.engine.dflash_rows import DFlashRows, draft_blocks
from specdraft.engine.eagle import DraftCache, EagleChain
from specdraft.engine.eagle_tree import EagleTree, TreeProposal
from specdraft.engine.errors import EngineError
from specdraft.engine.kernels import fused_decode
from specdraft.engine.requests import GenerationResult, Request, SpecMetrics
from specdraft.engine.round import PlainDecoding, Proposer, free_nodes, prefill_request
from specdraft.engine.schedule import BatchSchedule, ScheduleError
from specdraft.engine.spec_config import SpecConfig
from specdraft.engine.speculate import SpeculativeEngine

ABORTED = "abort"  # the finish reason of a request `BatchScheduler.abort` removed (vLLM's)


class CatchUp(PlainDecoding):
    """The `round.Proposer` of a K = 0 round with a drafter: the root alone, as plain decoding,
    while the emitted tokens and their aux states join the drafter's pending positions, which
    the next drafted round's first step reads (so drafting resumes where it stopped)."""

    def __init__(self, chain: EagleChain | DFlashBlock) -> None:
        self.chain = chain

    def prefilled(self, req: Request, ids: Tensor, token: int, aux: Tensor | None) -> None:
        """The drafter's prefill bookkeeping (`EagleChain.prefilled`)."""
        self.chain.prefilled(req, ids, token, aux)

    def accepted(
        self, req: Request, emitted: list[int], path: Tensor | None, aux: Tensor | None
    ) -> None:
        """The emitted token [1] and its aux states [1, n_aux*H] appended to the pending ones
        (a DFlash drafter keeps no pending ids: its aux states only)."""
        if req.pending_ids is not None:
            ids = torch.tensor(emitted, device=req.pending_ids.device)
            req.pending_ids = torch.cat([req.pending_ids, ids])
        req.pending_aux = torch.cat([req.pending_aux, aux[: len(emitted)].to(req.pending_aux)])


@dataclass
class Sequence:
    """A running request: its drafter cache (None without a drafter; a DFlash drafter's: one per
    layer), its proposers by setting (None: K = 0), the time it was admitted
    (`time.perf_counter()`), the batch sizes it ran a round at."""

    req: Request
    cache: DraftCache | list[DraftCache] | None
    started: float
    proposers: dict[SpecConfig | None, Proposer] = field(default_factory=dict)
    sizes: set[int] = field(default_factory=set)


@dataclass
class BatchStats:
    """Per batch size: rounds run, the K last used, the sequences' verification counts, and the
    retired requests that ran a round at this size."""

    num_rounds: int = 0
    num_requests: int = 0
    num_steps: int = 0
    metrics: SpecMetrics = field(default_factory=SpecMetrics)


def propose_each(seqs: Seq[Sequence], proposers: Seq[Proposer]) -> tuple[list, list[float]]:
    """Each sequence's proposal from its own proposer, and the seconds each drafted."""
    proposals, t_draft = [], []
    for seq, proposer in zip(seqs, proposers):
        t0 = time.perf_counter()
        proposals.append(proposer.propose(seq.req))
        t_draft.append(time.perf_counter() - t0 if proposer.drafts else 0.0)
    return proposals, t_draft


def batched_round(
    seqs: Seq[Sequence],
    proposers: Seq[Proposer],
    runner: BatchRunner,
    drafted: tuple[list, list[float]] | None = None,
) -> list[tuple[int, int]]:
    """One round for every sequence (row b = seqs[b]): propose (`propose_each`, unless drafted
    gives the proposals and drafting times), each cut to its row's free slots
    (`round.free_nodes`), verify all in ONE forward, accept, commit, emit
    (`round.speculative_round`'s steps, per row; each proposer learns what its row accepted).
    Each request's metrics get its drafting time and the batch's verify time. Returns each
    row's (drafts, accepted drafts)."""
    proposals, t_draft = drafted or propose_each(seqs, proposers)
    room = [free_nodes(runner.max_seq_len, seq.req.length) for seq in seqs]
    proposals = [p.within(nodes) for p, nodes in zip(proposals, room)]
    t1 = time.perf_counter()
    logits, aux = runner.verify_batch(proposals, [seq.req.length for seq in seqs])
    emitted_rows = []
    for row, (seq, proposer, proposal) in enumerate(zip(seqs, proposers, proposals)):
        req, n = seq.req, proposal.tokens.numel()  # the row's nodes, before its pads
        emitted, path = proposal.accept(req, logits[row, :n])
        if path is not None:
            runner.commit_row(row, req.length, path)
        req.length += len(emitted)
        proposer.accepted(req, emitted, path, None if aux is None else aux[row, :n])
        emitted_rows.append(emitted)
    t2 = time.perf_counter()
    counts = [(p.num_drafts, len(emitted) - 1) for p, emitted in zip(proposals, emitted_rows)]
    for seq, count, emitted, drafting in zip(seqs, counts, emitted_rows, t_draft):
        metrics = seq.req.metrics
        metrics.time_draft_s += drafting
        metrics.time_verify_s += t2 - t1
        metrics.record_step(*count)
        seq.req.emit(emitted)
    return counts


class BatchScheduler:
    """Continuous batching over a `SpeculativeEngine`'s target and drafter (module docstring).

    engine: its target, drafter (or none), setting, limits and `new_request` (build requests
    there: it checks their lengths against the cache); max_num_seqs: the most sequences a round
    runs (cache rows); schedule: K by batch size, default the engine's num_steps (0 without a
    drafter) at every size up to max_num_seqs. The target's cache is (re)allocated for
    max_num_seqs rows here: run the engine's own `generate` only while this has no sequences.
    Raises EngineError for max_num_seqs < 1, ScheduleError when the schedule does not cover max_num_seqs or drafts deeper than
    the engine's num_steps (0 without a drafter). batch_drafts: draft every row's chain or tree
    in one drafter forward per step (`batch_draft`), else each sequence's in turn (its
    `EagleChain` / `EagleTree`); a proposer of another kind always proposes in turn. graphs:
    the verify forwards as one CUDA graph per (B, T) (`BatchRunner`'s graphs; a fast target).
    """

    def __init__(
        self,
        engine: SpeculativeEngine,
        max_num_seqs: int,
        schedule: BatchSchedule | None = None,
        batch_drafts: bool = True,
        graphs: bool = False,
    ) -> None:
        if max_num_seqs < 1:
            raise EngineError(f"max_num_seqs {max_num_seqs}: a batch needs at least 1 row")
        spec = engine.spec
        depth = spec.num_steps if spec is not None else 0
        self.schedule = schedule or BatchSchedule.constant(depth, max_num_seqs)
        self.schedule.check_depth(depth)
        check_topk(self.schedule, engine)
        if self.schedule.max_batch_size < max_num_seqs:
            raise ScheduleError(
                f"the schedule covers batch sizes 1..{self.schedule.max_batch_size}, "
                f"max_num_seqs is {max_num_seqs}: extend its last entry"
            )
        self.engine, self.spec, self.max_num_seqs = engine, spec, max_num_seqs
        static = engine.runner.graphed is not None  # compiled layers: static mask widths
        self.runner = BatchRunner(
            engine.target,
            engine.aux_layers,
            max_num_seqs,
            engine.max_seq_len,
            engine.device,
            static,
            graphs,
        )
        self.waiting: list[Request] = []
        self.dropped: list[Request] = []  # aborted while waiting: returned by the next step
        self.running: list[Sequence] = []  # row b = running[b]
        self.draft_rows = self.new_draft_rows(max_num_seqs) if engine.draft is not None else None
        self.batch_drafts = batch_drafts
        self.stats: dict[int, BatchStats] = {}  # by batch size

    @property
    def has_work(self) -> bool:
        """Whether a request waits, runs, or waits to be returned."""
        return bool(self.waiting or self.running or self.dropped)

    def add(self, req: Request) -> None:
        """Queue a request (from `engine.new_request`); it joins at the next `step`."""
        self.waiting.append(req)

    def abort(self, req: Request) -> None:
        """Stop a waiting or running request (finish reason "abort"); the next step returns it."""
        if any(r is req for r in self.waiting):
            self.waiting = [r for r in self.waiting if r is not req]
            self.dropped.append(req)
        req.finish_reason = req.finish_reason or ABORTED

    @torch.inference_mode()
    def step(self) -> list[tuple[Request, GenerationResult]]:
        """Admit waiting requests (each prefilled, its first token emitted), run one batched
        round for every running sequence, and retire the finished ones: their results."""
        self.runner.check_cache(len(self.running))
        finished = [(req, req.finish(time.perf_counter())) for req in self.dropped]
        self.dropped = []
        self.admit()
        finished += self.retire()
        if self.running:
            spec = self.setting(len(self.running))
            proposers = [self.proposer(seq, spec) for seq in self.running]
            drafted = self.draft_together(spec, proposers) if self.batch_drafts else None
            counts = batched_round(self.running, proposers, self.runner, drafted)
            self.record(spec.num_steps if spec else 0, counts)
        return finished + self.retire()

    def run(self) -> list[tuple[Request, GenerationResult]]:
        """`step` until no request waits or runs: every result, in the order they finished."""
        results = []
        while self.has_work:
            results += self.step()
        return results

    def admit(self) -> None:
        """Move waiting requests into the batch while rows are free: row 0's sequence moves to
        row B (`BatchRunner.move`), the new one is prefilled at row 0."""
        while self.waiting and len(self.running) < self.max_num_seqs:
            req = self.waiting.pop(0)
            if self.running:
                self.running.append(self.running[0])
                self.move(0, len(self.running) - 1)
            seq = Sequence(req, self.row_cache(0), time.perf_counter())
            self.running[:1] = [seq]
            proposer = self.proposer(seq, self.setting(len(self.running)))
            req.emit([prefill_request(req, proposer, self.runner, self.engine.device)])

    def retire(self) -> list[tuple[Request, GenerationResult]]:
        """Remove the finished sequences, each row refilled by the last row (`BatchRunner.move`):
        their results."""
        done = []
        for row in reversed(range(len(self.running))):
            seq = self.running[row]
            if seq.req.finish_reason is None:
                continue
            if row < len(self.running) - 1:
                self.running[row] = self.running[-1]
                self.move(len(self.running) - 1, row)
            self.running.pop()
            for size in seq.sizes:
                self.stats[size].num_requests += 1
            done.append((seq.req, seq.req.finish(seq.started)))
        return done[::-1]

    def record(self, k: int, counts: list[tuple[int, int]]) -> None:
        """Count a round run at K = k over the batch: each row's (drafts, accepted drafts)."""
        stats = self.stats.setdefault(len(counts), BatchStats())
        stats.num_rounds, stats.num_steps = stats.num_rounds + 1, k
        for count in counts:
            stats.metrics.record_step(*count)
        for seq in self.running:
            seq.sizes.add(len(counts))

    def move(self, src: int, dst: int) -> None:
        """The sequence now at running[dst] moves from cache row src to row dst: its target
        K/V, its drafter's K/V and cache (its proposers rebuilt over the new row's)."""
        seq = self.running[dst]
        self.runner.move(src, dst, seq.req.length)
        if self.draft_rows is not None:
            self.draft_rows.move(src, dst)
        seq.cache, seq.proposers = self.row_cache(dst), {}

    def row_cache(self, row: int) -> DraftCache | list[DraftCache] | None:
        """The drafter's cache of a row (None without a drafter; a DFlash drafter's per layer)."""
        if self.draft_rows is None:
            return None
        if isinstance(self.draft_rows, DFlashRows):
            return self.draft_rows.row(row)
        return self.draft_rows.caches[row]

    def new_draft_rows(self, rows: int) -> DraftRows:
        """The drafter's K/V for `rows` rows: max_seq_len entries each plus the widest round's
        scratch of the engine's and the schedule's settings and `GraphedDraft`'s capture entries
        (the last one the pads' of a batched first step)."""
        engine = self.engine
        if isinstance(engine.draft, DFlashDraft):  # the context: an entry per position
            return DFlashRows(engine.draft, rows, engine.max_seq_len, engine.device)
        cfg, settings = engine.draft.cfg, [self.spec, *self.schedule.settings()]
        scratch = max((spec.num_steps - 1) * spec.topk for spec in settings)
        length = self.engine.max_seq_len + scratch + fused_decode.MAX_TOKENS
        dtype = self.engine.draft.fc.weight.dtype
        return DraftRows(
            cfg.num_key_value_heads, cfg.head_dim, rows, length, dtype, self.engine.device
        )

    def draft_together(
        self, spec: SpecConfig | None, proposers: list
    ) -> tuple[list, list[float]] | None:
        """Every row's chain of spec's drafts in num_steps drafter forwards
        (`batch_draft.draft_chains`), or its tree in num_steps (`draft_trees`, through its
        proposer's expansion), the drafting time shared by the rows; None where the rows
        propose in turn (no drafter, or K = 0)."""
        if self.draft_rows is None or spec is None:
            return None
        t0, engine, reqs = time.perf_counter(), self.engine, [seq.req for seq in self.running]
        fast, k = getattr(engine, "fast_draft", None), spec.num_steps
        if isinstance(self.draft_rows, DFlashRows):
            proposals = draft_blocks(proposers, reqs, self.draft_rows, k)
        elif spec.is_chain:
            vocab, vocab_size = engine.draft_vocab, engine.target.args.vocab_size
            proposals = draft_chains(fast, self.draft_rows, reqs, k, vocab, vocab_size)
        else:
            expansions = [p.expansion(req) for p, req in zip(proposers, reqs)]
            trees = draft_trees(fast, self.draft_rows, reqs, expansions, k, spec.num_draft_tokens)
            proposals = [TreeProposal.of(tree) for tree in trees]
        share = (time.perf_counter() - t0) / len(reqs)
        return proposals, [share] * len(reqs)

    def setting(self, batch_size: int) -> SpecConfig | None:
        """The setting of a round of batch_size sequences (None: K = 0): the schedule's tree
        for that size, else the engine's setting at its num_steps, else a chain of K."""
        spec = self.schedule.setting(batch_size)
        if spec is not None and spec.is_chain and spec.num_steps == self.spec.num_steps:
            return self.spec
        return spec

    def proposer(self, seq: Sequence, spec: SpecConfig | None) -> Proposer:
        """seq's proposer for the setting (built once per setting): plain decoding without a
        drafter, `CatchUp` at K = 0 (spec None), else an `EagleChain` or `EagleTree`."""
        if spec not in seq.proposers:
            seq.proposers[spec] = self.new_proposer(seq, spec)
        return seq.proposers[spec]

    def new_proposer(self, seq: Sequence, spec: SpecConfig | None) -> Proposer:
        """A proposer over seq's drafter cache (`proposer`)."""
        if seq.cache is None:
            return PlainDecoding()
        engine, setting = self.engine, spec or SpecConfig.chain(1)
        if isinstance(engine.draft, DFlashDraft):
            block = DFlashBlock(engine.draft, setting, engine.max_seq_len, engine.device, seq.cache)
            return CatchUp(block) if spec is None else block
        kind = EagleChain if setting.is_chain else EagleTree
        args = (engine.draft_vocab, engine.target.args.vocab_size, self.runner)
        proposer = kind(engine.fast_draft, seq.cache, setting, *args)
        return CatchUp(proposer) if spec is None else proposer


def check_topk(schedule: BatchSchedule, engine: SpeculativeEngine) -> None:
    """Raise ScheduleError when a tree of the schedule has a topk past the draft vocabulary, or
    the drafter is a DFlash one (chains only: `dflash_block.block_problems`)."""
    if engine.draft is None:
        return
    if isinstance(engine.draft, DFlashDraft):
        trees = [spec for spec in schedule.settings() if not spec.is_chain]
        if trees:
            raise ScheduleError(
                f"the schedule runs a tree (topk {trees[0].topk}); a DFlash drafter proposes "
                "chains only: drop the schedule's trees"
            )
        return
    vocab = engine.draft.cfg.draft_vocab_size
    for spec in schedule.settings():
        if spec.topk > vocab:
            raise ScheduleError(
                f"the schedule's tree of topk {spec.topk} exceeds the draft vocabulary {vocab}: "
                f"use topk <= {vocab}"
            )
