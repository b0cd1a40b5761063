"""Greedy rounds, chains and trees, with the host one round ahead of the GPU (what
`GraphedTarget.decode_ahead` does for plain decoding).

`SpeculativeEngine.step` ends a round by reading the verdict back: from that sync until the
next round's draft graph is launched (accept, commit, emit, the launch) the GPU idles. Here the
verdict is taken on the device and the next round reads it there, so round k + 1 is launched
before round k's verdict is read and the host's bookkeeping hides behind the GPU's work. A round
is two graph replays:
- the draft round from device state (`GraphedRound.round`, padded: `rows` = min(num_steps + 1,
  num_draft_tokens) rows, the most positions a verdict can leave pending, of which the first
  `count` are), which selects the tree (a chain: every node) and writes the verify's inputs;
- the target's forward over the nodes, then the greedy verdict (a tree's: `verify_greedy`'s walk
  in one Triton launch, `kernels.greedy_walk`, over the parents the round selected; a chain's:
  the longest prefix of drafts equal to the target's argmax before them, a few ops) and the
  state the next round reads: a
  tree's accepted path moved to contiguous target cache slots (one gather over `kv_stack`, as
  `FastTarget.compact_cache`; a chain's path is its first nodes, in place already), pending ids
  (the argmax at every path node: the accepted drafts, then the bonus), their aux states, their
  count, the draft cache's start (a tree's round, like a chain's, commits its pending positions
  there and drafts in scratch entries after them, which the next round's positions overwrite).
The host reads [the path's argmaxes..., accepted, ok] per round and keeps the request's books
(emit, stop conditions, lengths). Greedy only: a sampled verdict draws from the request's
generator on the host.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence

import torch

from specdraft.engine.draft_round import GraphedRound
from specdraft.engine.fast_model import FastTarget
from specdraft.engine.graphs import capture_graph
from specdraft.engine.requests import Request
from specdraft.engine.round import free_nodes
from specdraft.engine.spec_config import SpecConfig


def padded_rows(spec: SpecConfig) -> int:
    """The rows of a padded draft round: the most positions one verdict leaves pending (the
    accepted path's nodes, root included), min(num_steps + 1, num_draft_tokens)."""
    return min(spec.num_steps + 1, spec.num_draft_tokens)


class RoundsAhead:
    """Greedy decoding after the first round, round k + 1 launched before round k's verdict is
    read (see the module docstring); a chain is the tree whose node i's parent is i - 1.

    rounds: the engine's `GraphedRound`; target: the FastTarget it verifies with (aux_layers:
    specdraft indices, the drafter's); max_seq_len: the target cache's size (the verify mask's
    width). The draft round's graph is captured here, the verify's on the first `run` after the
    target's cache is (re)built. Both warm up on cache entries the request does not hold: the
    draft cache's last ones, the target cache's last num_draft_tokens slots (`run` starts only
    where a round fits before them).
    """

    def __init__(
        self, rounds: GraphedRound, target: FastTarget, aux_layers: Sequence[int], max_seq_len: int
    ) -> None:
        cache, spec = rounds.cache, rounds.spec
        n, rows, device = spec.num_draft_tokens, padded_rows(spec), cache.k.device
        self.rounds, self.target, self.aux_layers = rounds, target, tuple(aux_layers)
        self.n, self.rows, self.tree = n, rows, spec.topk > 1
        self.max_seq_len, self.scratch = max_seq_len, rounds.scratch
        # the state a draft round reads: pending ids [rows] and aux states [rows, n_aux*H] (the
        # first `count` are pending), count [1], start [1] (the draft cache's committed entries)
        self.ids = torch.zeros(rows, dtype=torch.long, device=device)
        self.aux = torch.zeros(
            rows, rounds.fast.fc.shape[1], dtype=rounds.fast.fc.dtype, device=device
        )
        self.count = torch.ones(1, dtype=torch.long, device=device)
        self.start = torch.zeros(1, dtype=torch.long, device=device)
        self.inputs = [
            torch.zeros(1, n, dtype=torch.long, device=device),
            torch.zeros(1, n, dtype=torch.long, device=device),
            torch.zeros(n, dtype=torch.long, device=device),
            torch.zeros(1, 1, n, max_seq_len, dtype=torch.bool, device=device),
        ]
        self.selected = torch.ones(
            1, dtype=torch.bool, device=device
        )  # the round's selection is a tree
        self.parents = torch.full(
            (n,), -1, dtype=torch.long, device=device
        )  # a tree's, as the round selected them
        self.verdict = torch.zeros(
            rows + 2, dtype=torch.long, device=device
        )  # argmaxes [rows], accepted, ok
        cuda = device.type == "cuda"
        self.host = torch.zeros(
            2, rows + 2, dtype=torch.long, pin_memory=cuda
        )  # two rounds in flight
        self.ready = [torch.cuda.Event() for _ in range(2)] if cuda else None
        self.timing = (
            [[torch.cuda.Event(enable_timing=True) for _ in range(2)] for _ in range(2)]
            if cuda
            else None
        )
        self.draft_graph = capture_graph(self.draft, reset=self.park)[0]
        self.verify_graphs: dict[int, torch.cuda.CUDAGraph] = {}  # by the target cache's address

    def draft(self) -> None:
        """The captured draft round: from the state, writing the verify's inputs."""
        out = self.rounds.round(self.ids, self.aux, self.start, self.count, self.inputs)
        if (
            self.tree
        ):  # (parents, scores, ok): ok False when the selection kept a node without its parent
            self.parents.copy_(out[0])
            self.selected.copy_(out[2])

    def verify(self) -> None:
        """The captured verify: the target's forward over the nodes, the greedy verdict, a tree's
        accepted path compacted in the target's cache, the next round's state and the verdict
        for the host."""
        input_ids, _, slots, _ = self.inputs
        out = self.target(*self.inputs, self.aux_layers)
        choices, aux = out.logits[0].argmax(-1), out.aux_hidden[0]  # [n], [n, n_aux*H]
        if self.tree:
            from specdraft.engine.kernels import (
                greedy_walk,
            )  # Triton: the interpreter without a GPU

            path, accepted, ok = greedy_walk.greedy_path(
                input_ids[0], self.parents, choices, self.rows
            )
            # the path's K/V to slots prefix + 0..rows-1, gathered first (sources overlap them); the
            # slots past its end get the root's, which the next verify overwrites
            stack = self.target.kv_stack
            stack.index_copy_(4, slots[: self.rows], stack.index_select(4, slots[path]))
            choices, aux = choices[path], aux[path]
        else:  # a chain's path is its first nodes (rows = n, in place): the drafts equal to the choice before them
            accepted = (input_ids[0, 1:] == choices[:-1]).long().cumprod(0).sum(0, keepdim=True)
            ok = self.selected
        self.start.add_(self.count)
        self.count.copy_(accepted + 1)
        self.ids.copy_(choices)
        self.aux.copy_(aux)
        self.verdict.copy_(torch.cat([self.ids, accepted, (ok & self.selected).long()]))

    def park(self) -> None:
        """State and verify inputs for a warm-up or capture: draft entries and target slots that
        no request commits (the caches' last ones)."""
        n = self.n
        self.ids.zero_()
        self.count.fill_(self.rows)
        self.start.fill_(self.rounds.cache.max_len - self.rows - self.scratch)
        slots = torch.arange(self.max_seq_len - n, self.max_seq_len, device=self.ids.device)
        self.inputs[0].zero_()
        self.inputs[1][0].copy_(slots)
        self.inputs[2].copy_(slots)
        self.inputs[3].fill_(True)

    def verify_graph(self) -> torch.cuda.CUDAGraph:
        """The verify's graph for the target's current cache, captured on first use."""
        key = self.target.kv_stack.data_ptr()
        if key not in self.verify_graphs:
            self.verify_graphs[key] = capture_graph(self.verify, reset=self.park)[0]
        return self.verify_graphs[key]

    def launch(self, slot: int, start: int) -> None:
        """Queue one round (its draft at draft cache entry `start`) and the copy of its verdict
        to host slot `slot`."""
        self.rounds.cache.check_write(start, self.rows + self.scratch)
        verify = self.verify_graph()
        if self.timing is not None:
            self.timing[slot][0].record()
        self.draft_graph.replay()
        if self.timing is not None:
            self.timing[slot][1].record()
        verify.replay()
        self.host[slot].copy_(self.verdict, non_blocking=True)
        if self.ready is not None:
            self.ready[slot].record()

    def run(self, req: Request) -> None:
        """Decode a greedy request after its first round (`SpeculativeEngine.step`: at most
        `rows` positions pending) while a whole round fits the cache's free slots
        (`round.free_nodes`), then hand its pending positions back (`req.pending_ids` /
        `pending_aux`) to the eager rounds that end it with fewer nodes. Two rounds in flight:
        round k + 1 is launched before round k's verdict is read whenever round k cannot end
        the request by length (it emits at most `rows` tokens) and round k + 1 fits even after
        round k's most; one launched ahead of an EOS or stop string writes entries no one
        reads, and is dropped. Raises RuntimeError when a round's nodes were no tree (see
        `read`)."""
        if not self.fits(req, 0):  # before a capture: its warm-ups write the cache's last slots
            return
        self.verify_graph()  # captured before the state is set: its warm-up moves the state
        cache, pending = self.rounds.cache, req.pending_ids.numel()
        self.ids[:pending].copy_(req.pending_ids)
        self.aux[:pending].copy_(req.pending_aux)
        self.count.fill_(pending)
        self.start.fill_(cache.length)
        # [slot, start, pending] per round launched and not read, oldest first; every older round
        # is read, so the oldest one's pending count is known (None: the round before it decides)
        flights: deque[list] = deque()
        slot, clock, drafting = 0, time.perf_counter(), 0.0
        while req.finish_reason is None:
            ahead = (
                len(req.output_ids) + self.rows < req.max_new_tokens
            )  # the oldest cannot end it by length
            while len(flights) < (2 if ahead else 1) and self.fits(req, len(flights)):
                start = cache.length if not flights else flights[-1][1] + flights[-1][2]
                flights.append([slot, start, None if flights else pending])
                self.launch(slot, start)
                slot = 1 - slot
            if not flights:  # the cache's end is near: the eager rounds cut their nodes
                req.pending_ids, req.pending_aux = (
                    self.ids[:pending].clone(),
                    self.aux[:pending].clone(),
                )
                break
            done, _, done_pending = flights.popleft()
            pending, seconds = self.read(req, done, done_pending)
            drafting += seconds
            if flights:
                flights[0][2] = pending
        req.metrics.time_draft_s += drafting
        req.metrics.time_verify_s += time.perf_counter() - clock - drafting

    def fits(self, req: Request, in_flight: int) -> bool:
        """Whether a whole round fits the cache's free slots after the in_flight rounds launched
        and not read emit their most (`rows` tokens each)."""
        return free_nodes(self.max_seq_len, req.length + in_flight * self.rows) >= self.n

    def read(self, req: Request, slot: int, pending: int) -> tuple[int, float]:
        """Wait for the round in host slot `slot` (its draft round read `pending` positions),
        then keep its books: the draft cache's committed entries, the target's length, the
        metrics, the emitted tokens. Returns (the next round's pending positions, the round's
        draft GPU seconds). Raises RuntimeError when the round's selection kept a node without
        its parent or two siblings carried the target's choice (what `read_selected` and
        `sampling.children_of` raise for)."""
        if self.ready is not None:
            self.ready[slot].synchronize()
        values = self.host[slot].tolist()
        accepted, ok = values[self.rows], values[self.rows + 1]
        if not ok:
            raise RuntimeError(
                "draft tree of a round run ahead is no tree of distinct siblings: a node kept "
                "without its parent (scores not monotone along paths) or two siblings with one token"
            )
        self.rounds.cache.commit(pending)
        req.length += accepted + 1
        req.metrics.record_step(self.n - 1, accepted)
        req.emit(values[: accepted + 1])
        seconds = (
            self.timing[slot][0].elapsed_time(self.timing[slot][1]) / 1e3
            if self.timing is not None
            else 0.0
        )
        return accepted + 1, seconds
