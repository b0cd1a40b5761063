"""The drafter on the engine's hot path: an `Eagle3Draft`'s weights, packed for one sequence.

Computes what `Eagle3Draft.forward` computes (tests/unit/engine/test_engine_fast_draft.py holds the parity
checks), with the engine's cache protocol and fewer operations per step:
- q/k/v and gate/up run as one matmul each (their weights stacked once, at construction);
- a step writes its K/V into the `DraftCache` and attends over the cache in place, where
  `Eagle3Draft` returns them and concatenates the whole past on every call;
- weights are tensors and the step calls functions, not modules: batch 1 on the CPU a draft
  step is bound by per-call overhead, much of it module calls, no-op casts and checks
  (benchmarks/RESULTS.md).
Norm and RoPE are `draft.py`'s functions, so the numerics are the drafter's by construction.

After `use_triton()` (CUDA, bf16 / fp16) a step of up to 64 positions runs through
the Triton kernels (`kernels.linear_ops`, `norm_rope_ops`, `attention_ops`) instead, as the target's decode does (`fused_decode`): eleven launches in all
(twelve on a first step, with fc), where the torch step makes about forty small ones besides
its matmuls; RoPE and the K/V writes in the q|k|v matmul's epilogue, silu(gate) * up in the
gate|up matmul's. RoPE is then computed in
float32 where `draft.py` rounds cos / sin to the weights' dtype: the two paths agree to bf16
rounding (tests/unit/engine/test_triton_ops.py). Eagerly those launches are host-bound; `GraphedDraft`
replays them as CUDA graphs (what `SpeculativeEngine(compile=True)` runs).
The stacked q/k/v and gate/up weights are copies, made when the FastDraft is built (memory:
those weights once more): build a new one after changing the drafter's weights.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from specdraft.draft import KV, Eagle3Draft, apply_rope, fuse_aux, rms_norm, rope_cos_sin
from specdraft.engine.draft_cache import DraftCache
from specdraft.engine.fast_model import causal_mask
from specdraft.engine.graphs import capture_graph
from specdraft.engine.kernels import fused_decode


class FastDraft:
    """Batch-1 EAGLE-3 draft steps over a `DraftCache` (see the module docstring)."""

    @torch.no_grad()
    def __init__(self, draft: Eagle3Draft) -> None:
        cfg = draft.cfg
        self.num_heads, self.num_kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim, self.eps = cfg.head_dim, cfg.rms_norm_eps
        weights = {name: param.detach() for name, param in draft.named_parameters()}  # no autograd
        self.embed, self.fc = weights["embed_tokens.weight"], weights["fc.weight"]
        self.input_fc_norm = weights.get("input_norm.weight")  # norm_before_fc, else None
        self.fc_norms = (
            [weights[f"fc_norm.{i}.weight"] for i in range(cfg.n_aux)] if cfg.fc_norm else None
        )
        self.norm_before_residual, self.norm_output = cfg.norm_before_residual, cfg.norm_output
        self.input_norm = weights["midlayer.input_layernorm.weight"]
        self.hidden_norm = weights["midlayer.hidden_norm.weight"]
        self.wqkv = torch.cat(
            [weights[f"midlayer.self_attn.{x}_proj.weight"] for x in "qkv"]
        )  # rows q|k|v
        self.wo = weights["midlayer.self_attn.o_proj.weight"]
        self.post_attention_norm = weights["midlayer.post_attention_layernorm.weight"]
        self.w13 = torch.cat(
            [weights[f"midlayer.mlp.{x}_proj.weight"] for x in ("gate", "up")]
        )  # gate|up
        self.w2 = weights["midlayer.mlp.down_proj.weight"]
        self.norm, self.lm_head = weights["norm.weight"], weights["lm_head.weight"]
        compute = (
            torch.float64 if self.fc.dtype == torch.float64 else torch.float32
        )  # rope_cos_sin's
        self.inv_freq = draft.inv_freq.to(self.fc.device, compute)  # converted once, not every step
        self.triton_kernels = False

    def use_triton(self) -> str | None:
        """Run steps of at most `fused_decode.MAX_TOKENS` positions through the Triton kernels
        from now on. Returns None when switched on, else why it cannot be (see
        `fused_decode.kernel_support`)."""
        reason = fused_decode.kernel_support(self.fc, self.head_dim)
        self.triton_kernels = reason is None
        return reason

    def __call__(
        self,
        input_ids: Tensor,
        hidden: Tensor,
        positions: Tensor,
        first_step: bool,
        cache: DraftCache,
        start: int,
        attn_mask: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """One draft step over T positions, as `Eagle3Draft.forward` for one sequence.

        input_ids [T] long (target ids); hidden [T, n_aux*H_target] on the first step, else
        [T, H]; positions [T] long (RoPE). Writes the step's K/V at cache entries
        start..start+T-1, then attends over entries 0..start+T-1 where attn_mask [T, start+T]
        (or [1, 1, T, start+T]) bool says, or (None) to every earlier entry and causally among the T.
        Returns logits [T, draft vocab] and the output [T, H] a later step reads as its hidden
        (pre-norm; post-norm for `norm_output`).
        """
        t = input_ids.shape[0]
        if self.triton_kernels and t <= fused_decode.MAX_TOKENS:
            cache.check_write(start, t)
            if attn_mask is None:  # every earlier entry, causal among the T
                attn_mask = causal_mask(start, t, start + t, device=hidden.device)[0, 0]
            slots = torch.arange(start, start + t, device=hidden.device)
            return self.triton_step(
                input_ids,
                hidden,
                positions,
                first_step,
                cache,
                slots,
                attn_mask.view(1, 1, t, start + t),
            )
        h = (
            fuse_aux(hidden, self.fc, self.input_fc_norm, self.fc_norms, self.eps)
            if first_step
            else hidden
        )
        normed_h = rms_norm(h, self.hidden_norm, self.eps)
        x = torch.cat(
            [rms_norm(F.embedding(input_ids, self.embed), self.input_norm, self.eps), normed_h],
            dim=-1,
        )
        cos, sin = rope_cos_sin(positions[None], self.inv_freq, x.dtype)
        qkv = (
            F.linear(x, self.wqkv).view(1, t, -1, self.head_dim).transpose(1, 2)
        )  # [1, heads, T, D]
        qk, v = qkv.split([self.num_heads + self.num_kv_heads, self.num_kv_heads], dim=1)
        q, k = apply_rope(qk, cos, sin).split([self.num_heads, self.num_kv_heads], dim=1)
        cache.write(KV(k, v), start)
        past = cache.view(start + t)
        if attn_mask is None and t > 1:
            attn_mask = causal_mask(start, t, start + t, device=x.device)[
                0, 0
            ]  # not tril: see tree.verify_mask
        y = F.scaled_dot_product_attention(
            q, past.k, past.v, attn_mask=attn_mask, enable_gqa=self.num_heads != self.num_kv_heads
        )
        r = F.linear(y.transpose(1, 2).reshape(t, -1), self.wo) + (
            normed_h if self.norm_before_residual else h
        )
        gate, up = F.linear(rms_norm(r, self.post_attention_norm, self.eps), self.w13).chunk(
            2, dim=-1
        )
        out = r + F.linear(F.silu(gate) * up, self.w2)
        normed = rms_norm(out, self.norm, self.eps)
        return F.linear(normed, self.lm_head), normed if self.norm_output else out

    def triton_step(
        self,
        input_ids: Tensor,
        hidden: Tensor,
        positions: Tensor,
        first_step: bool,
        cache: DraftCache,
        slots: Tensor,
        attn_mask: Tensor,
    ) -> tuple[Tensor, Tensor]:
        """A step through the Triton kernels (after `use_triton`; T <= 64): input_ids, hidden,
        positions as `__call__`; writes the K/V at cache entries slots [T] long, then attends
        where attn_mask [1, 1, T, S] bool says over entries 0..S-1 (S <= cache.max_len).
        Returns what `__call__` returns. Tensor arguments only: `GraphedDraft` captures it."""
        from specdraft.engine.kernels.attention_ops import attention
        from specdraft.engine.kernels.linear_ops import linear, linear_silu_mul, qkv_rope_to_cache
        from specdraft.engine.kernels.norm_rope_ops import add_rms_norm

        t, width = input_ids.shape[0], self.input_norm.shape[0]
        if first_step and (self.input_fc_norm is not None or self.fc_norms is not None):
            h = fuse_aux(
                hidden, self.fc, self.input_fc_norm, self.fc_norms, self.eps
            )  # EAGLE-3.1: torch ops
        else:
            h = linear(hidden, self.fc) if first_step else hidden.contiguous()
        x = torch.empty(t, 2 * width, device=h.device, dtype=h.dtype)
        add_rms_norm(
            F.embedding(input_ids, self.embed), None, self.input_norm, self.eps, out=x[:, :width]
        )
        add_rms_norm(h, None, self.hidden_norm, self.eps, out=x[:, width:])
        q = qkv_rope_to_cache(
            x,
            self.wqkv,
            None,
            positions[None],
            slots,
            self.inv_freq,
            cache.k,
            cache.v,
            self.num_heads,
        )
        y = attention(q, cache.k, cache.v, attn_mask, slots)
        residual = x[:, width:].contiguous() if self.norm_before_residual else h
        r, normed = add_rms_norm(
            residual, linear(y.view(t, -1), self.wo), self.post_attention_norm, self.eps
        )
        out, normed = add_rms_norm(
            r, linear(linear_silu_mul(normed, self.w13), self.w2), self.norm, self.eps
        )
        return linear(normed, self.lm_head), normed if self.norm_output else out


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

    def __call__(
        self,
        input_ids: Tensor,
        hidden: Tensor,
        positions: Tensor,
        first_step: bool,
        cache: DraftCache,
        start: int,
        attn_mask: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """As `FastDraft.__call__` (attn_mask [T, start+T] or [1, 1, T, start+T] bool, or None)."""
        t = input_ids.shape[0]
        key = (t, first_step, attn_mask is not None)
        if cache is not self.cache or key not in self.graphs:
            return self.fast(input_ids, hidden, positions, first_step, cache, start, attn_mask)
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
        return self.fast.triton_step(
            ids, hidden, positions, first_step, self.cache, slots, mask.view(1, 1, ids.shape[0], -1)
        )

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
