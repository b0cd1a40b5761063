"""A whole drafting round as one CUDA graph (what SGLang's EAGLE draft CUDA-graph runner captures).

Step by step, a round makes about twenty host calls a draft step besides the step's own graph
(`GraphedDraft`): the step's input copies, then the expansion's log-softmax, top-k, score sums,
vocabulary map and tree bookkeeping (`tree.TreeExpansion`); the host, not the GPU, then sets
the pace. `GraphedRound` captures the first step, every later step and every expansion in one
graph per number of pending positions, so a round is three input copies and one launch. For a
tree the graph also selects the verified nodes and writes the verify forward's inputs (tokens,
positions, slots, mask) into the verify graph's own buffers (`tree.select_on_device`,
`GraphedTarget.device_inputs`), so the target's verify is launched right behind the round and
the host first waits for the device when it reads the verdict's inputs back. Same τ and
outputs as the round step by step; speed: benchmarks/RESULTS.md.

Greedy expansion only (top-k children: trees at any temperature, chains at T = 0); a chain at
T > 0 samples its drafts from a generator each step and runs step by step.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import Tensor

from specdraft.engine.eagle import DraftCache, DraftStep, FastDraft, draft_step
from specdraft.engine.graphs import capture_graph
from specdraft.engine.kernels import fused_decode
from specdraft.engine.sampling import SamplingParams
from specdraft.engine.spec_config import SpecConfig
from specdraft.engine.tree import (
    TreeExpansion,
    ancestor_verify_mask,
    framed_ancestors,
    select_on_device,
)


class GraphedRound:
    """CUDA-graph replays of a greedy draft round over one `DraftCache`, one graph per number m
    of pending positions (1 .. min(num_steps + 1, `fused_decode.MAX_TOKENS`): the positions one
    verification can accept), all captured at construction.

    fast: a FastDraft after `use_triton()` (the round runs its Triton steps). spec: the
    speculative setting (num_steps, topk, num_draft_tokens). draft_to_target: [Vd] long target
    id of each draft id; vocab_size: the target's V. verify_inputs (a tree only, required
    there): the verify forward's input_ids [1, N], position_ids [1, N], cache_slots [N] long and
    attn_mask [1, 1, N, S] bool on the device (N = num_draft_tokens), which each round writes
    for the tree it selects (positions from the draft cache's committed entries, which the
    engine keeps equal to the target's). Capture warms up by writing the last m + scratch cache
    entries: give the cache `fused_decode.MAX_TOKENS` entries that no request uses (as
    `SpeculativeEngine` does). Outputs are valid until the next call with the same m.
    Raises ValueError for a tree without verify_inputs.
    """

    def __init__(
        self,
        fast: FastDraft,
        cache: DraftCache,
        spec: SpecConfig,
        draft_to_target: Tensor,
        vocab_size: int,
        verify_inputs: Sequence[Tensor] | None = None,
    ) -> None:
        if spec.topk > 1 and verify_inputs is None:
            raise ValueError("a graphed tree round writes its verify inputs: give verify_inputs")
        self.fast, self.cache, self.spec = fast, cache, spec
        self.draft_to_target, self.vocab_size = draft_to_target, vocab_size
        self.verify_inputs = tuple(verify_inputs) if spec.topk > 1 else None
        self.scratch = (
            spec.num_steps - 1
        ) * spec.topk  # cache entries a round writes past the committed ones
        device = cache.k.device
        self.entries = torch.arange(cache.max_len, device=device)  # [max_len]
        # built once, not replayed: the later steps' scratch entries past the committed ones, then
        # their rows' RoPE positions past them (step s: topk rows at committed + s - 1)
        scratch = torch.arange(self.scratch, device=device)
        self.step_offsets = torch.cat([scratch, scratch // spec.topk])
        self.chain_framed = (
            None  # a chain's verify ancestors: each node sees itself and the nodes before it
        )
        if spec.topk == 1:
            n = spec.num_steps + 1
            self.chain_framed = framed_ancestors(
                torch.ones(n, n, dtype=torch.bool, device=device).tril()
            )
        self.graphs: dict[int, tuple[Any, tuple[Tensor, ...], tuple[Tensor, ...]]] = {}
        for m in range(1, min(spec.num_steps + 1, fused_decode.MAX_TOKENS) + 1):
            self.graphs[m] = self.capture(m)

    def __call__(self, ids: Tensor, aux: Tensor, start: int) -> tuple[Tensor, ...] | None:
        """Draft a round after the m pending positions: ids [m] long (the tokens following them,
        the last one the root), aux [m, n_aux*H_target] (the target's aux states there), written
        at cache entries start..start+m-1 (committed by the caller), the tree's scratch after
        them. Returns, on the device, a chain's (tokens, scores) (`TreeExpansion.candidates()`),
        a tree's (parents [N] long, scores [N], ok []) as `select_on_device` gives them (its
        tokens, positions, slots and mask written to verify_inputs), or None when no graph has
        m positions (run the round step by step). Raises ValueError when the round's entries
        run past the cache."""
        m = ids.shape[0]
        if m not in self.graphs:
            return None
        self.cache.check_write(start, m + self.scratch)
        graph, (static_ids, static_aux, static_start), output = self.graphs[m]
        static_ids.copy_(ids)
        static_aux.copy_(aux)
        static_start.fill_(start)
        graph.replay()
        return tuple(output)

    def round(
        self,
        ids: Tensor,
        aux: Tensor,
        start: Tensor,
        count: Tensor | None = None,
        verify_inputs: Sequence[Tensor] | None = None,
    ) -> tuple[Tensor, ...]:
        """The captured round (start [1] long on the device): what `EagleChain.propose`
        runs step by step, a tree's selection and verify inputs included. Returns what
        `__call__` returns.

        A padded round (`rounds_ahead.RoundsAhead`, which captures it with its own buffers):
        count [1] long on the device, the pending positions among the m rows (the first `count`;
        the others write cache entries that the round's scratch overwrites or its masks hide,
        and nothing reads their outputs); verify_inputs: where the verify inputs are written
        (input_ids, position_ids, cache_slots, attn_mask as `__init__`'s; a tree's by default
        to `__init__`'s)."""
        expansion, tokens, hidden, committed = self.first_step(ids, aux, start, count)
        self.later_steps(expansion, tokens, hidden, committed)
        return self.verify_outputs(expansion, committed, verify_inputs)

    def first_step(
        self, ids: Tensor, aux: Tensor, start: Tensor, count: Tensor | None
    ) -> tuple[TreeExpansion, Tensor, Tensor, Tensor]:
        """`round`'s first step over its m rows (ids, aux, start, count as `round`'s) and its
        expansion from the root's row: the expansion, its children's tokens [F] and hidden
        [F, H], and the committed entries [1] long (where the later steps' scratch begins)."""
        m, entries = ids.shape[0], self.entries
        if count is None:  # every row pending: the last one is the root's
            first = start + entries[: m + 1]  # the rows' slots, then the committed entries
            slots, committed, last = first[:m], first[m:], slice(m - 1, m)
        else:
            slots, committed, last = start + entries[:m], start + count, count - 1
        logits, hidden = self.fast.triton_step(
            DraftStep(ids, aux, slots, True, self.cache),
            slots,
            (entries[None, :] <= slots[:, None]).view(1, 1, m, -1),
        )
        expansion = TreeExpansion(
            ids[last],
            self.spec.topk,
            False,
            SamplingParams(),
            self.draft_to_target,
            self.vocab_size,
            None,
            kernels=self.fast.triton_kernels,
        )
        tokens, hidden = expansion.expand(logits[last], hidden[last], written=False)
        return expansion, tokens, hidden, committed

    def later_steps(
        self, expansion: TreeExpansion, tokens: Tensor, hidden: Tensor, committed: Tensor
    ) -> None:
        """Steps 1 .. num_steps - 1 of `round` after its first step's expansion (tokens [F],
        hidden [F, H]): each runs the frontier at depth `step` (RoPE position committed + step - 1)
        and expands it; committed: [1] long on the device."""
        spec, f = self.spec, self.spec.topk
        if spec.num_steps == 1:
            return
        scratch_slots, positions = (committed + self.step_offsets).split(self.scratch)
        if f == 1:  # a chain's row sees every entry up to its own slot: every step's mask at once
            masks = self.entries[None, :] <= scratch_slots[:, None]
        else:
            prefix = self.entries < committed
        for step in range(1, spec.num_steps):
            rows = slice((step - 1) * f, step * f)
            mask = masks[rows] if f == 1 else expansion.cache_mask(prefix, scratch_slots)
            logits, hidden = self.fast.triton_step(
                DraftStep(tokens, hidden, positions[rows], False, self.cache),
                scratch_slots[rows],
                mask.view(1, 1, f, -1),
            )
            if step < spec.num_steps - 1:
                tokens, hidden = expansion.expand(logits, hidden, written=True)
            else:  # the last step's children: no next frontier
                expansion.add_children(logits, written=True)

    def verify_outputs(
        self,
        expansion: TreeExpansion,
        committed: Tensor,
        verify_inputs: Sequence[Tensor] | None,
    ) -> tuple[Tensor, ...]:
        """`round`'s outputs after its last step: a chain's (tokens, scores), its verify inputs
        written where verify_inputs is given; a tree's selection (`select_on_device`) and its
        verify inputs written (to `__init__`'s by default). committed: [1] long on the device."""
        entries, spec = self.entries, self.spec
        tokens, scores, parents, _ = expansion.candidates()
        if parents is None:
            # node i's parent is i - 1: its ancestors are the nodes before it
            if verify_inputs is not None:
                write_verify_inputs(
                    verify_inputs,
                    tokens,
                    None,
                    committed,
                    entries[: tokens.numel()],
                    self.chain_framed,
                )
            return tokens, scores
        keep, tree_parents, depths, framed, ok = select_on_device(
            parents, scores, spec.num_draft_tokens, spec.num_steps
        )
        write_verify_inputs(
            self.verify_inputs if verify_inputs is None else verify_inputs,
            tokens,
            keep,
            committed,
            depths,
            framed,
        )
        return tree_parents, scores[keep], ok

    def static_inputs(self, m: int) -> tuple[Tensor, Tensor, Tensor]:
        """`round`'s input buffers for m pending positions: ids, aux, start (the last entries of
        the cache until a call fills it)."""
        device, dtype = self.cache.k.device, self.fast.fc.dtype
        return (
            torch.zeros(m, dtype=torch.long, device=device),
            torch.zeros(m, self.fast.fc.shape[1], dtype=dtype, device=device),
            torch.full(
                (1,), self.cache.max_len - m - self.scratch, dtype=torch.long, device=device
            ),
        )

    def capture(self, m: int) -> tuple:
        """Warm up (Triton compiles), then capture the round for m pending positions: (graph,
        its `static_inputs`, its outputs)."""
        inputs = self.static_inputs(m)
        graph, output = capture_graph(lambda: self.round(*inputs))
        return graph, inputs, output


def write_verify_inputs(
    inputs: Sequence[Tensor],
    tokens: Tensor,
    keep: Tensor | None,
    committed: Tensor,
    depths: Tensor,
    framed: Tensor,
) -> None:
    """Write a drafted tree's verify inputs in place, on the device: inputs = input_ids [1, N],
    position_ids [1, N], cache_slots [N] long, attn_mask [1, 1, N, S] bool; tokens [M+1] long
    (root first), of which keep [N] long (`tree.select_on_device`) or None (all) are verified;
    committed [1] long (the target's cached tokens: the root's slot and position); depths [N]
    long; framed [N, N+2] bool (the ancestors, `tree.framed_ancestors`)."""
    input_ids, positions, slots, mask = inputs
    columns = torch.arange(mask.shape[-1], device=tokens.device)
    if keep is None:
        input_ids[0].copy_(tokens)
    else:
        torch.index_select(tokens, 0, keep, out=input_ids[0])
    torch.add(committed, depths, out=positions[0])
    torch.add(committed, columns[: depths.numel()], out=slots)
    ancestor_verify_mask(framed, committed, columns, out=mask[0, 0])


class GraphedDraft:
    """CUDA-graph replays of `FastDraft.triton_step` on one `DraftCache`, called like a
    `FastDraft`: one graph per key (T positions, first step or not, mask given or not), all
    captured at construction (`draft_graph_keys` lists those of a speculative setting). Other
    steps (a prompt's first step) and other caches run the FastDraft as it is.

    Eagerly a Triton step is bound by its launches on the host, many times its GPU time; a
    replay costs a few small copies and one launch. Graphs are captured up front because
    capturing on first use cost more than it saved: a request then compiled and captured the
    first steps its warm-up had not met (benchmarks/RESULTS.md).
    Graphs attend over the whole cache (entries past the step are masked; the attention kernel
    skips their blocks), so the shapes are static. Inputs are copied into static buffers;
    outputs are valid until the next call with the same key. Capture warms up by writing the
    last T entries of the cache: give the cache `fused_decode.MAX_TOKENS` entries that no request
    uses (`SpeculativeEngine` does).
    """

    def __init__(
        self, fast: FastDraft, cache: DraftCache, keys: Iterable[tuple[int, bool, bool]]
    ) -> None:
        self.fast, self.cache = fast, cache
        self.entries = torch.arange(cache.max_len, device=cache.k.device)  # [max_len]
        self.graphs: dict[
            tuple[int, bool, bool], tuple[torch.cuda.CUDAGraph, tuple[Tensor, ...], Any]
        ] = {}
        for key in keys:
            width = (
                fast.fc.shape[1] if key[1] else fast.fc.shape[0]
            )  # aux states / own hidden state
            self.graphs[key] = self.capture(*key, width)

    @draft_step
    def __call__(
        self, step: DraftStep, start: int, attn_mask: Tensor | None
    ) -> tuple[Tensor, Tensor]:
        """GraphedDraft: a replay of the graph of this key, else the FastDraft's own step."""
        input_ids, hidden, positions, first_step, cache = step
        t = input_ids.shape[0]
        key = (t, first_step, attn_mask is not None)
        if cache is not self.cache or key not in self.graphs:
            return self.fast(*step, start, attn_mask)
        cache.check_write(start, t)
        graph, (ids, hid, pos, start_t, mask), output = self.graphs[key]
        ids.copy_(input_ids)
        hid.copy_(hidden)
        pos.copy_(positions)
        start_t.fill_(start)
        if attn_mask is not None:
            mask[:, : start + t].copy_(attn_mask.view(t, start + t))
            mask[:, start + t :] = False
        graph.replay()
        return output

    def step(
        self,
        ids: Tensor,
        hidden: Tensor,
        positions: Tensor,
        start: Tensor,
        mask: Tensor,
        first_step: bool,
        masked: bool,
    ) -> tuple[Tensor, Tensor]:
        """The captured step: entries start..start+T-1 (start [1] long); mask [T, max_len] as
        given, or (not masked) every entry before start and causal among the T."""
        slots = start + self.entries[: ids.shape[0]]
        if not masked:
            mask = self.entries[None, :] <= slots[:, None]
        step = DraftStep(ids, hidden, positions, first_step, self.cache)
        return self.fast.triton_step(step, slots, mask.view(1, 1, ids.shape[0], -1))

    def static_inputs(self, t: int, width: int) -> tuple[Tensor, ...]:
        """`step`'s input buffers for `t` positions of `width` hidden features: ids, hidden,
        positions, start (the last t cache entries until a call fills it), mask."""
        device, dtype = self.cache.k.device, self.cache.k.dtype
        return (
            torch.zeros(t, dtype=torch.long, device=device),
            torch.zeros(t, width, dtype=dtype, device=device),
            torch.zeros(t, dtype=torch.long, device=device),
            torch.full((1,), self.cache.max_len - t, dtype=torch.long, device=device),
            torch.ones(t, self.cache.max_len, dtype=torch.bool, device=device),
        )

    def capture(self, t: int, first_step: bool, masked: bool, width: int) -> tuple:
        """Warm up (Triton compiles), then capture the step for `t` positions: (graph, its
        `static_inputs`, its outputs)."""
        inputs = self.static_inputs(t, width)
        graph, output = capture_graph(lambda: self.step(*inputs, first_step, masked))
        return graph, inputs, output


def draft_graph_keys(num_steps: int, topk: int) -> list[tuple[int, bool, bool]]:
    """The `GraphedDraft` keys a speculative setting runs after its first round: first steps over
    the 1..num_steps+1 positions a verification can accept, and the later steps (topk rows, a
    tree's under a mask; none for num_steps 1). Each key is (T, first step, masked)."""
    keys = [(t, True, False) for t in range(1, min(num_steps + 1, fused_decode.MAX_TOKENS) + 1)]
    return keys + ([(topk, False, topk > 1)] if num_steps > 1 else [])
