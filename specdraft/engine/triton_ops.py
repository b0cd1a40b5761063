"""Triton kernels for the target's decode and verify forwards (1 to 16 new tokens, batch 1).

At batch 1 a decode step reads every weight once for a few multiply-adds per element: its time
is weight bytes / memory bandwidth, plus whatever else runs. Inside a CUDA graph on an H200,
cuBLAS streamed Llama-3.1-8B's projections at 2.5-4.2 TB/s for one token (split-K on some, with
an extra reduce kernel); the kernels here get 3.3-4.6 TB/s (benchmarks/triton_kernels.py). They
also replace the small ops around the matmuls, which cost the torch path a fifth of the step:

- `linear`: a GEMV for one token, a thin tensor-core GEMM for up to 16 (verify).
- `add_rms_norm`: the residual add and the next RMSNorm in one pass.
- `silu_mul`: silu(gate) * up of the fused gate|up projection.
- `rope_to_cache`: per-head RMSNorm (Qwen3) and RoPE ("neox" halves, as transformers) of q and
  k, K and V written into the static cache at their slots, in place (the compiled torch path
  rewrote each layer's whole cache); returns the rotated q.
- `attention`: split-KV ("flash decoding") attention of the new tokens' query heads over the
  cache under a bool mask, skipping blocks the mask hides; a second kernel combines the splits
  by their log-sum-exp.

Numerics: the norm and silu kernels round where the torch path rounds; RoPE and attention are
computed in float32 without intermediate rounding, so they match to bf16 rounding, not bit for
bit. tests/test_triton_ops.py checks each kernel against torch (on the CPU through Triton's
interpreter, TRITON_INTERPRET=1). Import this module only where Triton is installed.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from torch import Tensor

THIN_GEMM_ROWS = 16  # rows a `linear` call takes
BLOCK_SLOTS = 64  # cache slots per inner attention step
MIN_ATTENTION_PROGRAMS = 264  # two waves on a 132-SM H100 / H200: the cache is read in parallel

@triton.jit
def _gemv_kernel(x_ptr, w_ptr, bias_ptr, y_ptr, N, K, HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr, K_BLOCKS: tl.constexpr):
    """y[n] = sum_k W[n, k] x[k] (+ bias[n]) for BLOCK_N rows n: products summed in registers."""
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = rows < N
    ks = tl.arange(0, BLOCK_K)
    partial = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    for kb in range(K_BLOCKS):
        offs_k = kb * BLOCK_K + ks
        k_mask = offs_k < K
        w = tl.load(w_ptr + rows[:, None] * K + offs_k[None, :], mask=row_mask[:, None] & k_mask[None, :], other=0.0)
        x = tl.load(x_ptr + offs_k, mask=k_mask, other=0.0)
        partial += w.to(tl.float32) * x.to(tl.float32)[None, :]
    y = tl.sum(partial, axis=1)
    if HAS_BIAS:
        y += tl.load(bias_ptr + rows, mask=row_mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + rows, y.to(y_ptr.dtype.element_ty), mask=row_mask)


@triton.jit
def _thin_gemm_kernel(x_ptr, w_ptr, bias_ptr, y_ptr, M, N, K, HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_K: tl.constexpr, K_BLOCKS: tl.constexpr):
    """y[m, n] for all M <= 16 rows m and BLOCK_N columns n: tensor-core dots over 16 padded rows."""
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = rows < N
    offs_m = tl.arange(0, 16)
    m_mask = offs_m < M
    ks = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_N, 16), dtype=tl.float32)
    for kb in range(K_BLOCKS):
        offs_k = kb * BLOCK_K + ks
        k_mask = offs_k < K
        w = tl.load(w_ptr + rows[:, None] * K + offs_k[None, :], mask=row_mask[:, None] & k_mask[None, :], other=0.0)
        x = tl.load(x_ptr + offs_m[:, None] * K + offs_k[None, :], mask=m_mask[:, None] & k_mask[None, :], other=0.0)
        acc = tl.dot(w, tl.trans(x), acc)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + rows, mask=row_mask, other=0.0).to(tl.float32)[:, None]
    tl.store(y_ptr + offs_m[None, :] * N + rows[:, None], acc.to(y_ptr.dtype.element_ty),
             mask=row_mask[:, None] & m_mask[None, :])


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None, out_dtype: torch.dtype | None = None) -> Tensor:
    """x @ weight.T (+ bias) for x [M, K] with M <= 16 rows (contiguous), weight [N, K]
    (contiguous), bias [N]: [M, N] in out_dtype (default x's), accumulated in float32.

    M = 1 is a GEMV, M > 1 a thin tensor-core GEMM; block sizes from in-graph sweeps on an H200
    (benchmarks/triton_kernels.py): one row, o_proj 10.1 vs cuBLAS 13.5 us, gate|up 53.9 vs
    57.3 us; 16 rows, o_proj 11.7 vs 13.9 us, gate|up 58.5 vs 58.4 us. Raises ValueError for M > 16.
    """
    x = x.contiguous()
    m, k = x.shape
    n = weight.shape[0]
    if m > THIN_GEMM_ROWS:
        raise ValueError(f"triton linear: {m} rows, at most {THIN_GEMM_ROWS}")
    y = torch.empty(m, n, device=x.device, dtype=out_dtype or x.dtype)
    if m == 1:
        block_n, block_k, num_stages = (2, 2048, 1) if k <= 8192 else (4, 512, 3)
        block_k = min(block_k, max(16, triton.next_power_of_2(k)))
        _gemv_kernel[(triton.cdiv(n, block_n),)](
            x, weight, bias, y, n, k, HAS_BIAS=bias is not None, BLOCK_N=block_n, BLOCK_K=block_k,
            K_BLOCKS=triton.cdiv(k, block_k), num_warps=4, num_stages=num_stages)
    else:
        block_n, block_k, num_stages = (32, 512, 4) if n <= 4096 else (64, 256, 4) if n <= 8192 else (64, 128, 2)
        block_k = min(block_k, max(16, triton.next_power_of_2(k)))
        _thin_gemm_kernel[(triton.cdiv(n, block_n),)](
            x, weight, bias, y, m, n, k, HAS_BIAS=bias is not None, BLOCK_N=block_n, BLOCK_K=block_k,
            K_BLOCKS=triton.cdiv(k, block_k), num_warps=4, num_stages=num_stages)
    return y


@triton.jit
def _add_rms_norm_kernel(x_ptr, delta_ptr, sum_ptr, out_ptr, weight_ptr, H, eps,
                         HAS_DELTA: tl.constexpr, BLOCK_H: tl.constexpr):
    """Program m: row m of sum = x + delta (rounded to x's dtype) and weight * rms_norm(sum)."""
    m = tl.program_id(0)
    cols = tl.arange(0, BLOCK_H)
    col_mask = cols < H
    x = tl.load(x_ptr + m * H + cols, mask=col_mask, other=0.0)
    if HAS_DELTA:
        x = (x.to(tl.float32) + tl.load(delta_ptr + m * H + cols, mask=col_mask, other=0.0).to(tl.float32))
        x = x.to(sum_ptr.dtype.element_ty)
        tl.store(sum_ptr + m * H + cols, x, mask=col_mask)
    xf = x.to(tl.float32)
    normed = (xf * tl.rsqrt(tl.sum(xf * xf, axis=0) / H + eps)).to(out_ptr.dtype.element_ty)
    weight = tl.load(weight_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + m * H + cols, (weight * normed.to(tl.float32)).to(out_ptr.dtype.element_ty), mask=col_mask)


def add_rms_norm(x: Tensor, delta: Tensor | None, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """(s, weight * RMSNorm(s)) with s = x + delta (x itself when delta is None), rounded as
    the torch path rounds them (`draft.rms_norm`: normalised in float32, cast, then scaled).

    x, delta: [M, H] contiguous, bf16 / fp16 (float32 works too); weight [H]. Returns two [M, H]
    tensors in x's dtype.
    """
    total = torch.empty_like(x) if delta is not None else x
    out = torch.empty_like(x)
    block_h = triton.next_power_of_2(x.shape[1])
    _add_rms_norm_kernel[(x.shape[0],)](x, delta, total, out, weight, x.shape[1], eps, HAS_DELTA=delta is not None,
                                        BLOCK_H=block_h, num_warps=min(16, max(4, block_h // 512)))
    return total, out


@triton.jit
def _silu_mul_kernel(gate_up_ptr, out_ptr, I, BLOCK: tl.constexpr):
    """Program (m, block): silu(gate) * up over BLOCK columns of row m, rounded as F.silu then *."""
    m, cols = tl.program_id(0), tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    col_mask = cols < I
    gate = tl.load(gate_up_ptr + m * 2 * I + cols, mask=col_mask, other=0.0).to(tl.float32)
    up = tl.load(gate_up_ptr + m * 2 * I + I + cols, mask=col_mask, other=0.0).to(tl.float32)
    silu = (gate * tl.sigmoid(gate)).to(out_ptr.dtype.element_ty).to(tl.float32)
    tl.store(out_ptr + m * I + cols, (silu * up).to(out_ptr.dtype.element_ty), mask=col_mask)


def silu_mul(gate_up: Tensor) -> Tensor:
    """silu(gate) * up of a fused gate|up projection output [M, 2I] (contiguous); [M, I]."""
    m, inter = gate_up.shape[0], gate_up.shape[1] // 2
    out = torch.empty(m, inter, device=gate_up.device, dtype=gate_up.dtype)
    _silu_mul_kernel[(m, triton.cdiv(inter, 1024))](gate_up, out, inter, BLOCK=1024)
    return out


@triton.jit
def _rope_to_cache_kernel(qkv_ptr, pos_ptr, slot_ptr, inv_freq_ptr, q_norm_ptr, k_norm_ptr, q_out_ptr,
                          k_cache_ptr, v_cache_ptr, T, num_heads, num_kv_heads, cache_len, eps,
                          QK_NORM: tl.constexpr, HEAD_DIM: tl.constexpr):
    """Program (m, h): head h of token m; h < nq: rotated q; then k heads (to the cache); then v."""
    m, h = tl.program_id(0), tl.program_id(1)
    half = tl.arange(0, HEAD_DIM // 2)
    row = qkv_ptr + (m * (num_heads + 2 * num_kv_heads) + h) * HEAD_DIM
    x1 = tl.load(row + half).to(tl.float32)
    x2 = tl.load(row + HEAD_DIM // 2 + half).to(tl.float32)
    b, t = m // T, m % T
    slot = tl.load(slot_ptr + t)
    if h >= num_heads + num_kv_heads:  # v: stored as is
        dst = v_cache_ptr + ((b * num_kv_heads + h - num_heads - num_kv_heads) * cache_len + slot) * HEAD_DIM
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


def rope_to_cache(qkv: Tensor, position_ids: Tensor, cache_slots: Tensor, inv_freq: Tensor,
                  k_cache: Tensor, v_cache: Tensor, num_heads: int, q_norm: Tensor | None = None,
                  k_norm: Tensor | None = None, eps: float = 0.0) -> Tensor:
    """Rotate q and k of new tokens, write K and V into the cache in place, return rotated q.

    qkv: [B*T, (nq + 2 n_kv) * D] contiguous (the fused projection's output, q | k | v heads);
    position_ids [B, T] long (RoPE positions); cache_slots [T] long (shared by the batch);
    inv_freq [D/2] float32; k_cache, v_cache [B_max, n_kv, S_max, D] contiguous;
    q_norm / k_norm [D]: per-head RMSNorm weights before RoPE (Qwen3), or None.
    Returns q [B*T, nq, D] in qkv's dtype.
    """
    num_kv_heads, cache_len, head_dim = k_cache.shape[1], k_cache.shape[2], k_cache.shape[3]
    m, t = qkv.shape[0], position_ids.shape[1]
    q = torch.empty(m, num_heads, head_dim, device=qkv.device, dtype=qkv.dtype)
    _rope_to_cache_kernel[(m, num_heads + 2 * num_kv_heads)](
        qkv, position_ids, cache_slots, inv_freq, q_norm, k_norm, q, k_cache, v_cache, t, num_heads,
        num_kv_heads, cache_len, eps, QK_NORM=q_norm is not None, HEAD_DIM=head_dim)
    return q


@triton.jit
def _attention_split_kernel(q_ptr, k_cache_ptr, v_cache_ptr, mask_ptr, out_ptr, lse_ptr, T, num_slots,
                            num_kv_heads, cache_len, mask_b_stride, mask_t_stride, num_splits, scale,
                            GROUP: tl.constexpr, BLOCK_R: tl.constexpr, HEAD_DIM: tl.constexpr,
                            SPLIT: tl.constexpr, BLOCK_S: tl.constexpr):
    """Program (b * n_kv + kv head, split): the GROUP query heads of that kv head for all T
    tokens (rows r = t * GROUP + g) over slots [split * SPLIT, (split + 1) * SPLIT)."""
    bh, split = tl.program_id(0), tl.program_id(1)
    b, kv_head = bh // num_kv_heads, bh % num_kv_heads
    r = tl.arange(0, BLOCK_R)
    t, g = r // GROUP, r % GROUP
    r_mask = t < T
    d = tl.arange(0, HEAD_DIM)
    q_rows = (b * T + t) * (num_kv_heads * GROUP) + kv_head * GROUP + g
    q = tl.load(q_ptr + q_rows[:, None] * HEAD_DIM + d[None, :], mask=r_mask[:, None], other=0.0)
    kv_base = (b * num_kv_heads + kv_head) * cache_len * HEAD_DIM
    m_i = tl.full((BLOCK_R,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_R,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_R, HEAD_DIM), dtype=tl.float32)
    for block in range(SPLIT // BLOCK_S):
        s = split * SPLIT + block * BLOCK_S + tl.arange(0, BLOCK_S)
        s_mask = s < num_slots
        visible = tl.load(mask_ptr + b * mask_b_stride + t[:, None] * mask_t_stride + s[None, :],
                          mask=r_mask[:, None] & s_mask[None, :], other=0) != 0
        if tl.max(visible.to(tl.int32)) > 0:  # blocks the mask hides are not read
            kv_offsets = kv_base + s[:, None] * HEAD_DIM + d[None, :]
            k = tl.load(k_cache_ptr + kv_offsets, mask=s_mask[:, None], other=0.0)
            v = tl.load(v_cache_ptr + kv_offsets, mask=s_mask[:, None], other=0.0)  # in flight with k
            scores = tl.where(visible, tl.dot(q, tl.trans(k)) * scale, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(scores, axis=1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.exp(scores - m_safe[:, None])
            alpha = tl.exp(m_i - m_safe)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
            l_i = l_i * alpha + tl.sum(p, axis=1)
            m_i = m_new
    seen = l_i > 0
    part = (bh * num_splits + split) * BLOCK_R + r
    tl.store(out_ptr + part[:, None] * HEAD_DIM + d[None, :], acc / tl.where(seen, l_i, 1.0)[:, None])
    tl.store(lse_ptr + part, tl.where(seen, m_i + tl.log(tl.where(seen, l_i, 1.0)), float("-inf")))


@triton.jit
def _attention_combine_kernel(part_ptr, lse_ptr, out_ptr, T, num_kv_heads, num_splits,
                              GROUP: tl.constexpr, BLOCK_R: tl.constexpr, HEAD_DIM: tl.constexpr,
                              SPLITS: tl.constexpr):
    """Program (b * n_kv + kv head, row r): sum of the splits' outputs weighted by exp(lse)."""
    bh, r = tl.program_id(0), tl.program_id(1)
    b, kv_head = bh // num_kv_heads, bh % num_kv_heads
    t, g = r // GROUP, r % GROUP
    splits = tl.arange(0, SPLITS)
    d = tl.arange(0, HEAD_DIM)
    part = (bh * num_splits + splits) * BLOCK_R + r
    lse = tl.load(lse_ptr + part, mask=splits < num_splits, other=float("-inf"))
    weight = tl.exp(lse - tl.max(lse, axis=0))
    seen = lse > float("-inf")  # splits the mask hid entirely are not read
    o = tl.load(part_ptr + part[:, None] * HEAD_DIM + d[None, :], mask=seen[:, None], other=0.0)
    y = tl.sum(o * weight[:, None], axis=0) / tl.sum(weight, axis=0)
    row = (b * T + t) * (num_kv_heads * GROUP) + kv_head * GROUP + g
    tl.store(out_ptr + row * HEAD_DIM + d, y.to(out_ptr.dtype.element_ty))


def attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, attn_mask: Tensor) -> Tensor:
    """Softmax(q K^T / sqrt(D) + mask) V of new tokens over the cache (grouped-query heads).

    q: [B*T, nq, D] contiguous; k_cache, v_cache: [B_max, n_kv, S_max, D] contiguous, query
    head h reading kv head h // (nq / n_kv) (transformers' repeat_kv); attn_mask [B, 1, T, S]
    bool over slots 0..S-1 (S <= S_max, last dim contiguous; every row must see a slot).
    Returns [B*T, nq, D] in q's dtype. D: a power of two >= 16; GROUP * T <= 128.
    """
    batch, _, t, num_slots = attn_mask.shape
    num_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads, cache_len = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // num_kv_heads
    block_r = max(16, triton.next_power_of_2(group * t))
    blocks = triton.cdiv(num_slots, BLOCK_SLOTS)
    blocks_per_split = max(1, blocks // triton.cdiv(MIN_ATTENTION_PROGRAMS, batch * num_kv_heads))
    num_splits = triton.cdiv(blocks, blocks_per_split)
    parts = torch.empty(batch * num_kv_heads, num_splits, block_r, head_dim, device=q.device,
                        dtype=torch.float32)
    lse = torch.empty(batch * num_kv_heads, num_splits, block_r, device=q.device, dtype=torch.float32)
    _attention_split_kernel[(batch * num_kv_heads, num_splits)](
        q, k_cache, v_cache, attn_mask, parts, lse, t, num_slots, num_kv_heads, cache_len,
        attn_mask.stride(0), attn_mask.stride(2), num_splits, 1.0 / math.sqrt(head_dim),
        GROUP=group, BLOCK_R=block_r, HEAD_DIM=head_dim, SPLIT=BLOCK_SLOTS * blocks_per_split,
        BLOCK_S=BLOCK_SLOTS, num_warps=4)
    out = torch.empty_like(q)
    _attention_combine_kernel[(batch * num_kv_heads, group * t)](
        parts, lse, out, t, num_kv_heads, num_splits, GROUP=group, BLOCK_R=block_r, HEAD_DIM=head_dim,
        SPLITS=triton.next_power_of_2(num_splits))
    return out
