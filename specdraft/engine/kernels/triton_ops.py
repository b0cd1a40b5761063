"""Triton kernels for the target's decode and verify forwards (1 to 64 new tokens, batch 1),
and the drafter's steps.

At batch 1 a decode step reads every weight once for a few multiply-adds per element: its time
is weight bytes / memory bandwidth, plus whatever else runs. The kernels here stream the weights
at least as fast as cuBLAS inside a CUDA graph (benchmarks/triton_kernels.py; figures in
benchmarks/RESULTS.md) and replace the small ops around the matmuls:

- `linear`: a GEMV for one token, a thin tensor-core GEMM for up to 64 (verify). Two variants
  do the next op in their epilogue: `linear_silu_mul` (silu(gate) * up of the fused gate|up
  projection) and `qkv_rope_to_cache` (RoPE of q and k, K and V written into the cache).
- `add_rms_norm`: the residual add and the next RMSNorm in one pass.
- `rope_to_cache`: per-head RMSNorm (Qwen3) and RoPE ("neox" halves, as transformers) of q and
  k, K and V written into the static cache at their slots, in place (the compiled torch path
  rewrote each layer's whole cache); returns the rotated q.
- `attention`: split-KV ("flash decoding") attention of the new tokens' query heads over the
  cache under a bool mask, skipping blocks the mask hides; a second kernel combines the splits
  by their log-sum-exp.

On Hopper every kernel is launched with programmatic dependent launch (`use_pdl`): it starts
while the kernel before it finishes, and a GEMV requests its first weights, attention its first
block of cached K / V (all but the slots being written), before it waits.
Each kernel waits before it lets the next one start, so at most two overlap (releasing the next
kernel first was slower).

Numerics: the norm and silu kernels round where the torch path rounds; RoPE and attention are
computed in float32 without intermediate rounding, so they match to bf16 rounding, not bit for
bit. tests/unit/engine/test_triton_ops.py checks each kernel against torch (on the CPU through Triton's
interpreter, TRITON_INTERPRET=1). Import this module only where Triton is installed.
"""

from __future__ import annotations

import functools
import math
import os

import torch
import triton
import triton.language as tl
from torch import Tensor

THIN_GEMM_ROWS = 64  # rows a `linear` call takes (a thin GEMM pads them to 16, 32 or 64)
BLOCK_SLOTS = 64  # cache slots per inner attention step
MIN_ATTENTION_PROGRAMS = 264  # two waves on a 132-SM H100 / H200: the cache is read in parallel
ATTENTION_ROWS = (
    64  # query rows (tokens x query heads of one kv head) an attention program holds at most
)

# what a linear kernel does with its outputs (EPILOGUE; constexpr: kernels read them as globals)
PLAIN, SILU_MUL, ROPE = tl.constexpr(0), tl.constexpr(1), tl.constexpr(2)


@functools.cache
def use_pdl(device: torch.device) -> bool:
    """Whether kernels launch with programmatic dependent launch (PDL, CUDA compute capability
    >= 9: Hopper): a kernel's programs start while the previous kernel finishes, load what does
    not depend on it (weights), then wait for it (griddepcontrol.wait). Off in the interpreter."""
    return (
        device.type == "cuda"
        and os.environ.get("TRITON_INTERPRET") != "1"
        and torch.cuda.get_device_capability(device)[0] >= 9
    )


def pdl_launch(device: torch.device) -> dict:
    """Launch arguments of a kernel with a USE_PDL parameter: {USE_PDL, launch_pdl} when `use_pdl`."""
    return {"USE_PDL": True, "launch_pdl": True} if use_pdl(device) else {"USE_PDL": False}


