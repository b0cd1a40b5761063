"""FastTarget's forward for a few new tokens (decode, verify) through the Triton kernels.

A layer is eight launches: add_rms_norm -> qkv matmul with RoPE and the K/V cache writes in its
epilogue -> attention (split, then combine) -> o matmul -> add_rms_norm -> gate|up matmul with
silu(gate) * up in its epilogue -> down matmul, the residual add of each sub-block fused into
the norm after it (q-/k-norm targets, Qwen3: RoPE is a launch of its own, after the qkv
matmul). On Hopper the launches overlap (programmatic dependent launch): each matmul requests
its first weights, attention its first block of cached K / V, while the kernel before it
finishes. The torch path's compiled layer launches about twice as many kernels, one after
another. `FastTarget.forward` takes this path for at most `MAX_TOKENS` tokens once
`FastTarget.use_triton()` has succeeded; tests/test_triton_ops.py compares it with the torch
path.
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:
    from specdraft.engine.fast_model import FastOutput, FastTarget, TransformerBlock

MAX_TOKENS = 16  # new tokens per forward on this path (verify: num_draft_tokens <= 16)
MAX_QUERY_ROWS = 128  # query heads per kv head x tokens one attention program holds


def unsupported_reason(model: FastTarget) -> str | None:
    """Why the Triton path cannot run `model`, or None when it can (see `kernel_support`)."""
    args = model.args
    return kernel_support(model.output.weight, args.head_dim, args.num_heads, args.num_kv_heads)


def kernel_support(weight: Tensor, head_dim: int, num_heads: int, num_kv_heads: int) -> str | None:
    """Why the Triton kernels cannot run a model with this weight (device, dtype) and attention
    shape, or None when they can: CUDA, bf16 / fp16 weights, Triton installed, head_dim a power
    of two >= 16, at most 8 query heads per kv head (16 tokens of a group in one program)."""
    group = num_heads // num_kv_heads
    if weight.device.type != "cuda":
        return f"weights on {weight.device.type}, not CUDA"
    if weight.dtype not in (torch.bfloat16, torch.float16):
        return f"dtype {weight.dtype} (bf16 / fp16 only)"
    if importlib.util.find_spec("triton") is None:
        return "Triton is not installed"
    if head_dim < 16 or head_dim & (head_dim - 1):
        return f"head_dim {head_dim} (a power of two >= 16 only)"
    if group * MAX_TOKENS > MAX_QUERY_ROWS:
        return f"{group} query heads per kv head (at most {MAX_QUERY_ROWS // MAX_TOKENS})"
    return None


def forward(model: FastTarget, input_ids: Tensor, position_ids: Tensor, cache_slots: Tensor,
            attn_mask: Tensor, aux_layers: tuple[int, ...]) -> FastOutput:
    """Same arguments and result as `FastTarget.forward`, for B * T <= MAX_TOKENS tokens."""
    from specdraft.engine.fast_model import FastOutput
    from specdraft.engine.triton_ops import add_rms_norm, linear

    bsz, seqlen = input_ids.shape
    x = model.tok_embeddings(input_ids).view(bsz * seqlen, -1)
    delta, streams = None, {}
    for k, layer in enumerate(model.layers):
        x, normed = add_rms_norm(x, delta, layer.attention_norm.weight, layer.attention_norm.eps)
        streams[k] = x  # the residual stream after layer k (0: the embeddings)
        x, delta = block_forward(layer, x, normed, position_ids, cache_slots, attn_mask, model.inv_freq)
    x, normed = add_rms_norm(x, delta, model.norm.weight, model.norm.eps)
    streams[model.args.num_layers] = x
    logits = linear(normed, model.output.weight, out_dtype=torch.float32)
    aux_hidden = torch.cat([streams[k] for k in aux_layers], dim=-1) if aux_layers else None
    return FastOutput(logits=logits.view(bsz, seqlen, -1),
                      aux_hidden=None if aux_hidden is None else aux_hidden.view(bsz, seqlen, -1))


def block_forward(layer: TransformerBlock, x: Tensor, normed: Tensor, position_ids: Tensor,
                  cache_slots: Tensor, attn_mask: Tensor, inv_freq: Tensor) -> tuple[Tensor, Tensor]:
    """One decoder layer: x [B*T, H] the residual stream, normed = attention_norm(x). Writes the
    layer's K/V at cache_slots and returns (h, d), the layer's output being h + d (the caller
    fuses that add into the next norm)."""
    from specdraft.engine.triton_ops import (add_rms_norm, attention, linear, linear_silu_mul, qkv_rope_to_cache,
                                             rope_to_cache)

    attn, ffn, cache = layer.attention, layer.feed_forward, layer.attention.kv_cache
    if attn.q_norm is None and cache.k_cache.dtype == normed.dtype:
        q = qkv_rope_to_cache(normed, attn.wqkv.weight, attn.wqkv.bias, position_ids, cache_slots, inv_freq,
                              cache.k_cache, cache.v_cache, attn.num_heads)
    else:  # q-/k-norm reduce over whole heads before RoPE: a kernel of its own
        qk_norms = (attn.q_norm.weight, attn.k_norm.weight, attn.q_norm.eps) if attn.q_norm is not None else ()
        q = rope_to_cache(linear(normed, attn.wqkv.weight, attn.wqkv.bias), position_ids, cache_slots, inv_freq,
                          cache.k_cache, cache.v_cache, attn.num_heads, *qk_norms)
    y = attention(q, cache.k_cache, cache.v_cache, attn_mask, cache_slots)
    h, normed = add_rms_norm(x, linear(y.view(x.shape[0], -1), attn.wo.weight, attn.wo.bias),
                             layer.ffn_norm.weight, layer.ffn_norm.eps)
    return h, linear(linear_silu_mul(normed, ffn.w13.weight), ffn.w2.weight)
