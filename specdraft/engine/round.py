"""The speculative round, batch 1: propose -> verify -> accept -> commit (`speculative_round`).

Two interfaces meet in it, each a `typing.Protocol`:
- a `Proposer` drafts the tokens one target forward checks (a `Proposal`: a chain, a tree or a
  block) and learns what the target accepted: `eagle.EagleChain`, `eagle_tree.EagleTree`, and
  `PlainDecoding` (no drafts: the same round is one decode step);
- a `Target` runs the prompt and the verify forwards and keeps the accepted path's K/V:
  `TargetRunner` (a `fast_model.FastTarget`, eager or CUDA graphs once compiled, or a
  transformers model behind `hf_target.HFTarget`).
The acceptance rule belongs to the proposal (`Proposal.accept`: a chain's, a tree's in
`eagle_tree`), so a new method adds classes, not branches in the round. Metrics and emitted
tokens go to the `requests.Request`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from specdraft.engine import sampling
from specdraft.engine.fast_model import FastTarget, causal_mask
from specdraft.engine.graphs import GraphedTarget
from specdraft.engine.requests import Request
from specdraft.engine.sampling import logits_to_probs
from specdraft.engine.tree import verify_mask


@dataclass
class Proposal:
    """The nodes one verify forward checks; as it is, a chain (node i's parent is i - 1).

    tokens:      [N] long target ids, root first (tokens[0] = the last emitted token, not yet
                 in the target's cache), on the engine device (the CPU for plain decoding).
    depths:      [N] long on the CPU, each node's depth (RoPE position = the root's + depth);
                 None for a chain (0..N-1).
    ancestors:   [N, N] bool on the CPU, [i, j] True iff j is i or an ancestor of i; None when
                 the nodes attend causally (a chain).
    draft_probs: [N-1, V] float32, the q each draft was drawn from (a sampled chain), else None.
    num_drafts:  N - 1, the drafts counted by the metrics.
    in_place:    the verify's inputs are on the device already (a graphed tree round wrote
                 `TargetRunner.verify_inputs(N)`; tokens is their [N] view).
    """

    tokens: Tensor
    depths: Tensor | None
    ancestors: Tensor | None
    draft_probs: Tensor | None
    num_drafts: int
    in_place: bool = False

    def within(self, num_nodes: int) -> Proposal:
        """This chain cut to its first num_nodes >= 1 nodes (root included), their q with them;
        itself when it has no more (`free_nodes`: a round near the cache's end)."""
        if self.tokens.numel() <= num_nodes:
            return self
        probs = None if self.draft_probs is None else self.draft_probs[: num_nodes - 1]
        return Proposal(self.tokens[:num_nodes], None, None, probs, num_nodes - 1)

    def accept(self, req: Request, logits: Tensor) -> tuple[list[int], Tensor | None]:
        """The rule that keeps a chain lossless (see `sampling`), on the target's logits [N, V]
        float32 (row i: after node i). Greedy: the longest prefix of drafts equal to the
        target's argmax before them, then the argmax after it (`sampling.verify_greedy` on a
        chain); T > 0 with q: `sampling.verify_chain`; without q (plain decoding, a block
        proposer): target-only, `sampling.verify_tree`. Returns the emitted tokens (the
        accepted drafts, then the bonus) and the accepted path's node ids [a + 1] long on the
        device when they are not 0..a (a chain's never: None)."""
        tokens = self.tokens.tolist()
        if req.greedy:
            choices = logits.argmax(-1).tolist()
            n = 1
            while n < len(tokens) and tokens[n] == choices[n - 1]:
                n += 1
            return tokens[1:n] + [choices[n - 1]], None
        probs, generator = logits_to_probs(logits, req.params), req.generator
        if self.draft_probs is None:
            parents = list(range(-1, len(tokens) - 1))
            verdict = sampling.verify_tree(parents, tokens, probs, generator)
        else:
            verdict = sampling.verify_chain(probs, self.draft_probs, self.tokens[1:], generator)
        return tokens[1 : len(verdict.accepted) + 1] + [verdict.bonus], None


class Proposer(Protocol):
    """Drafts each round's proposal and keeps its own state (a drafter's cache, pending aux
    states) in step with what the target accepted.

    drafts: whether its proposals hold drafts (False: plain decoding, whose round time is the
    verify's). timed: whether `drafting` has a GPU time to report for the last proposal.
    """

    drafts: bool
    timed: bool

    def prefilled(self, req: Request, ids: Tensor, token: int, aux: Tensor | None) -> None:
        """The prompt ids [n] long ran through the target (aux states [n, n_aux*H] or None);
        token is the first generated one."""

    def propose(self, req: Request) -> Proposal:
        """The nodes to verify after req.output_ids[-1] (the root), at cache slot req.length."""

    def accepted(
        self, req: Request, emitted: list[int], path: Tensor | None, aux: Tensor | None
    ) -> None:
        """The round kept `emitted` (accepted drafts, then the bonus): path as
        `Proposal.accept` returns it, aux the verify's aux states [N, n_aux*H] (or None)."""

    def drafting(self, elapsed: float) -> float:
        """Seconds of the last proposal's GPU work that ran behind the host, of elapsed."""


class Target(Protocol):
    """The target model of a round: its prompt forward, its verify forward, and the K/V it keeps.

    Every forward writes its tokens' K/V at cache slots start..start+N-1 and returns logits
    [N, V] float32 and the aux states [N, n_aux*H] the drafter reads (None without a drafter).
    max_seq_len: the cache's slots (`free_nodes`).
    """

    max_seq_len: int

    def prefill(self, ids: Tensor) -> tuple[Tensor, Tensor | None]:
        """The prompt ids [n] long at slots 0..n-1, causally."""

    def verify(self, proposal: Proposal, start: int) -> tuple[Tensor, Tensor | None]:
        """The proposal's nodes at slots start.., positions start + depth, each node seeing the
        prefix, its ancestors and itself (a chain: causal)."""

    def commit(self, start: int, path: Tensor) -> None:
        """Keep the K/V of the accepted nodes path [a + 1] long (slots start + path) at slots
        start..start+a. Called only when path is not 0..a: those are in place already."""


def speculative_round(req: Request, proposer: Proposer, target: Target) -> None:
    """One round: propose, verify in ONE target forward, accept, commit; then emit. The
    proposal is cut to the cache's free slots (`free_nodes`). Times go to req.metrics
    (drafting, verifying: a graphed draft round's GPU time, spent while the host went on to the
    verify, counts as drafting), with the step's counts."""
    t0 = time.perf_counter()
    proposal = proposer.propose(req)
    if req.length + proposal.tokens.numel() >= target.max_seq_len:  # would reach the last slot
        proposal = proposal.within(free_nodes(target.max_seq_len, req.length))
    t1 = time.perf_counter()
    logits, aux = target.verify(proposal, req.length)
    emitted, path = proposal.accept(req, logits)
    if path is not None:
        target.commit(req.length, path)
    req.length += len(emitted)
    proposer.accepted(req, emitted, path, aux)
    t2 = time.perf_counter()
    drafting = proposer.drafting(t2 - t1) if proposer.timed else 0.0
    if proposer.drafts:  # plain decoding's root is bookkeeping ("other"), not drafting
        req.metrics.time_draft_s += t1 - t0 + drafting
    req.metrics.time_verify_s += t2 - t1 - drafting
    req.metrics.record_step(proposal.num_drafts, len(emitted) - 1)
    req.emit(emitted)


def free_nodes(max_seq_len: int, length: int) -> int:
    """The most nodes (root included) a round verifies over a cache of max_seq_len slots holding
    length: those before its last slot, max_seq_len - 1 - length, the cap vLLM's v1 scheduler
    puts on a step's tokens (v1/core/sched/scheduler.py: max_model_len - 1 -
    num_computed_tokens). A request of prompt + max_new_tokens = max_seq_len then fits: its
    rounds before the last token write slots up to max_seq_len - 2 and are cut near the end
    (the last one, one token left, verifies the root alone: a plain step); the last slot stays
    free for what writes past a request's end (a batch's pads, a plain step run ahead)."""
    return max_seq_len - 1 - length


def prefill_request(req: Request, proposer: Proposer, target: Target, device: torch.device) -> int:
    """Run req's prompt through the target (`Target.prefill`) and tell the proposer; return the
    first generated token (sampled with req's settings), req.length the prompt's."""
    t0 = time.perf_counter()
    ids = torch.tensor(req.prompt_ids, device=device)
    logits, aux = target.prefill(ids)
    token = int(sampling.sample(logits_to_probs(logits[-1], req.params), req.generator))
    req.length = len(req.prompt_ids)
    proposer.prefilled(req, ids, token, aux)
    req.metrics.time_prefill_s += time.perf_counter() - t0
    return token


class PlainDecoding:
    """The `Proposer` of plain decoding: no drafts, the root alone (on the CPU, where its token
    is known and the target's inputs are staged), so a round is one decode step."""

    drafts = timed = False

    def prefilled(self, req: Request, ids: Tensor, token: int, aux: Tensor | None) -> None:
        """Nothing to keep."""

    def propose(self, req: Request) -> Proposal:
        """The root alone."""
        return Proposal(torch.tensor([req.output_ids[-1]]), None, None, None, 0)

    def accepted(
        self, req: Request, emitted: list[int], path: Tensor | None, aux: Tensor | None
    ) -> None:
        """Nothing to keep."""

    def drafting(self, elapsed: float) -> float:
        """No drafting."""
        return 0.0


class TargetRunner:
    """The target forwards of one engine: a FastTarget whose cache this runner (re)allocates
    for batch 1 and max_seq_len, with aux_layers (specdraft indices) read on every forward;
    eager until `compile` (CUDA only), then decode and verify forwards replay CUDA graphs
    (`graphs.GraphedTarget`)."""

    max_batch_size = 1  # cache rows (`batch_target.BatchRunner`: a batch's)

    def __init__(
        self,
        target: FastTarget,
        aux_layers: tuple[int, ...],
        max_seq_len: int,
        device: torch.device,
    ) -> None:
        self.target, self.aux_layers, self.max_seq_len, self.device = (
            target,
            aux_layers,
            max_seq_len,
            device,
        )
        self.graphed: GraphedTarget | None = None
        # `hf_target.HFTarget` reads the mask and slots on the host: its inputs are not copied
        self.host_inputs = getattr(target, "host_inputs", False)
        self.verify_buffers: list[Tensor] | None = None  # `verify_inputs` of a runner not compiled
        target.setup_cache(self.max_batch_size, max_seq_len, device=device)

    def compile(self) -> str:
        """Compile each target layer (torch.compile, in place), run forwards of up to 64 tokens
        through the Triton kernels where the target allows, and replay decode / verify forwards
        as CUDA graphs from now on. Returns which kernels run: "triton", or "torch (why not)"."""
        for layer in self.target.layers:
            layer.compile()
        self.graphed = GraphedTarget(self.target, self.aux_layers)
        reason = self.target.use_triton()
        return "triton" if reason is None else f"torch ({reason})"

    def reserve(self) -> None:
        """Rebuild the target's cache for this runner when another user (another engine on the
        same target) reallocated it."""
        wanted = (self.max_batch_size, self.max_seq_len)
        if (self.target.max_batch_size, self.target.max_seq_len) != wanted:
            self.target.setup_cache(*wanted, device=self.device)

    def mask_width(self, num_slots: int) -> int:
        """Columns of a target mask whose tokens use cache slots 0..num_slots-1: just those (the
        target attends over no more), or max_seq_len when compiled (static shapes for the
        compiled layers and CUDA graphs)."""
        return self.max_seq_len if self.graphed is not None else num_slots

    def prefill(self, ids: Tensor) -> tuple[Tensor, Tensor | None]:
        """`Target.prefill`: the prompt ids [n] long (on the engine device) at slots 0..n-1,
        eagerly, after rebuilding the target's cache if another user reallocated it."""
        self.reserve()
        n = ids.numel()
        mask = causal_mask(0, n, self.mask_width(n), device=self.device)
        return self.forward(ids, torch.arange(n, device=self.device), 0, mask)

    def verify(self, proposal: Proposal, start: int) -> tuple[Tensor, Tensor | None]:
        """`Target.verify`: the proposal's inputs, positions and mask built on the host (a
        graphed target stages them in one copy), then a graph replay once compiled; a graphed
        tree round's inputs in place (`forward_in_place`)."""
        tokens = proposal.tokens
        if proposal.in_place:
            return self.forward_in_place(self.verify_inputs(tokens.numel()))
        n = tokens.numel()
        width = self.max_seq_len if self.graphed is not None else start + n
        if proposal.ancestors is None:  # node i sees slots 0..start+i (a comparison: tril
            # splits a few rows across every CPU thread, costly on a many-core host)
            mask = causal_mask(start, n, width)
        else:
            mask = verify_mask(proposal.ancestors, start, width)
        depths = proposal.depths
        positions = torch.arange(start, start + n) if depths is None else start + depths
        return self.forward(tokens, positions, start, mask, graphed=True)

    def commit(self, start: int, path: Tensor) -> None:
        """`Target.commit`: the path's K/V moved to contiguous slots (`compact_cache`)."""
        self.target.compact_cache(path + start, start)

    def forward(
        self, tokens: Tensor, positions: Tensor, start: int, mask: Tensor, graphed: bool = False
    ) -> tuple[Tensor, Tensor | None]:
        """Target forward of T tokens written at slots start..start+T-1: logits [T, V] float32,
        aux states [T, n_aux*H] (None in plain decoding). tokens [T], positions [T] long and
        mask [1, 1, T, S] bool on the CPU or the engine device. graphed: replay a CUDA graph
        after `compile` (decode and verify: few distinct T); its inputs on the CPU are staged in
        one copy."""
        slots = torch.arange(start, start + tokens.numel())
        inputs = (tokens[None], positions[None], slots, mask)
        if graphed and self.graphed is not None:
            out = self.graphed(*inputs, self.aux_layers)
        elif self.host_inputs:
            out = self.target(*inputs, self.aux_layers)
        else:
            out = self.target(*(x.to(self.device) for x in inputs), self.aux_layers)
        return out.logits[0], None if out.aux_hidden is None else out.aux_hidden[0]

    def verify_inputs(self, n: int) -> list[Tensor]:
        """A tree verify's inputs as device tensors that a graphed round writes in place
        (`GraphedRound`): input_ids [1, N], position_ids [1, N], cache_slots [N] long, attn_mask
        [1, 1, N, max_seq_len] bool (N = n, the num_draft_tokens). Compiled: the verify graph's
        own (`GraphedTarget.device_inputs`: captured on first use and again after the target's
        cache was rebuilt, at the same addresses); else buffers of this runner (tests)."""
        if self.graphed is not None:
            return self.graphed.device_inputs(n, self.max_seq_len)
        if self.verify_buffers is None:
            self.verify_buffers = [
                torch.zeros(shape, dtype=dtype, device=self.device)
                for shape, dtype in (
                    ((1, n), torch.long),
                    ((1, n), torch.long),
                    ((n,), torch.long),
                    ((1, 1, n, self.max_seq_len), torch.bool),
                )
            ]
        return self.verify_buffers

    def forward_in_place(self, inputs: Sequence[Tensor]) -> tuple[Tensor, Tensor | None]:
        """`forward` of inputs already on the device (`verify_inputs`): logits [N, V],
        aux states [N, n_aux*H]; a graphed target replays with no copy."""
        out = (self.graphed if self.graphed is not None else self.target)(*inputs, self.aux_layers)
        return out.logits[0], None if out.aux_hidden is None else out.aux_hidden[0]

    def device_input_ids(self, n: int) -> Tensor | None:
        """The compiled verify graph's input_ids [1, n] on the device, which the drafter writes
        its tree into (`GraphedTarget.device_input_ids`), or None when not compiled."""
        return None if self.graphed is None else self.graphed.device_input_ids(n, self.max_seq_len)
