"""A drafter step through the Triton kernels: what `eagle.FastDraft.triton_step` runs (after
`FastDraft.use_triton`), for at most `fused_decode.MAX_TOKENS` positions of one sequence.

Eleven launches (twelve on a first step, with fc) where the torch step makes about forty: RoPE
and the K/V writes in the q|k|v matmul's epilogue (`linear_ops.qkv_rope_to_cache`), silu(gate) *
up in the gate|up matmul's, the residual adds in the norms after them (`norm_rope_ops`).
tests/unit/engine/kernels/test_fused_decode.py compares it with the torch step.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from specdraft.draft import fuse_aux
from specdraft.engine.kernels.attention_ops import attention
from specdraft.engine.kernels.linear_ops import linear, linear_silu_mul, qkv_rope_to_cache
from specdraft.engine.kernels.norm_rope_ops import KVWrite, add_rms_norm


def draft_step(fast: Any, step: Any, slots: Tensor, attn_mask: Tensor) -> tuple[Tensor, Tensor]:
    """`FastDraft.triton_step` of the drafter `fast` (its packed weights): step an
    `eagle.DraftStep`; writes the K/V at cache entries slots [T] long, then attends where
    attn_mask [1, 1, T, S] bool says over entries 0..S-1. Returns logits [T, draft vocab] and the
    output [T, H] (post-norm for `norm_output`)."""
    input_ids, hidden, positions, first_step, cache = step
    t, width = input_ids.shape[0], fast.input_norm.shape[0]
    if first_step and (fast.input_fc_norm is not None or fast.fc_norms is not None):
        h = fuse_aux(
            hidden, fast.fc, fast.input_fc_norm, fast.fc_norms, fast.eps
        )  # EAGLE-3.1: torch ops
    else:
        h = linear(hidden, fast.fc) if first_step else hidden.contiguous()
    x = torch.empty(t, 2 * width, device=h.device, dtype=h.dtype)
    add_rms_norm(
        F.embedding(input_ids, fast.embed), None, fast.input_norm, fast.eps, out=x[:, :width]
    )
    add_rms_norm(h, None, fast.hidden_norm, fast.eps, out=x[:, width:])
    write = KVWrite(positions[None], slots, fast.inv_freq, cache.k, cache.v, fast.num_heads)
    q = qkv_rope_to_cache(x, fast.wqkv, None, write)
    y = attention(q, cache.k, cache.v, attn_mask, slots)
    residual = x[:, width:].contiguous() if fast.norm_before_residual else h
    r, normed = add_rms_norm(
        residual, linear(y.view(t, -1), fast.wo), fast.post_attention_norm, fast.eps
    )
    out, normed = add_rms_norm(
        r, linear(linear_silu_mul(normed, fast.w13), fast.w2), fast.norm, fast.eps
    )
    return linear(normed, fast.lm_head), normed if fast.norm_output else out
