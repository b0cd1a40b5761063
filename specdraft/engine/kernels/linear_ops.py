"""The Triton matmuls of the target's decode / verify forwards and the drafter's steps (1 to 64
rows, batch 1), with the op after them fused into their epilogue.

At batch 1 a decode step reads every weight once for a few multiply-adds per element: its time
is weight bytes / memory bandwidth, plus whatever else runs. These kernels stream the weights at
least as fast as cuBLAS inside a CUDA graph (benchmarks/triton_kernels.py; figures in
benchmarks/RESULTS.md) and replace the small ops around the matmuls:
- `linear`: a GEMV for one token, a thin tensor-core GEMM for up to 64 (verify);
- `linear_silu_mul`: silu(gate) * up of the fused gate|up projection in the epilogue;
- `qkv_rope_to_cache`: RoPE of q and k, K and V written into the cache, in the epilogue
  (what `norm_rope_ops.rope_to_cache` does after a plain `linear`).
Launched with PDL on Hopper (`pdl`). Numerics: silu rounds where the torch path rounds; RoPE is
computed in float32 (bf16 rounding, not bit for bit). tests/unit/engine/kernels/test_fused_decode.py checks
each kernel against torch (on the CPU through Triton's interpreter, TRITON_INTERPRET=1). Import
this module only where Triton is installed.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from specdraft.engine.kernels.norm_rope_ops import KVWrite
from specdraft.engine.kernels.pdl import pdl_launch, pdl_wait

THIN_GEMM_ROWS = 64  # rows a `linear` call takes (a thin GEMM pads them to 16, 32 or 64)


# what a linear kernel does with its outputs (EPILOGUE; constexpr: kernels read them as globals)
PLAIN, SILU_MUL, ROPE = tl.constexpr(0), tl.constexpr(1), tl.constexpr(2)


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
def _linear_kernel(
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
    """BLOCK_N outputs n of the M rows m of x: y_a, y_b the float32 sums of weight rows a(n) and
    a(n) + HALF (unless PLAIN), then the epilogue. BLOCK_M 1: a GEMV of one token, products summed
    in registers, the next K block's weights loaded while this one is summed; with PDL the first
    block is requested before waiting for the kernel that wrote x. Else a thin GEMM of all
    M <= BLOCK_M rows: tensor-core dots over BLOCK_M (16, 32 or 64) padded rows, after the wait.

    Epilogue. PLAIN: y[m, n] = y_a (+ bias[n]). SILU_MUL: y[m, n] = silu(gate) * up, gate = y_a,
    up = y_b, rounded as F.silu then *. ROPE (fused q|k|v projection, HALF = head_dim / 2): pair n
    is element j = n % HALF of head n // HALF and its partner j + HALF; q heads are rotated into
    y [M, nq, D], k heads rotated and v heads as they are written into the caches at slot
    slot[m] (slots [B, T]: each row's own) of batch row m // T. Values are rounded to the weights' dtype first, as the
    unfused path rounds the projection's output before RoPE.
    """
    if BLOCK_M != 1:
        pdl_wait(USE_PDL)
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = n < N
    rows = n // HALF * (2 * HALF) + n % HALF if EPILOGUE != PLAIN else n
    ks = tl.arange(0, BLOCK_K)
    if BLOCK_M == 1:
        acc_a = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
        acc_b = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
        w_a, w_b = _load_rows(w_ptr, rows, HALF, K, 0, n_mask, ks, EPILOGUE != PLAIN, BLOCK_K)
        pdl_wait(USE_PDL)
        for kb in range(K_BLOCKS):
            offs_k = kb * BLOCK_K + ks
            x = tl.load(x_ptr + offs_k, mask=offs_k < K, other=0.0).to(tl.float32)[None, :]
            acc_a += w_a.to(tl.float32) * x
            if EPILOGUE != PLAIN:
                acc_b += w_b.to(tl.float32) * x
            w_a, w_b = _load_rows(
                w_ptr, rows, HALF, K, kb + 1, n_mask, ks, EPILOGUE != PLAIN, BLOCK_K
            )
        y_a, y_b, m, mask = tl.sum(acc_a, axis=1), tl.sum(acc_b, axis=1), 0, n_mask
    else:
        offs_m = tl.arange(0, BLOCK_M)
        m_mask = offs_m < M
        y_a = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
        y_b = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
        for kb in range(K_BLOCKS):
            offs_k = kb * BLOCK_K + ks
            w_a, w_b = _load_rows(w_ptr, rows, HALF, K, kb, n_mask, ks, EPILOGUE != PLAIN, BLOCK_K)
            x = tl.load(
                x_ptr + offs_m[:, None] * K + offs_k[None, :],
                mask=m_mask[:, None] & (offs_k < K)[None, :],
                other=0.0,
            )
            y_a = tl.dot(w_a, tl.trans(x), y_a)
            if EPILOGUE != PLAIN:
                y_b = tl.dot(w_b, tl.trans(x), y_b)
        n, m, mask = n[:, None], offs_m[None, :], n_mask[:, None] & m_mask[None, :]
    # the epilogue: outputs n of rows m (broadcast together)
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
        slot = tl.load(slot_ptr + m, mask=m_mask, other=0)
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
    write: KVWrite | None = None,
) -> None:
    """Launch the GEMV (one row of x) or thin GEMM (2-64 rows) for `num_out` outputs per row;
    `write`: the ROPE epilogue's (None for the others)."""
    m, k = x.shape
    if m > THIN_GEMM_ROWS:
        raise ValueError(f"triton linear: {m} rows, at most {THIN_GEMM_ROWS}")
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
    _linear_kernel[(triton.cdiv(num_out, block_n),)](
        x,
        weight,
        bias,
        y,
        m,
        num_out,
        k,
        half,
        *_rope_arguments(write),
        BLOCK_M=1 if m == 1 else max(16, triton.next_power_of_2(m)),
        **common,
    )


def _rope_arguments(write: KVWrite | None) -> tuple:
    """The kernel's arguments T .. cache_len for the ROPE epilogue's `write` (placeholders the
    other epilogues do not read for None)."""
    if write is None:
        return (1, None, None, None, None, None, 0, 0, 0)
    pos, k_cache = write.position_ids, write.k_cache
    kv = (k_cache, write.v_cache, write.num_heads, k_cache.shape[1], k_cache.shape[2])
    return (pos.shape[1], pos, write.cache_slots, write.inv_freq, *kv)


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


def qkv_rope_to_cache(x: Tensor, wqkv: Tensor, bias: Tensor | None, write: KVWrite) -> Tensor:
    """The fused q|k|v projection with RoPE and the cache writes in its epilogue: what
    `rope_to_cache(linear(x, wqkv, bias), write)` does without q-/k-norm, in one kernel.

    x [B*T, K] (M <= 64 rows); wqkv [(nq + 2 n_kv) * D, K], bias the same rows or None; write as
    `rope_to_cache`'s. Returns q [B*T, nq, D] in x's dtype.
    """
    x = x.contiguous()
    head_dim = write.k_cache.shape[3]
    q = torch.empty(x.shape[0], write.num_heads, head_dim, device=x.device, dtype=x.dtype)
    _launch_linear(x, wqkv, bias, q, wqkv.shape[0] // 2, head_dim // 2, ROPE, write)
    return q
