"""The DFlash drafter's round as CUDA graphs (`GraphedBlock`, what `SpeculativeEngine.compile`
gives a `dflash_block.DFlashBlock`), and its capture buckets (`block_buckets`).

Eagerly a round is some 70 torch ops per draft layer, each launched from the host and costing it
more than its GPU time at batch 1; a replay is one launch. A graph needs static shapes and
addresses, so the replayed round differs from the eager one in three ways, none of which changes
its values beyond rounding:

- the context caches are the proposer's own (preallocated to max_seq_len + block_size entries);
  the new context positions' K/V are written at start..start+bucket-1 (`index_copy_` at slots
  computed on the device), the block's K/V right after the committed context, and the block
  attends over the whole cache under a mask of the entries before the block's end (eagerly: a
  view of the context, the block's K/V concatenated);
- the count of new context positions n is padded to its bucket: the padded rows' entries lie
  where the block's K/V are written next (bucket - n < block_size), so the block overwrites them
  and nothing reads them;
- grouped-query heads are folded into the query axis (q [1, kv_heads, groups x block, head_dim]
  against the cache's kv_heads), so the attention reads the cache once, with no repeated K/V
  (the mask is the same for every query).

SGLang allocates the block's K/V right after the draft prefix in the draft KV cache and runs the
fixed-size block in its CUDA-graphable TARGET_VERIFY mode (`srt/speculative/dflash_worker.py`
`_prepare_for_speculative_decoding`); vLLM's `DFlashProposer` (`v1/spec_decode/dflash.py`)
stores the context K/V outside its CUDA graph (`precompute_and_store_context_kv`) and replays the
1 + num_speculative_tokens queries in it, padded to a captured size. Here the context's K/V are
inside the graph too (their row count padded to a bucket), so a round is one replay.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from specdraft.draft import KV
from specdraft.engine.dflash_block import DFlashBlock
from specdraft.engine.eagle import DraftCache
from specdraft.engine.graphs import StaticInputs, capture_graph


def block_buckets(num_drafts: int) -> tuple[int, ...]:
    """The graphs' counts of new context positions for num_drafts drafts a round: the powers of
    two below num_drafts + 1 (the most a verify accepts: root and every draft), then
    num_drafts + 1 itself. (1, 2, 4, 8, 16) for a block of 16."""
    top = num_drafts + 1
    return tuple(sorted({1 << k for k in range(top.bit_length()) if 1 << k < top} | {top}))


def attend_cached(
    cache: DraftCache, slots: Tensor, visible: Tensor, q: Tensor, block: KV
) -> Tensor:
    """A `dflash.Attend` over a whole `DraftCache`: the block's K/V (each [1, kv_heads, Q,
    head_dim]) written at slots [Q] long, then q [1, heads, Q, head_dim] attends to the entries
    where visible [1, 1, 1, max_len] bool is True, heads folded onto their kv head (head h reads
    kv head h // (heads / kv_heads), as `enable_gqa` does). Returns [1, heads, Q, head_dim]."""
    cache.k.index_copy_(2, slots, block.k)
    cache.v.index_copy_(2, slots, block.v)
    b, heads, q_len, head_dim = q.shape
    folded = q.reshape(b, cache.k.shape[1], -1, head_dim)
    out = F.scaled_dot_product_attention(folded, cache.k, cache.v, attn_mask=visible)
    return out.reshape(b, heads, q_len, head_dim)  # CUDA kernels may return another layout


class GraphedBlock:
    """`DFlashBlock.propose`'s work as CUDA-graph replays, one graph per bucket of new context
    positions (`block_buckets`), all captured at construction; called with the root and the
    pending aux states, it returns the proposal's tokens. Outputs equal the eager block's up to
    rounding (see the module docstring). A pending count past the largest bucket (a prompt)
    appends its context eagerly (`DFlashBlock.extend`), then replays a graph with none pending.

    The round's host inputs (the root, the context's length, the pending count) are staged in
    one copy captured into the graph (`graphs.StaticInputs`); the pending aux states are copied
    into a static buffer. Capture warms up in the caches' last block_size entries, which no
    context reaches (the caches hold max_seq_len + block_size entries at least).
    """

    def __init__(self, block: DFlashBlock, buckets: Sequence[int]) -> None:
        cfg, device = block.draft.cfg, block.device
        if not buckets or max(buckets) > block.num_drafts + 1 or min(buckets) < 1:
            raise ValueError(
                f"buckets {list(buckets)}: each in 1..{block.num_drafts + 1} (the positions a "
                "round can accept)"
            )
        self.block, self.buckets = block, tuple(sorted(buckets))
        self.block_size = cfg.block_size
        self.entries = torch.arange(block.caches[0].max_len, device=device)
        self.aux = torch.zeros(
            self.buckets[-1], block.draft.fc.in_features, dtype=block.dtype, device=device
        )
        # root, start (the context's committed length), count (the pending positions)
        self.inputs = StaticInputs([(3,)], [torch.long], device, [True])
        self.tokens = torch.zeros(block.num_drafts + 1, dtype=torch.long, device=device)
        self.graphs = {n: self.capture(n) for n in self.buckets}
        cuda = device.type == "cuda"  # the last call's GPU time (`gpu_seconds`)
        self.events = tuple(torch.cuda.Event(enable_timing=True) for _ in range(2)) if cuda else ()

    def __call__(self, root: int, aux: Tensor) -> Tensor:
        """The proposal's tokens [num_drafts + 1] long (root first; this object's output buffer,
        valid until the next call) after appending the context of aux [n, n_aux*H] (the pending
        positions' aux states) at the context's end; the caches commit them. Raises ValueError
        when the block would run past the caches."""
        n = aux.shape[0]
        bucket = next((b for b in self.buckets if b >= n), None)
        if bucket is None:
            self.block.extend(aux)
            n, bucket = 0, self.buckets[0]
        caches = self.block.caches
        start = caches[0].length
        caches[0].check_write(start, n + self.block_size)
        self.inputs.fill([torch.tensor([root, start, n])])
        if self.events:
            self.events[0].record()
        if n:
            self.aux[:n].copy_(aux)
        self.graphs[bucket].replay()
        if self.events:
            self.events[1].record()
        for cache in caches:
            cache.commit(n)
        return self.tokens

    def gpu_seconds(self) -> float:
        """The GPU time of the last call's copy and replay (CUDA: after it has run)."""
        return self.events[0].elapsed_time(self.events[1]) / 1e3

    def run(self, bucket: int) -> None:
        """The captured round for `bucket` new context rows: stage the host inputs, write the
        rows' context K/V (the first `count` are the pending positions'), run the block after the
        committed context and write its tokens (the root, the drafts' argmax) to `tokens`."""
        self.inputs.stage()
        block, scalars = self.block, self.inputs.tensors[0]
        root, start, count = scalars[0:1], scalars[1:2], scalars[2:3]
        rows = start + self.entries[:bucket]
        for cache, kv in zip(block.caches, block.context_kvs(self.aux[:bucket], rows)):
            cache.k.index_copy_(2, rows, kv.k)
            cache.v.index_copy_(2, rows, kv.v)
        slots = start + count + block.offsets  # the block's entries and RoPE positions
        visible = (self.entries < slots[-1:] + 1).view(1, 1, 1, -1)
        contexts = [partial(attend_cached, cache, slots, visible) for cache in block.caches]
        hidden = block.block_states(torch.cat([root, block.masks]), slots, contexts)
        torch.cat([root, block.draft_tokens(hidden)], out=self.tokens)

    def capture(self, bucket: int) -> Any:
        """Warm up, then capture `run(bucket)` (no autograd): the graph."""
        # the last block_size entries, past any context (which has at most max_seq_len)
        root = self.block.draft.cfg.mask_token_id
        warm = torch.tensor([root, len(self.entries) - self.block_size, 0])
        with torch.no_grad():
            graph, _ = capture_graph(
                lambda: self.run(bucket), reset=lambda: self.inputs.fill([warm])
            )
        return graph
