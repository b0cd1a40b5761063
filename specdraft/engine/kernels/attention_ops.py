"""Split-KV ("flash decoding") attention of a few new tokens over the static cache, in Triton.

`attention`: the new tokens' query heads over the cache under a bool mask, skipping blocks the
mask hides; a second kernel combines the splits by their log-sum-exp. With PDL (`pdl`, Hopper)
it reads blocks of cached K / V before the kernel that writes the new slots finishes. Computed in
float32 without intermediate rounding (bf16 rounding of the torch path, not bit for bit);
tests/unit/engine/kernels/test_fused_decode.py checks it against torch. Import this module only where
Triton is installed.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from torch import Tensor

from specdraft.engine.kernels.pdl import pdl_launch, pdl_wait

BLOCK_SLOTS = 64  # cache slots per inner attention step
MIN_ATTENTION_PROGRAMS = 264  # two waves on a 132-SM H100 / H200: the cache is read in parallel
ATTENTION_ROWS = (
    64  # query rows (tokens x query heads of one kv head) an attention program holds at most
)


@triton.jit
def _load_block(mask_at, k_at, v_at, r_mask, s, num_slots, d, HEAD_DIM: tl.constexpr):
    """Slots s [S] of one kv head: (visible [R, S], the mask at its rows' pointers mask_at [R],
    k, v [S, D] from that head's caches at k_at, v_at); K and V are read only at slots some row
    sees (0 elsewhere)."""
    s_mask = s < num_slots
    visible = (
        tl.load(mask_at[:, None] + s[None, :], mask=r_mask[:, None] & s_mask[None, :], other=0) != 0
    )
    read = (s_mask & (tl.max(visible.to(tl.int32), axis=0) > 0))[:, None]
    kv_offsets = s[:, None] * HEAD_DIM + d[None, :]
    k = tl.load(k_at + kv_offsets, mask=read, other=0.0)
    v = tl.load(v_at + kv_offsets, mask=read, other=0.0)  # in flight with k
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
    one wrote only this forward's slots (slot_ptr [B, T]: row b's), so a block holding none of them is
    final; a block holding one is read again after the wait."""
    bh, split = tl.program_id(0), tl.program_id(1)
    b, kv_head = bh // num_kv_heads, bh % num_kv_heads
    r = tl.program_id(2) * BLOCK_R + tl.arange(0, BLOCK_R)
    t, g = r // GROUP, r % GROUP
    r_mask = t < T
    d = tl.arange(0, HEAD_DIM)
    kv_base = (b * num_kv_heads + kv_head) * cache_len * HEAD_DIM
    k_at, v_at = k_cache_ptr + kv_base, v_cache_ptr + kv_base
    mask_at = mask_ptr + b * mask_b_stride + t * mask_t_stride
    start = split * SPLIT
    s = start + tl.arange(0, BLOCK_S)
    visible, k, v = _load_block(mask_at, k_at, v_at, r_mask, s, num_slots, d, HEAD_DIM)
    if USE_PDL:
        new = tl.load(
            slot_ptr + b * T + tl.arange(0, BLOCK_T), mask=tl.arange(0, BLOCK_T) < T, other=-1
        )
        written = tl.max(((new >= start) & (new < start + BLOCK_S)).to(tl.int32), axis=0) > 0
        pdl_wait(USE_PDL)
        if written:
            visible, k, v = _load_block(mask_at, k_at, v_at, r_mask, s, num_slots, d, HEAD_DIM)
    q_rows = (b * T + t) * (num_kv_heads * GROUP) + kv_head * GROUP + g
    q = tl.load(q_ptr + q_rows[:, None] * HEAD_DIM + d[None, :], mask=r_mask[:, None], other=0.0)
    m_i = tl.full((BLOCK_R,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_R,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_R, HEAD_DIM), dtype=tl.float32)
    m_i, l_i, acc = _attend_block(q, k, v, visible, m_i, l_i, acc, scale)
    for block in range(1, SPLIT // BLOCK_S):
        s = start + block * BLOCK_S + tl.arange(0, BLOCK_S)
        visible, k, v = _load_block(mask_at, k_at, v_at, r_mask, s, num_slots, d, HEAD_DIM)
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
    pdl_wait(USE_PDL)
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
    cache_slots [B, T] long contiguous (`norm_rope_ops.row_slots`): the slots of each row whose
    K / V the kernel launched just before this one wrote
    (`qkv_rope_to_cache`, `rope_to_cache`). With PDL, blocks of other slots are read while that
    kernel finishes: a slot written earlier and not named here would be read stale.
    Returns [B*T, nq, D] in q's dtype. D: a power of two >= 16. The T * GROUP query rows of a
    kv head are split into tiles of at most ATTENTION_ROWS, one program each.
    """
    batch, _, t, num_slots = attn_mask.shape
    num_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads, cache_len = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // num_kv_heads
    block_r, tiles, blocks_per_split, num_splits = _attention_tiling(
        batch * num_kv_heads, group * t, num_slots
    )
    parts, lse = _split_outputs((batch * num_kv_heads, num_splits, tiles * block_r), head_dim, q)
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
    return _combine_splits(parts, lse, q, t, num_kv_heads, group)


def _attention_tiling(num_kv_rows: int, num_rows: int, num_slots: int) -> tuple[int, int, int, int]:
    """How `attention` splits its work for num_kv_rows = B * n_kv kv heads, num_rows = T * GROUP
    query rows per kv head and num_slots cache slots: (BLOCK_R rows per tile, tiles, slot blocks
    per split, splits); enough splits that MIN_ATTENTION_PROGRAMS programs read the cache."""
    block_r = max(16, min(ATTENTION_ROWS, triton.next_power_of_2(num_rows)))
    tiles = triton.cdiv(num_rows, block_r)
    blocks = triton.cdiv(num_slots, BLOCK_SLOTS)
    blocks_per_split = max(1, blocks // triton.cdiv(MIN_ATTENTION_PROGRAMS, num_kv_rows))
    return block_r, tiles, blocks_per_split, triton.cdiv(blocks, blocks_per_split)


def _split_outputs(rows: tuple[int, int, int], head_dim: int, q: Tensor) -> tuple[Tensor, Tensor]:
    """The splits' outputs [*rows, head_dim] and log-sum-exps [*rows] (rows = kv heads, splits,
    query rows per split), float32 on q's device."""
    parts = torch.empty(*rows, head_dim, device=q.device, dtype=torch.float32)
    return parts, torch.empty(*rows, device=q.device, dtype=torch.float32)


def _combine_splits(
    parts: Tensor, lse: Tensor, q: Tensor, t: int, num_kv_heads: int, group: int
) -> Tensor:
    """`attention`'s output [B*T, nq, D] in q's dtype from the splits' outputs parts [B*n_kv,
    splits, rows, D] and their log-sum-exps lse [B*n_kv, splits, rows], float32."""
    num_splits, rows = parts.shape[1], parts.shape[2]
    out = torch.empty_like(q)
    _attention_combine_kernel[(parts.shape[0], group * t)](
        parts,
        lse,
        out,
        t,
        num_kv_heads,
        num_splits,
        rows,
        GROUP=group,
        HEAD_DIM=q.shape[2],
        SPLITS=triton.next_power_of_2(num_splits),
        **pdl_launch(q.device),
    )
    return out