@triton.jit
def _linear_epilogue(
    y_a,
    y_b,
    n,
    m,
    mask,
    M,
    bias_ptr,
    y_ptr,
    N,
    HALF,
    T,
    pos_ptr,
    slot_ptr,
    inv_freq_ptr,
    k_cache_ptr,
    v_cache_ptr,
    num_heads,
    num_kv_heads,
    cache_len,
    HAS_BIAS: tl.constexpr,
    EPILOGUE: tl.constexpr,
):
    """Store outputs n of rows m (broadcast together; y_a, y_b float32 sums of rows a(n), a(n) + HALF).

    PLAIN: y[m, n] = y_a (+ bias[n]). SILU_MUL: y[m, n] = silu(gate) * up, gate = y_a, up = y_b,
    rounded as F.silu then *. ROPE (fused q|k|v projection, HALF = head_dim / 2): pair n is
    element j = n % HALF of head n // HALF and its partner j + HALF; q heads are rotated into
    y [M, nq, D], k heads rotated and v heads as they are written into the caches at slot
    slot[m % T] of batch row m // T. Values are rounded to the weights' dtype first, as the
    unfused path rounds the projection's output before RoPE.
    """
    if EPILOGUE == PLAIN:
        if HAS_BIAS:
            y_a += tl.load(bias_ptr + n, mask=mask, other=0.0).to(tl.float32)
        tl.store(y_ptr + m * N + n, y_a.to(y_ptr.dtype.element_ty), mask=mask)
    elif EPILOGUE == SILU_MUL:
        gate = y_a.to(y_ptr.dtype.element_ty).to(tl.float32)
        up = y_b.to(y_ptr.dtype.element_ty).to(tl.float32)
        silu = (gate * tl.sigmoid(gate)).to(y_ptr.dtype.element_ty).to(tl.float32)
        tl.store(y_ptr + m * N + n, (silu * up).to(y_ptr.dtype.element_ty), mask=mask)
    else:
        head, j = n // HALF, n % HALF
        if HAS_BIAS:
            row = head * 2 * HALF + j
            y_a += tl.load(bias_ptr + row, mask=mask, other=0.0).to(tl.float32)
            y_b += tl.load(bias_ptr + row + HALF, mask=mask, other=0.0).to(tl.float32)
        a = y_a.to(y_ptr.dtype.element_ty).to(tl.float32)
        b = y_b.to(y_ptr.dtype.element_ty).to(tl.float32)
        m_mask = m < M
        angle = tl.load(pos_ptr + m, mask=m_mask, other=0).to(tl.float32) * tl.load(
            inv_freq_ptr + j
        )
        cos, sin = tl.cos(angle), tl.sin(angle)
        rotate = head < num_heads + num_kv_heads  # q and k; v is stored as it is
        a, b = tl.where(rotate, a * cos - b * sin, a), tl.where(rotate, b * cos + a * sin, b)
        slot = tl.load(slot_ptr + m % T, mask=m_mask, other=0)
        kv_row = ((m // T) * num_kv_heads + head - num_heads) * cache_len + slot
        dst = tl.where(
            head < num_heads,
            y_ptr + (m * num_heads + head) * 2 * HALF + j,
            tl.where(
                rotate,
                k_cache_ptr + kv_row * 2 * HALF + j,
                v_cache_ptr + (kv_row - num_kv_heads * cache_len) * 2 * HALF + j,
            ),
        )
        tl.store(dst, a.to(y_ptr.dtype.element_ty), mask=mask)
        tl.store(dst + HALF, b.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _load_rows(w_ptr, rows, HALF, K, kb, n_mask, ks, PAIRED: tl.constexpr, BLOCK_K: tl.constexpr):
    """K block kb of weight rows `rows` and, when PAIRED, of rows + HALF ([BLOCK_N, BLOCK_K] each)."""
    offs_k = kb * BLOCK_K + ks
    w_mask = n_mask[:, None] & (offs_k < K)[None, :]
    w_a = tl.load(w_ptr + rows[:, None] * K + offs_k[None, :], mask=w_mask, other=0.0)
    w_b = w_a
    if PAIRED:
        w_b = tl.load(w_ptr + (rows + HALF)[:, None] * K + offs_k[None, :], mask=w_mask, other=0.0)
    return w_a, w_b


@triton.jit
def _gemv_kernel(
    x_ptr,
    w_ptr,
    bias_ptr,
    y_ptr,
    N,
    K,
    HALF,
    T,
    pos_ptr,
    slot_ptr,
    inv_freq_ptr,
    k_cache_ptr,
    v_cache_ptr,
    num_heads,
    num_kv_heads,
    cache_len,
    HAS_BIAS: tl.constexpr,
    EPILOGUE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    K_BLOCKS: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """One token, BLOCK_N outputs n (weight rows a(n), and a(n) + HALF unless PLAIN): products
    summed in registers, the next K block's weights loaded while this one is summed. With PDL
    the first block is requested before waiting for the kernel that wrote x."""
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = n < N
    rows = n // HALF * (2 * HALF) + n % HALF if EPILOGUE != PLAIN else n
    ks = tl.arange(0, BLOCK_K)
    acc_a = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    acc_b = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    w_a, w_b = _load_rows(w_ptr, rows, HALF, K, 0, n_mask, ks, EPILOGUE != PLAIN, BLOCK_K)
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    for kb in range(K_BLOCKS):
        offs_k = kb * BLOCK_K + ks
        x = tl.load(x_ptr + offs_k, mask=offs_k < K, other=0.0).to(tl.float32)[None, :]
        acc_a += w_a.to(tl.float32) * x
        if EPILOGUE != PLAIN:
            acc_b += w_b.to(tl.float32) * x
        w_a, w_b = _load_rows(w_ptr, rows, HALF, K, kb + 1, n_mask, ks, EPILOGUE != PLAIN, BLOCK_K)
    _linear_epilogue(
        tl.sum(acc_a, axis=1),
        tl.sum(acc_b, axis=1),
        n,
        0,
        n_mask,
        1,
        bias_ptr,
        y_ptr,
        N,
        HALF,
        T,
        pos_ptr,
        slot_ptr,
        inv_freq_ptr,
        k_cache_ptr,
        v_cache_ptr,
        num_heads,
        num_kv_heads,
        cache_len,
        HAS_BIAS,
        EPILOGUE,
    )


@triton.jit
def _thin_gemm_kernel(
    x_ptr,
    w_ptr,
    bias_ptr,
    y_ptr,
    M,
    N,
    K,
    HALF,
    T,
    pos_ptr,
    slot_ptr,
    inv_freq_ptr,
    k_cache_ptr,
    v_cache_ptr,
    num_heads,
    num_kv_heads,
    cache_len,
    HAS_BIAS: tl.constexpr,
    EPILOGUE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    K_BLOCKS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """All M <= BLOCK_M rows m, BLOCK_N outputs n (as `_gemv_kernel`): tensor-core dots over
    BLOCK_M (16, 32 or 64) padded rows."""
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = n < N
    rows = n // HALF * (2 * HALF) + n % HALF if EPILOGUE != PLAIN else n
    offs_m = tl.arange(0, BLOCK_M)
    m_mask = offs_m < M
    ks = tl.arange(0, BLOCK_K)
    acc_a = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    acc_b = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for kb in range(K_BLOCKS):
        offs_k = kb * BLOCK_K + ks
        w_a, w_b = _load_rows(w_ptr, rows, HALF, K, kb, n_mask, ks, EPILOGUE != PLAIN, BLOCK_K)
        x = tl.load(
            x_ptr + offs_m[:, None] * K + offs_k[None, :],
            mask=m_mask[:, None] & (offs_k < K)[None, :],
            other=0.0,
        )
        acc_a = tl.dot(w_a, tl.trans(x), acc_a)
        if EPILOGUE != PLAIN:
            acc_b = tl.dot(w_b, tl.trans(x), acc_b)
    _linear_epilogue(
        acc_a,
        acc_b,
        n[:, None],
        offs_m[None, :],
        n_mask[:, None] & m_mask[None, :],
        M,
        bias_ptr,
        y_ptr,
        N,
        HALF,
        T,
        pos_ptr,
        slot_ptr,
        inv_freq_ptr,
        k_cache_ptr,
        v_cache_ptr,
        num_heads,
        num_kv_heads,
        cache_len,
        HAS_BIAS,
        EPILOGUE,
    )


def _linear_config(m: int, rows: int, k: int, paired: bool) -> tuple[int, int, int]:
    """(BLOCK_N outputs, BLOCK_K, num_stages) from sweeps inside the whole forward's graph
    (benchmarks/RESULTS.md): one configuration for 2-32 rows; for 33-64 rows, 3 stages where
    <= 4096 weight rows (4 stages of 32 x 512 weight and 64 x 512 input blocks exceed the
    shared memory) and 128-wide K blocks for 4097-8192 rows (q|k|v)."""
    if m == 1:
        block_n, block_k, num_stages = (2, 2048, 1) if k <= 8192 else (1, 1024, 1)
        return max(1, block_n // 2) if paired else block_n, block_k, num_stages
    if rows > 8192:  # gate|up: 128 weight rows, 4 stages; lm_head: 3 stages (both measured best)
        block_n, block_k, num_stages = (128, 128, 4) if paired else (64, 128, 3)
    elif rows <= 4096:
        block_n, block_k, num_stages = (32, 512, 4 if m <= 32 else 3)
    else:
        block_n, block_k, num_stages = (64, 256 if m <= 32 else 128, 4)
    return block_n // 2 if paired else block_n, block_k, num_stages


def _launch_linear(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    y: Tensor,
    num_out: int,
    half: int,
    epilogue: tl.constexpr,
    rope: tuple = (None, None, None, None, None, 1, 0, 0, 0),
) -> None:
    """Launch the GEMV (one row of x) or thin GEMM (2-64 rows) for `num_out` outputs per row."""
    m, k = x.shape
    if m > THIN_GEMM_ROWS:
        raise ValueError(f"triton linear: {m} rows, at most {THIN_GEMM_ROWS}")
    pos, slots, inv_freq, k_cache, v_cache, t, num_heads, num_kv_heads, cache_len = rope
    block_n, block_k, num_stages = _linear_config(
        m, weight.shape[0], k, epilogue.value != PLAIN.value
    )
    block_k = min(block_k, max(16, triton.next_power_of_2(k)))
    common = dict(
        HAS_BIAS=bias is not None,
        EPILOGUE=epilogue.value,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        K_BLOCKS=triton.cdiv(k, block_k),
        num_warps=4,
        num_stages=num_stages,
        **pdl_launch(x.device),
    )
    grid = (triton.cdiv(num_out, block_n),)
    if m == 1:
        _gemv_kernel[grid](
            x,
            weight,
            bias,
            y,
            num_out,
            k,
            half,
            t,
            pos,
            slots,
            inv_freq,
            k_cache,
            v_cache,
            num_heads,
            num_kv_heads,
            cache_len,
            **common,
        )
    else:
        _thin_gemm_kernel[grid](
            x,
            weight,
            bias,
            y,
            m,
            num_out,
            k,
            half,
            t,
            pos,
            slots,
            inv_freq,
            k_cache,
            v_cache,
            num_heads,
            num_kv_heads,
            cache_len,
            BLOCK_M=max(16, triton.next_power_of_2(m)),
            **common,
        )


def linear(
    x: Tensor, weight: Tensor, bias: Tensor | None = None, out_dtype: torch.dtype | None = None
) -> Tensor:
    """x @ weight.T (+ bias) for x [M, K] with M <= 64 rows (contiguous), weight [N, K]
    (contiguous), bias [N]: [M, N] in out_dtype (default x's), accumulated in float32.

    M = 1 is a GEMV, M > 1 a thin tensor-core GEMM; block sizes from in-graph sweeps
    (benchmarks/triton_kernels.py, `_linear_config`). Raises ValueError for M > 64.
    """
    x = x.contiguous()
    y = torch.empty(x.shape[0], weight.shape[0], device=x.device, dtype=out_dtype or x.dtype)
    _launch_linear(x, weight, bias, y, weight.shape[0], 1, PLAIN)
    return y


def linear_silu_mul(x: Tensor, w13: Tensor) -> Tensor:
    """silu(x @ gate.T) * (x @ up.T) for a fused gate|up weight w13 [2I, K] (gate rows first),
    x [M, K], M <= 64: [M, I] in x's dtype, rounded as the torch path rounds F.silu(gate) * up
    of the projection rounded to x's dtype."""
    x = x.contiguous()
    inter = w13.shape[0] // 2
    y = torch.empty(x.shape[0], inter, device=x.device, dtype=x.dtype)
    _launch_linear(x, w13, None, y, inter, inter, SILU_MUL)
    return y


def qkv_rope_to_cache(
    x: Tensor,
    wqkv: Tensor,
    bias: Tensor | None,
    position_ids: Tensor,
    cache_slots: Tensor,
    inv_freq: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    num_heads: int,
) -> Tensor:
    """The fused q|k|v projection with RoPE and the cache writes in its epilogue: what
    `rope_to_cache(linear(x, wqkv, bias), ...)` does without q-/k-norm, in one kernel.

    x [B*T, K] (M <= 64 rows); wqkv [(nq + 2 n_kv) * D, K], bias the same rows or None; the
    other arguments as `rope_to_cache`. Returns q [B*T, nq, D] in x's dtype.
    """
    x = x.contiguous()
    num_kv_heads, cache_len, head_dim = k_cache.shape[1], k_cache.shape[2], k_cache.shape[3]
    q = torch.empty(x.shape[0], num_heads, head_dim, device=x.device, dtype=x.dtype)
    rope = (
        position_ids,
        cache_slots,
        inv_freq,
        k_cache,
        v_cache,
        position_ids.shape[1],
        num_heads,
        num_kv_heads,
        cache_len,
    )
    _launch_linear(x, wqkv, bias, q, wqkv.shape[0] // 2, head_dim // 2, ROPE, rope)
    return q


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
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
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
        num_warps=min(16, max(4, block_h // 512)),
        **pdl_launch(x.device),
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
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    m, h = tl.program_id(0), tl.program_id(1)
    half = tl.arange(0, HEAD_DIM // 2)
    row = qkv_ptr + (m * (num_heads + 2 * num_kv_heads) + h) * HEAD_DIM
    x1 = tl.load(row + half).to(tl.float32)
    x2 = tl.load(row + HEAD_DIM // 2 + half).to(tl.float32)
    b, t = m // T, m % T
    slot = tl.load(slot_ptr + t)
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


def rope_to_cache(
    qkv: Tensor,
    position_ids: Tensor,
    cache_slots: Tensor,
    inv_freq: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    num_heads: int,
    q_norm: Tensor | None = None,
    k_norm: Tensor | None = None,
    eps: float = 0.0,
) -> Tensor:
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
        qkv,
        position_ids,
        cache_slots,
        inv_freq,
        q_norm,
        k_norm,
        q,
        k_cache,
        v_cache,
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


@triton.jit
def _load_block(
    mask_ptr,
    k_cache_ptr,
    v_cache_ptr,
    mask_rows,
    r_mask,
    kv_base,
    s,
    num_slots,
    d,
    HEAD_DIM: tl.constexpr,
):
    """Slots s [S] of one kv head: (visible [R, S], the mask at rows mask_rows [R] (offsets),
    k, v [S, D]); K and V are read only at slots some row sees (0 elsewhere)."""
    s_mask = s < num_slots
    visible = (
        tl.load(
            mask_ptr + mask_rows[:, None] + s[None, :],
            mask=r_mask[:, None] & s_mask[None, :],
            other=0,
        )
        != 0
    )
    read = (s_mask & (tl.max(visible.to(tl.int32), axis=0) > 0))[:, None]
    kv_offsets = kv_base + s[:, None] * HEAD_DIM + d[None, :]
    k = tl.load(k_cache_ptr + kv_offsets, mask=read, other=0.0)
    v = tl.load(v_cache_ptr + kv_offsets, mask=read, other=0.0)  # in flight with k
    return visible, k, v


@triton.jit
def _attend_block(q, k, v, visible, m_i, l_i, acc, scale):
    """One block of online softmax: (m_i, l_i, acc) updated with the slots `visible` [R, S]
    marks (k, v [S, D]; hidden slots may hold anything)."""
    scores = tl.where(visible, tl.dot(q, tl.trans(k)) * scale, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(scores, axis=1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp(scores - m_safe[:, None])
    alpha = tl.exp(m_i - m_safe)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    return m_new, l_i, acc


@triton.jit
def _attention_split_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    mask_ptr,
    slot_ptr,
    out_ptr,
    lse_ptr,
    T,
    num_slots,
    num_kv_heads,
    cache_len,
    mask_b_stride,
    mask_t_stride,
    num_splits,
    num_rows,
    scale,
    GROUP: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_T: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    SPLIT: tl.constexpr,
    BLOCK_S: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """Program (b * n_kv + kv head, split, tile): rows r = t * GROUP + g (token t, query head g
    of that kv head) tile * BLOCK_R .. + BLOCK_R - 1 of the T * GROUP (num_rows: the tiles'
    rows), over slots [split * SPLIT, (split + 1) * SPLIT).

    The split's first block of K / V is requested before the PDL wait: the kernel before this
    one wrote only this forward's slots (slot_ptr [T]), so a block holding none of them is
    final; a block holding one is read again after the wait."""
    bh, split = tl.program_id(0), tl.program_id(1)
    b, kv_head = bh // num_kv_heads, bh % num_kv_heads
    r = tl.program_id(2) * BLOCK_R + tl.arange(0, BLOCK_R)
    t, g = r // GROUP, r % GROUP
    r_mask = t < T
    d = tl.arange(0, HEAD_DIM)
    kv_base = (b * num_kv_heads + kv_head) * cache_len * HEAD_DIM
    mask_rows = b * mask_b_stride + t * mask_t_stride
    start = split * SPLIT
    s = start + tl.arange(0, BLOCK_S)
    visible, k, v = _load_block(
        mask_ptr, k_cache_ptr, v_cache_ptr, mask_rows, r_mask, kv_base, s, num_slots, d, HEAD_DIM
    )
    if USE_PDL:
        new = tl.load(slot_ptr + tl.arange(0, BLOCK_T), mask=tl.arange(0, BLOCK_T) < T, other=-1)
        written = tl.max(((new >= start) & (new < start + BLOCK_S)).to(tl.int32), axis=0) > 0
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
        if written:
            visible, k, v = _load_block(
                mask_ptr,
                k_cache_ptr,
                v_cache_ptr,
                mask_rows,
                r_mask,
                kv_base,
                s,
                num_slots,
                d,
                HEAD_DIM,
            )
    q_rows = (b * T + t) * (num_kv_heads * GROUP) + kv_head * GROUP + g
    q = tl.load(q_ptr + q_rows[:, None] * HEAD_DIM + d[None, :], mask=r_mask[:, None], other=0.0)
    m_i = tl.full((BLOCK_R,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_R,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_R, HEAD_DIM), dtype=tl.float32)
    m_i, l_i, acc = _attend_block(q, k, v, visible, m_i, l_i, acc, scale)
    for block in range(1, SPLIT // BLOCK_S):
        s = start + block * BLOCK_S + tl.arange(0, BLOCK_S)
        visible, k, v = _load_block(
            mask_ptr,
            k_cache_ptr,
            v_cache_ptr,
            mask_rows,
            r_mask,
            kv_base,
            s,
            num_slots,
            d,
            HEAD_DIM,
        )
        if tl.max(visible.to(tl.int32)) > 0:  # a block the mask hides: nothing read, nothing to add
            m_i, l_i, acc = _attend_block(q, k, v, visible, m_i, l_i, acc, scale)
    seen = l_i > 0
    part = (bh * num_splits + split) * num_rows + r
    tl.store(
        out_ptr + part[:, None] * HEAD_DIM + d[None, :], acc / tl.where(seen, l_i, 1.0)[:, None]
    )
    tl.store(lse_ptr + part, tl.where(seen, m_i + tl.log(tl.where(seen, l_i, 1.0)), float("-inf")))


@triton.jit
def _attention_combine_kernel(
    part_ptr,
    lse_ptr,
    out_ptr,
    T,
    num_kv_heads,
    num_splits,
    num_rows,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    SPLITS: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """Program (b * n_kv + kv head, row r): sum of the splits' outputs weighted by exp(lse)."""
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    bh, r = tl.program_id(0), tl.program_id(1)
    b, kv_head = bh // num_kv_heads, bh % num_kv_heads
    t, g = r // GROUP, r % GROUP
    splits = tl.arange(0, SPLITS)
    d = tl.arange(0, HEAD_DIM)
    part = (bh * num_splits + splits) * num_rows + r
    lse = tl.load(lse_ptr + part, mask=splits < num_splits, other=float("-inf"))
    weight = tl.exp(lse - tl.max(lse, axis=0))
    seen = lse > float("-inf")  # splits the mask hid entirely are not read
    o = tl.load(part_ptr + part[:, None] * HEAD_DIM + d[None, :], mask=seen[:, None], other=0.0)
    y = tl.sum(o * weight[:, None], axis=0) / tl.sum(weight, axis=0)
    row = (b * T + t) * (num_kv_heads * GROUP) + kv_head * GROUP + g
    tl.store(out_ptr + row * HEAD_DIM + d, y.to(out_ptr.dtype.element_ty))


def attention(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, attn_mask: Tensor, cache_slots: Tensor
) -> Tensor:
    """Softmax(q K^T / sqrt(D) + mask) V of new tokens over the cache (grouped-query heads).

    q: [B*T, nq, D] contiguous; k_cache, v_cache: [B_max, n_kv, S_max, D] contiguous, query
    head h reading kv head h // (nq / n_kv) (transformers' repeat_kv); attn_mask [B, 1, T, S]
    bool over slots 0..S-1 (S <= S_max, last dim contiguous; every row must see a slot);
    cache_slots [T] long: the slots whose K / V the kernel launched just before this one wrote
    (`qkv_rope_to_cache`, `rope_to_cache`). With PDL, blocks of other slots are read while that
    kernel finishes: a slot written earlier and not named here would be read stale.
    Returns [B*T, nq, D] in q's dtype. D: a power of two >= 16. The T * GROUP query rows of a
    kv head are split into tiles of at most ATTENTION_ROWS, one program each.
    """
    batch, _, t, num_slots = attn_mask.shape
    num_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads, cache_len = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // num_kv_heads
    block_r = max(16, min(ATTENTION_ROWS, triton.next_power_of_2(group * t)))
    tiles = triton.cdiv(group * t, block_r)
    blocks = triton.cdiv(num_slots, BLOCK_SLOTS)
    blocks_per_split = max(1, blocks // triton.cdiv(MIN_ATTENTION_PROGRAMS, batch * num_kv_heads))
    num_splits = triton.cdiv(blocks, blocks_per_split)
    parts = torch.empty(
        batch * num_kv_heads,
        num_splits,
        tiles * block_r,
        head_dim,
        device=q.device,
        dtype=torch.float32,
    )
    lse = torch.empty(
        batch * num_kv_heads, num_splits, tiles * block_r, device=q.device, dtype=torch.float32
    )
    _attention_split_kernel[(batch * num_kv_heads, num_splits, tiles)](
        q,
        k_cache,
        v_cache,
        attn_mask,
        cache_slots,
        parts,
        lse,
        t,
        num_slots,
        num_kv_heads,
        cache_len,
        attn_mask.stride(0),
        attn_mask.stride(2),
        num_splits,
        tiles * block_r,
        1.0 / math.sqrt(head_dim),
        GROUP=group,
        BLOCK_R=block_r,
        BLOCK_T=max(16, triton.next_power_of_2(t)),
        HEAD_DIM=head_dim,
        SPLIT=BLOCK_SLOTS * blocks_per_split,
        BLOCK_S=BLOCK_SLOTS,
        num_warps=4,
        **pdl_launch(q.device),
    )
    out = torch.empty_like(q)
    _attention_combine_kernel[(batch * num_kv_heads, group * t)](
        parts,
        lse,
        out,
        t,
        num_kv_heads,
        num_splits,
        tiles * block_r,
        GROUP=group,
        HEAD_DIM=head_dim,
        SPLITS=triton.next_power_of_2(num_splits),
        **pdl_launch(q.device),
    )
    return out
