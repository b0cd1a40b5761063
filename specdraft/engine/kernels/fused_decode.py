"""A target forward for a few new tokens (decode, verify) through the Triton kernels.

A layer is eight launches: add_rms_norm -> qkv matmul with RoPE and the K/V cache writes in its
epilogue -> attention (split, then combine) -> o matmul -> add_rms_norm -> gate|up matmul with
silu(gate) * up in its epilogue -> down matmul, the residual add of each sub-block fused into
the norm after it (q-/k-norm targets, Qwen3: RoPE is a launch of its own, after the qkv
matmul). On Hopper the launches overlap (programmatic dependent launch): each matmul requests
its first weights, attention its first block of cached K / V, while the kernel before it
finishes. The forward takes the layers' tensors (`LayerWeights`) and caches, not a model:
`FastTarget.forward` (engine/fast_model.py) calls it for at most `MAX_TOKENS` tokens once
`FastTarget.use_triton()` has succeeded; tests/unit/engine/kernels/test_fused_decode.py compares it with the torch
path.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

MAX_TOKENS = 64  # new tokens per forward on this path (verify: num_draft_tokens <= 64)


@dataclass(frozen=True)
class LayerWeights:
    """One decoder layer's tensors as the kernels read them: norms [H] with their eps; wqkv
    [(n_heads + 2 n_kv) * D, H] (rows q|k|v) and its bias or None; q_norm / k_norm [D] (Qwen3)
    or None; wo [H, n_heads * D] and its bias or None; w13 [2I, H] (rows gate|up); w2 [H, I];
    k_cache / v_cache [1, n_kv, S, D], written at the forward's cache slots."""

    attention_norm: Tensor
    attention_norm_eps: float
    wqkv: Tensor
    wqkv_bias: Tensor | None
    q_norm: Tensor | None
    k_norm: Tensor | None
    qk_norm_eps: float
    wo: Tensor
    wo_bias: Tensor | None
    ffn_norm: Tensor
    ffn_norm_eps: float
    w13: Tensor
    w2: Tensor
    k_cache: Tensor
    v_cache: Tensor
    num_heads: int


def kernel_support(weight: Tensor, head_dim: int) -> str | None:
    """Why the Triton kernels cannot run a model with this weight (device, dtype) and head
    size, or None when they can: CUDA, bf16 / fp16 weights, Triton installed, head_dim a power
    of two >= 16."""
    if weight.device.type != "cuda":
        return f"weights on {weight.device.type}, not CUDA"
    if weight.dtype not in (torch.bfloat16, torch.float16):
        return f"dtype {weight.dtype} (bf16 / fp16 only)"
    if importlib.util.find_spec("triton") is None:
        return "Triton is not installed"
    if head_dim < 16 or head_dim & (head_dim - 1):
        return f"head_dim {head_dim} (a power of two >= 16 only)"
    return None


def forward(
    x: Tensor,
    layers: Sequence[LayerWeights],
    norm: Tensor,
    norm_eps: float,
    output: Tensor,
    position_ids: Tensor,
    cache_slots: Tensor,
    attn_mask: Tensor,
    inv_freq: Tensor,
    aux_layers: tuple[int, ...],
) -> tuple[Tensor, Tensor | None]:
    """The forward of N = B * T <= MAX_TOKENS embedded tokens x [N, H] (position_ids [B, T],
    cache_slots [T] long shared by the batch or [B, T] each row's own, in cache rows 0..B-1,
    attn_mask [B, 1, T, S] bool, inv_freq [D/2] float32, as
    `FastTarget.forward` takes them): logits [N, V] float32 and the residual streams after
    `aux_layers` (specdraft indices) concatenated, [N, len(aux_layers) * H], or None."""
    from specdraft.engine.kernels.linear_ops import linear
    from specdraft.engine.kernels.norm_rope_ops import add_rms_norm, row_slots

    cache_slots = row_slots(cache_slots, position_ids.shape[0])
    delta, streams = None, {}
    for k, layer in enumerate(layers):
        x, normed = add_rms_norm(x, delta, layer.attention_norm, layer.attention_norm_eps)
        streams[k] = x  # the residual stream after layer k (0: the embeddings)
        x, delta = block_forward(layer, x, normed, position_ids, cache_slots, attn_mask, inv_freq)
    x, normed = add_rms_norm(x, delta, norm, norm_eps)
    streams[len(layers)] = x
    logits = linear(normed, output, out_dtype=torch.float32)
    aux_hidden = torch.cat([streams[k] for k in aux_layers], dim=-1) if aux_layers else None
    return logits, aux_hidden


def block_forward(
    layer: LayerWeights,
    x: Tensor,
    normed: Tensor,
    position_ids: Tensor,
    cache_slots: Tensor,
    attn_mask: Tensor,
    inv_freq: Tensor,
) -> tuple[Tensor, Tensor]:
    """One decoder layer: x [B*T, H] the residual stream, normed = attention_norm(x). Writes the
    layer's K/V at cache_slots [B, T] and returns (h, d), the layer's output being h + d (the caller
    fuses that add into the next norm)."""
    from specdraft.engine.kernels.attention_ops import attention
    from specdraft.engine.kernels.linear_ops import linear, linear_silu_mul, qkv_rope_to_cache
    from specdraft.engine.kernels.norm_rope_ops import KVWrite, add_rms_norm, rope_to_cache

    write = KVWrite(
        position_ids, cache_slots, inv_freq, layer.k_cache, layer.v_cache, layer.num_heads
    )
    if layer.q_norm is None and layer.k_cache.dtype == normed.dtype:
        q = qkv_rope_to_cache(normed, layer.wqkv, layer.wqkv_bias, write)
    else:  # q-/k-norm reduce over whole heads before RoPE: a kernel of its own
        qk_norms = (
            (layer.q_norm, layer.k_norm, layer.qk_norm_eps) if layer.q_norm is not None else ()
        )
        q = rope_to_cache(linear(normed, layer.wqkv, layer.wqkv_bias), write, *qk_norms)
    y = attention(q, layer.k_cache, layer.v_cache, attn_mask, cache_slots)
    h, normed = add_rms_norm(
        x,
        linear(y.view(x.shape[0], -1), layer.wo, layer.wo_bias),
        layer.ffn_norm,
        layer.ffn_norm_eps,
    )
    return h, linear(linear_silu_mul(normed, layer.w13), layer.w2)
