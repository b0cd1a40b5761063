"""The Triton kernels around the target's and the drafter's matmuls: residual add + RMSNorm,
and RoPE with the K/V cache writes.

- `add_rms_norm`: the residual add and the next RMSNorm in one pass (rounded where the torch path
  rounds).
- `rope_to_cache`: per-head RMSNorm (Qwen3) and RoPE ("neox" halves, as transformers) of q and
  k, K and V written into the static cache at their slots, in place (the compiled torch path
  rewrote each layer's whole cache); returns the rotated q. RoPE in float32: bf16 rounding, not
  bit for bit.
Launched with PDL on Hopper (`pdl`); tests/unit/engine/kernels/test_fused_decode.py checks them against
torch. Import this module only where Triton is installed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from torch import Tensor

from specdraft.engine.kernels.pdl import pdl_launch, pdl_wait


@triton.jit
def _add_rms_norm_kernel(
    x_ptr,
    delta_ptr,
    sum_ptr,
    out_ptr,
    weight_ptr,
    H,
    out_stride,
    eps,
    HAS_DELTA: tl.constexpr,
    BLOCK_H: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """Program m: row m of sum = x + delta (rounded to x's dtype) and weight * rms_norm(sum)."""
    m = tl.program_id(0)
    cols = tl.arange(0, BLOCK_H)
    col_mask = cols < H
    weight = tl.load(weight_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
    pdl_wait(USE_PDL)
    x = tl.load(x_ptr + m * H + cols, mask=col_mask, other=0.0)
    if HAS_DELTA:
        x = x.to(tl.float32) + tl.load(delta_ptr + m * H + cols, mask=col_mask, other=0.0).to(
            tl.float32
        )
        x = x.to(sum_ptr.dtype.element_ty)
        tl.store(sum_ptr + m * H + cols, x, mask=col_mask)
    xf = x.to(tl.float32)
    normed = (xf * tl.rsqrt(tl.sum(xf * xf, axis=0) / H + eps)).to(out_ptr.dtype.element_ty)
    tl.store(
        out_ptr + m * out_stride + cols,
        (weight * normed.to(tl.float32)).to(out_ptr.dtype.element_ty),
        mask=col_mask,
    )


def add_rms_norm(
    x: Tensor, delta: Tensor | None, weight: Tensor, eps: float, out: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """(s, weight * RMSNorm(s)) with s = x + delta (x itself when delta is None), rounded as
    the torch path rounds them (`draft.rms_norm`: normalised in float32, cast, then scaled).

    x, delta: [M, H] contiguous, bf16 / fp16 (float32 works too); weight [H]. Returns two [M, H]
    tensors in x's dtype; the second is `out` when given ([M, H], last dim contiguous, rows
    strided: e.g. half of a wider buffer).
    """
    total = torch.empty_like(x) if delta is not None else x
    out = torch.empty_like(x) if out is None else out
    block_h = triton.next_power_of_2(x.shape[1])
    _add_rms_norm_kernel[(x.shape[0],)](
        x,
        delta,
        total,
        out,
        weight,
        x.shape[1],
        out.stride(0),
        eps,
        HAS_DELTA=delta is not None,
        BLOCK_H=block_h,
        **pdl_launch(x.device, block_h, 512),
    )
    return total, out


@triton.jit
def _rope_to_cache_kernel(
    qkv_ptr,
    pos_ptr,
    slot_ptr,
    inv_freq_ptr,
    q_norm_ptr,
    k_norm_ptr,
    q_out_ptr,
    k_cache_ptr,
    v_cache_ptr,
    T,
    num_heads,
    num_kv_heads,
    cache_len,
    eps,
    QK_NORM: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """Program (m, h): head h of token m; h < nq: rotated q; then k heads (to the cache); then v."""
    pdl_wait(USE_PDL)
    m, h = tl.program_id(0), tl.program_id(1)
    half = tl.arange(0, HEAD_DIM // 2)
    row = qkv_ptr + (m * (num_heads + 2 * num_kv_heads) + h) * HEAD_DIM
    x1 = tl.load(row + half).to(tl.float32)
    x2 = tl.load(row + HEAD_DIM // 2 + half).to(tl.float32)
    b = m // T
    slot = tl.load(slot_ptr + m)  # slots [B, T]: row b's own
    if h >= num_heads + num_kv_heads:  # v: stored as is
        dst = (
            v_cache_ptr
            + ((b * num_kv_heads + h - num_heads - num_kv_heads) * cache_len + slot) * HEAD_DIM
        )
    else:
        if QK_NORM:
            scale = tl.rsqrt((tl.sum(x1 * x1, axis=0) + tl.sum(x2 * x2, axis=0)) / HEAD_DIM + eps)
            if h < num_heads:
                w1, w2 = tl.load(q_norm_ptr + half), tl.load(q_norm_ptr + HEAD_DIM // 2 + half)
            else:
                w1, w2 = tl.load(k_norm_ptr + half), tl.load(k_norm_ptr + HEAD_DIM // 2 + half)
            x1 = x1 * scale * w1.to(tl.float32)
            x2 = x2 * scale * w2.to(tl.float32)
        angle = tl.load(pos_ptr + m).to(tl.float32) * tl.load(inv_freq_ptr + half)
        cos, sin = tl.cos(angle), tl.sin(angle)
        x1, x2 = x1 * cos - x2 * sin, x2 * cos + x1 * sin
        if h < num_heads:
            dst = q_out_ptr + (m * num_heads + h) * HEAD_DIM
        else:
            dst = k_cache_ptr + ((b * num_kv_heads + h - num_heads) * cache_len + slot) * HEAD_DIM
    tl.store(dst + half, x1.to(dst.dtype.element_ty))
    tl.store(dst + HEAD_DIM // 2 + half, x2.to(dst.dtype.element_ty))


def row_slots(cache_slots: Tensor, batch: int) -> Tensor:
    """Each row's cache slots [B, T] contiguous, from slots shared by the batch [T] (a view at
    B = 1, else one copy) or each row's own [B, T]."""
    return cache_slots.expand(batch, cache_slots.shape[-1]).contiguous()


@dataclass(frozen=True)
class KVWrite:
    """Where a forward's new K / V go and how q and k are rotated (`rope_to_cache`,
    `linear_ops.qkv_rope_to_cache`): position_ids [B, T] long (RoPE positions), cache_slots
    [B, T] long contiguous (row b's tokens written at its own slots in cache row b; `row_slots`
    spreads slots shared by the batch), inv_freq [D/2] float32, k_cache / v_cache [B_max, n_kv,
    S_max, D] contiguous (written in place), num_heads: the q heads, before the k and v heads."""

    position_ids: Tensor
    cache_slots: Tensor
    inv_freq: Tensor
    k_cache: Tensor
    v_cache: Tensor
    num_heads: int


def rope_to_cache(
    qkv: Tensor,
    write: KVWrite,
    q_norm: Tensor | None = None,
    k_norm: Tensor | None = None,
    eps: float = 0.0,
) -> Tensor:
    """Rotate q and k of new tokens, write K and V into the cache in place, return rotated q.

    qkv: [B*T, (nq + 2 n_kv) * D] contiguous (the fused projection's output, q | k | v heads);
    write: the positions, slots, inv_freq, caches and nq (`KVWrite`); q_norm / k_norm [D]:
    per-head RMSNorm weights before RoPE (Qwen3), or None. Returns q [B*T, nq, D] in qkv's dtype.
    """
    num_heads, k_cache = write.num_heads, write.k_cache
    num_kv_heads, cache_len, head_dim = k_cache.shape[1], k_cache.shape[2], k_cache.shape[3]
    m, t = qkv.shape[0], write.position_ids.shape[1]
    q = torch.empty(m, num_heads, head_dim, device=qkv.device, dtype=qkv.dtype)
    _rope_to_cache_kernel[(m, num_heads + 2 * num_kv_heads)](
        qkv,
        write.position_ids,
        write.cache_slots,
        write.inv_freq,
        q_norm,
        k_norm,
        q,
        k_cache,
        write.v_cache,
        t,
        num_heads,
        num_kv_heads,
        cache_len,
        eps,
        QK_NORM=q_norm is not None,
        HEAD_DIM=head_dim,
        **pdl_launch(qkv.device),
    )
    return q
