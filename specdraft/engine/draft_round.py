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

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from specdraft.engine.draft_cache import DraftCache
from specdraft.engine.fast_draft import FastDraft
from specdraft.engine.graphs import capture_graph
from specdraft.engine.kernels import fused_decode
from specdraft.engine.sampling import SamplingParams
from specdraft.engine.spec_config import SpecConfig
from specdraft.engine.tree import TreeExpansion, ancestor_verify_mask, select_on_device


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

    def __init__(self, fast: FastDraft, cache: DraftCache, spec: SpecConfig, draft_to_target: Tensor,
                 vocab_size: int, verify_inputs: Sequence[Tensor] | None = None) -> None:
        if spec.topk > 1 and verify_inputs is None:
            raise ValueError("a graphed tree round writes its verify inputs: give verify_inputs")
        self.fast, self.cache, self.spec = fast, cache, spec
        self.draft_to_target, self.vocab_size = draft_to_target, vocab_size
        self.verify_inputs = tuple(verify_inputs) if spec.topk > 1 else None
        self.scratch = (spec.num_steps - 1) * spec.topk  # cache entries a round writes past the committed ones
        self.entries = torch.arange(cache.max_len, device=cache.k.device)  # [max_len]
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

    def round(self, ids: Tensor, aux: Tensor, start: Tensor, count: Tensor | None = None,
              verify_inputs: Sequence[Tensor] | None = None) -> tuple[Tensor, ...]:
        """The captured round (start [1] long on the device): what `SpeculativeEngine.draft_tree`
        runs step by step, a tree's selection and verify inputs included. Returns what
        `__call__` returns.

        A padded round (`rounds_ahead.RoundsAhead`, which captures it with its own buffers):
        count [1] long on the device, the pending positions among the m rows (the first `count`;
        the others write cache entries that the round's scratch overwrites or its masks hide,
        and nothing reads their outputs); verify_inputs: where the verify inputs are written
        (input_ids, position_ids, cache_slots, attn_mask as `__init__`'s; a tree's by default
        to `__init__`'s)."""
        m, entries, spec = ids.shape[0], self.entries, self.spec
        slots = start + entries[:m]
        logits, hidden = self.fast.triton_step(ids, aux, slots, True, self.cache, slots,
                                               (entries[None, :] <= slots[:, None]).view(1, 1, m, -1))
        if count is None:  # every row pending: the last one is the root's
            committed, last = start + m, slice(m - 1, m)
        else:
            committed, last = start + count, count - 1
        expansion = TreeExpansion(ids[last], spec.topk, False, SamplingParams(), self.draft_to_target,
                                  self.vocab_size, None)
        tokens, hidden = expansion.expand(logits[last], hidden[last], written=False)
        for step in range(1, spec.num_steps):  # frontier at depth `step`, RoPE position t + step
            f = tokens.numel()
            slots = committed + expansion.num_scratch + entries[:f]
            positions = (committed + step - 1).repeat(f)
            mask = expansion.cache_mask(committed, entries).view(1, 1, f, -1)
            logits, hidden = self.fast.triton_step(tokens, hidden, positions, False, self.cache, slots, mask)
            tokens, hidden = expansion.expand(logits, hidden, written=True)
        tokens, scores, parents, _ = expansion.candidates()
        if parents is None:
            if verify_inputs is not None:  # node i's parent is i - 1: its ancestors are the nodes before it
                n = tokens.numel()
                chain = torch.ones(n, n, dtype=torch.bool, device=tokens.device).tril()
                write_verify_inputs(verify_inputs, tokens, committed, entries[:n], chain)
            return tokens, scores
        keep, tree_parents, depths, ancestors, ok = select_on_device(parents, scores, spec.num_draft_tokens,
                                                                     spec.num_steps)
        write_verify_inputs(self.verify_inputs if verify_inputs is None else verify_inputs, tokens[keep], committed,
                            depths, ancestors)
        return tree_parents, scores[keep], ok

    def static_inputs(self, m: int) -> tuple[Tensor, Tensor, Tensor]:
        """`round`'s input buffers for m pending positions: ids, aux, start (the last entries of
        the cache until a call fills it)."""
        device, dtype = self.cache.k.device, self.fast.fc.dtype
        return (torch.zeros(m, dtype=torch.long, device=device),
                torch.zeros(m, self.fast.fc.shape[1], dtype=dtype, device=device),
                torch.full((1,), self.cache.max_len - m - self.scratch, dtype=torch.long, device=device))

    def capture(self, m: int) -> tuple:
        """Warm up (Triton compiles), then capture the round for m pending positions: (graph,
        its `static_inputs`, its outputs)."""
        inputs = self.static_inputs(m)
        graph, output = capture_graph(lambda: self.round(*inputs))
        return graph, inputs, output


def write_verify_inputs(inputs: Sequence[Tensor], tokens: Tensor, committed: Tensor, depths: Tensor,
                        ancestors: Tensor) -> None:
    """Write a drafted tree's verify inputs in place, on the device: inputs = input_ids [1, N],
    position_ids [1, N], cache_slots [N] long, attn_mask [1, 1, N, S] bool; tokens [N] long
    (root first), committed [1] long (the target's cached tokens: the root's slot and
    position), depths [N] long, ancestors [N, N] bool (`tree.select_on_device`)."""
    input_ids, positions, slots, mask = inputs
    n, columns = tokens.numel(), torch.arange(mask.shape[-1], device=tokens.device)
    input_ids[0].copy_(tokens)
    positions[0].copy_(committed + depths)
    slots.copy_(committed + columns[:n])
    mask[0, 0].copy_(ancestor_verify_mask(ancestors, committed, columns))
