"""The drafter on the engine's hot path: an `Eagle3Draft`'s weights, packed for one sequence.

Computes what `Eagle3Draft.forward` computes (tests/test_engine_fast_draft.py holds the parity
checks), with the engine's cache protocol and fewer operations per step:
- q/k/v and gate/up run as one matmul each (their weights stacked once, at construction);
- a step writes its K/V into the `DraftCache` and attends over the cache in place, where
  `Eagle3Draft` returns them and concatenates the whole past on every call;
- weights are tensors and the step calls functions, not modules: batch 1 on the CPU a draft
  step is bound by per-call overhead, and module calls, no-op casts and checks were ~40 % of
  it (stories260K's drafter: 157 -> 92 us per step, one thread).
Norm and RoPE are `draft.py`'s functions, so the numerics are the drafter's by construction.
The stacked q/k/v and gate/up weights are copies, made when the FastDraft is built (memory:
those weights once more, ~0.34 GB for a Llama-3.1-8B EAGLE-3 drafter in bf16): build a new
one after changing the drafter's weights.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from specdraft.draft import KV, Eagle3Draft, apply_rope, rms_norm, rope_cos_sin
from specdraft.engine.draft_cache import DraftCache


class FastDraft:
    """Batch-1 EAGLE-3 draft steps over a `DraftCache` (see the module docstring)."""

    @torch.no_grad()
    def __init__(self, draft: Eagle3Draft) -> None:
        cfg = draft.cfg
        self.num_heads, self.num_kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim, self.eps = cfg.head_dim, cfg.rms_norm_eps
        weights = {name: param.detach() for name, param in draft.named_parameters()}  # no autograd
        self.embed, self.fc = weights["embed_tokens.weight"], weights["fc.weight"]
        self.input_norm = weights["midlayer.input_layernorm.weight"]
        self.hidden_norm = weights["midlayer.hidden_norm.weight"]
        self.wqkv = torch.cat([weights[f"midlayer.self_attn.{x}_proj.weight"] for x in "qkv"])  # rows q|k|v
        self.wo = weights["midlayer.self_attn.o_proj.weight"]
        self.post_attention_norm = weights["midlayer.post_attention_layernorm.weight"]
        self.w13 = torch.cat([weights[f"midlayer.mlp.{x}_proj.weight"] for x in ("gate", "up")])  # gate|up
        self.w2 = weights["midlayer.mlp.down_proj.weight"]
        self.norm, self.lm_head = weights["norm.weight"], weights["lm_head.weight"]
        compute = torch.float64 if self.fc.dtype == torch.float64 else torch.float32  # rope_cos_sin's
        self.inv_freq = draft.inv_freq.to(self.fc.device, compute)  # converted once, not every step

    def __call__(self, input_ids: Tensor, hidden: Tensor, positions: Tensor, first_step: bool,
                 cache: DraftCache, start: int, attn_mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """One draft step over T positions, as `Eagle3Draft.forward` for one sequence.

        input_ids [T] long (target ids); hidden [T, n_aux*H_target] on the first step, else
        [T, H]; positions [T] long (RoPE). Writes the step's K/V at cache entries
        start..start+T-1, then attends over entries 0..start+T-1 where attn_mask [T, start+T]
        bool says, or (None) to every earlier entry and causally among the T.
        Returns logits [T, draft vocab] and the pre-norm output [T, H] (a later step's hidden).
        """
        t = input_ids.shape[0]
        h = F.linear(hidden, self.fc) if first_step else hidden
        x = torch.cat([rms_norm(F.embedding(input_ids, self.embed), self.input_norm, self.eps),
                       rms_norm(h, self.hidden_norm, self.eps)], dim=-1)
        cos, sin = rope_cos_sin(positions[None], self.inv_freq, x.dtype)
        qkv = F.linear(x, self.wqkv).view(1, t, -1, self.head_dim).transpose(1, 2)  # [1, heads, T, D]
        qk, v = qkv.split([self.num_heads + self.num_kv_heads, self.num_kv_heads], dim=1)
        q, k = apply_rope(qk, cos, sin).split([self.num_heads, self.num_kv_heads], dim=1)
        cache.write(KV(k, v), start)
        past = cache.view(start + t)
        if attn_mask is None and t > 1:
            attn_mask = torch.ones(t, start + t, dtype=torch.bool, device=x.device).tril(start)
        y = F.scaled_dot_product_attention(q, past.k, past.v, attn_mask=attn_mask,
                                           enable_gqa=self.num_heads != self.num_kv_heads)
        r = F.linear(y.transpose(1, 2).reshape(t, -1), self.wo) + h
        gate, up = F.linear(rms_norm(r, self.post_attention_norm, self.eps), self.w13).chunk(2, dim=-1)
        out = r + F.linear(F.silu(gate) * up, self.w2)
        return F.linear(rms_norm(out, self.norm, self.eps), self.lm_head), out
