"""The target on the engine's hot path: a compact Llama / Qwen2 / Qwen3 / Mistral (gpt-fast style).

Reads top to bottom: config, static KV cache, transformer, block, attention, MLP, norm, rope,
masks; a checkpoint directory loads into it with `fast_load.load_fast_target`. Computes what
transformers' `LlamaForCausalLM` (and the Qwen2/Qwen3/Mistral classes) compute, on the same
checkpoint directory; tests/unit/engine/test_fast_model.py holds the parity checks.

Cache protocol. Each layer owns a preallocated K/V cache [B, n_kv, max_seq_len, head_dim]. A
forward writes the K/V of its T new tokens at `cache_slots` and attends wherever `attn_mask`
says, over the slots its width covers. The cache keeps no length: the caller owns it. RoPE
positions and cache slots are separate because a verified draft tree has depth-based positions
(siblings share one) while its nodes sit in sequential slots. K is stored after RoPE, at the
node's position. After verification, `compact_cache(accepted_slots, dst_start=prefix_len)`
moves the accepted path to contiguous slots; on that path position = prefix_len + depth = its
final slot, so moved entries stay valid. Rejected nodes need no undo: the caller sets its
length pointer back, the mask hides slots at or past it, and the next forward overwrites them.

Fused projections. q/k/v run as one matmul (`wqkv`) and gate/up as another (`w13`): the
checkpoint's separate tensors fill row blocks of them at load (`fast_load.HF_TO_FAST_LAYER`): 4
matmuls per layer instead of 7, so fewer kernel launches, and on the CPU less per-call overhead.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from specdraft.draft import RMSNorm, apply_rope
from specdraft.engine.errors import EngineError
from specdraft.engine.fast_config import ModelArgs, check_cache_length, rope_inv_freq
from specdraft.engine.kernels import fused_decode


@dataclass(frozen=True)
class FastOutput:
    """logits [B, T, V] float32; aux_hidden [B, T, len(aux_layers)*H] in the model dtype, in the
    order the layers were asked for, or None when none were."""

    logits: Tensor
    aux_hidden: Tensor | None


class StepInputs(NamedTuple):
    """The tensors of one target forward (`step_forward` gives their shapes)."""

    input_ids: Tensor
    position_ids: Tensor
    cache_slots: Tensor
    attn_mask: Tensor


def step_forward(run: Callable[..., FastOutput]) -> Callable[..., FastOutput]:
    """The forward every engine target takes (`FastTarget.forward`, `graphs.GraphedTarget`,
    `hf_target.HFTarget`), over the target's own `run(self, step, aux_layers)`, which gets the
    four tensors as one `StepInputs`."""

    def forward(
        self: Any,
        input_ids: Tensor,
        position_ids: Tensor,
        cache_slots: Tensor,
        attn_mask: Tensor,
        aux_layers: tuple[int, ...] = (),
    ) -> FastOutput:
        return run(self, StepInputs(input_ids, position_ids, cache_slots, attn_mask), aux_layers)

    forward.__doc__ = f"""Run T new tokens per row against the cache.

        input_ids [B, T] long; position_ids [B, T] long (RoPE positions); cache_slots [T] long
        (where each token's K/V is written, shared by the batch) or [B, T] (each row's own, in
        cache rows 0..B-1); attn_mask [B, 1, T, S] bool
        over cache slots 0..S-1 (True = attend; every row must attend somewhere, e.g. to itself,
        so every slot written is < S <= max_seq_len; S = max_seq_len keeps shapes static for
        graphs, the slots in use only are cheaper eagerly);
        aux_layers: specdraft indices (0 = embeddings, k = output of layer k, L = last layer
        before the final norm). Returns logits [B, T, V] float32 and the aux states [B, T,
        len(aux_layers)*H] (None without aux layers).

        {run.__doc__}"""
    return forward


class KVCache(nn.Module):
    """One layer's static K/V cache: k_cache, v_cache [max_batch_size, n_kv, max_seq_len, head_dim],
    views of the model's stacked cache (`FastTarget.kv_stack`), so that one op moves every layer's."""

    def __init__(self, k_cache: Tensor, v_cache: Tensor) -> None:
        super().__init__()
        self.register_buffer("k_cache", k_cache, persistent=False)
        self.register_buffer("v_cache", v_cache, persistent=False)

    def update(
        self, cache_slots: Tensor, k: Tensor, v: Tensor, num_slots: int
    ) -> tuple[Tensor, Tensor]:
        """Write k, v [B, n_kv, T, D] at cache_slots [T] (each < num_slots), or per row at
        cache_slots [B, T] (a batch of sequences of their own lengths, `batch_target`); return
        this batch's caches over slots 0..num_slots-1, [B, n_kv, num_slots, D] (cache rows 0..B-1)."""
        k_out, v_out = (
            self.k_cache[: k.shape[0], :, :num_slots],
            self.v_cache[: k.shape[0], :, :num_slots],
        )
        if cache_slots.dim() == 2:  # rows' own slots: [B, T] -> [B, n_kv, T, D] indices
            index = cache_slots[:, None, :, None].expand_as(k)
            return k_out.scatter_(2, index, k), v_out.scatter_(2, index, v)
        k_out.index_copy_(2, cache_slots, k)
        v_out.index_copy_(2, cache_slots, v)
        return k_out, v_out


class FastTarget(nn.Module):
    """Llama-family decoder with static KV caches; see the module docstring for the cache protocol.

    Call `setup_cache` before `forward`. Load weights with `fast_load.load_fast_target`.
    """

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.args = args
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.hidden_size)
        self.layers = nn.ModuleList(TransformerBlock(args) for _ in range(args.num_layers))
        self.norm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.output = nn.Linear(args.hidden_size, args.vocab_size, bias=False)
        self.tie_weights()
        self.register_buffer(
            "inv_freq", None, persistent=False
        )  # float32 [head_dim/2], setup_cache
        # every layer's K and V, [num_layers, 2, max_batch_size, n_kv, max_seq_len, head_dim] (setup_cache)
        self.register_buffer("kv_stack", None, persistent=False)
        self.max_batch_size = 0
        self.max_seq_len = 0
        self.triton_kernels = False

    def use_triton(self) -> str | None:
        """Run forwards of at most `fused_decode.MAX_TOKENS` tokens (decode, verify) through the
        Triton kernels (`triton_forward`) from now on. Returns None when switched on, else the
        reason it cannot be (`triton_support`)."""
        reason = self.triton_support()
        self.triton_kernels = reason is None
        return reason

    def triton_support(self) -> str | None:
        """Why the Triton kernels cannot run this model (e.g. not on CUDA), or None when they can
        (`fused_decode.kernel_support`)."""
        return fused_decode.kernel_support(self.output.weight, self.args.head_dim)

    def tie_weights(self) -> None:
        """Share the embedding with the head when the config ties them (no-op otherwise)."""
        if self.args.tie_word_embeddings:
            self.output.weight = self.tok_embeddings.weight

    def setup_cache(
        self,
        max_batch_size: int,
        max_seq_len: int,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        """(Re)allocate zeroed KV caches [max_batch_size, n_kv, max_seq_len, head_dim] per layer,
        as views of one stacked tensor (`kv_stack`).

        dtype/device default to the weights' (call it after moving the model; the float32 RoPE
        frequencies are built here too). Raises ValueError when max_seq_len exceeds the model's
        max positions, or a sliding window is shorter (full attention only).
        """
        args, weight = self.args, self.output.weight
        if args.sliding_window is not None and args.sliding_window < max_seq_len:
            raise EngineError(
                f"{args.model_type} target: sliding window {args.sliding_window} < "
                f"max_seq_len {max_seq_len}; specdraft's engine implements full attention "
                f"only: use max_seq_len <= {args.sliding_window}"
            )
        check_cache_length(max_seq_len, args.max_position_embeddings)
        dtype, device = dtype or weight.dtype, device or weight.device
        self.kv_stack = torch.zeros(
            args.num_layers,
            2,
            max_batch_size,
            args.num_kv_heads,
            max_seq_len,
            args.head_dim,
            dtype=dtype,
            device=device,
        )
        for layer, (k, v) in zip(self.layers, self.kv_stack):
            layer.attention.kv_cache = KVCache(k, v)
        self.inv_freq = rope_inv_freq(args).to(device)
        self.max_batch_size, self.max_seq_len = max_batch_size, max_seq_len

    @step_forward
    def forward(self, step: StepInputs, aux_layers: tuple[int, ...] = ()) -> FastOutput:
        """FastTarget: shapes are static per (B, T), so the step can be compiled.
        Raises RuntimeError before `setup_cache`, ValueError for aux_layers outside 0..L."""
        input_ids, position_ids, cache_slots, attn_mask = step
        if self.inv_freq is None:
            raise RuntimeError("FastTarget.forward before setup_cache(max_batch_size, max_seq_len)")
        if any(not 0 <= k <= self.args.num_layers for k in aux_layers):
            raise EngineError(
                f"aux_layers {list(aux_layers)}: each must be in 0..{self.args.num_layers}"
            )
        if self.triton_kernels and input_ids.numel() <= fused_decode.MAX_TOKENS:
            return self.triton_forward(step, aux_layers)
        x = self.tok_embeddings(input_ids)
        cos, sin = rope_cos_sin(self.inv_freq, position_ids, x.dtype)
        # SDPA turns a bool mask into an additive one in every layer: once per forward here
        bias = torch.zeros_like(attn_mask, dtype=x.dtype).masked_fill_(~attn_mask, float("-inf"))
        streams = {0: x}
        for k, layer in enumerate(self.layers, start=1):
            x = layer(x, cos, sin, cache_slots, bias)
            if k in aux_layers:
                streams[k] = x
        logits = self.output(self.norm(x)).float()
        aux_hidden = torch.cat([streams[k] for k in aux_layers], dim=-1) if aux_layers else None
        return FastOutput(logits=logits, aux_hidden=aux_hidden)

    def triton_forward(self, step: StepInputs, aux_layers: tuple[int, ...] = ()) -> FastOutput:
        """`forward` through the Triton kernels (`fused_decode.forward`), for B * T <= MAX_TOKENS."""
        input_ids, position_ids, cache_slots, attn_mask = step
        bsz, seqlen = input_ids.shape
        logits, aux = fused_decode.forward(
            self.tok_embeddings(input_ids).view(bsz * seqlen, -1),
            [layer.kernel_weights() for layer in self.layers],
            self.norm.weight,
            self.norm.eps,
            self.output.weight,
            position_ids,
            cache_slots,
            attn_mask,
            self.inv_freq,
            aux_layers,
        )
        return FastOutput(
            logits=logits.view(bsz, seqlen, -1),
            aux_hidden=None if aux is None else aux.view(bsz, seqlen, -1),
        )

    @torch.no_grad()
    def compact_cache(self, src_slots: Tensor, dst_start: int) -> None:
        """Move the K/V at src_slots [n] long, on the cache's device (e.g. a verified tree's
        accepted path, in order), to slots dst_start..dst_start+n-1 in every layer and batch row:
        one gather and one copy over the stacked cache, whatever the number of layers
        (overlap-safe: gathered first).

        Raises RuntimeError before `setup_cache`, ValueError when the destination runs past
        max_seq_len."""
        if self.kv_stack is None:
            raise RuntimeError("FastTarget.compact_cache before setup_cache")
        if dst_start + src_slots.numel() > self.max_seq_len:
            raise ValueError(
                f"compact_cache: slots {dst_start}..{dst_start + src_slots.numel() - 1} "
                f"exceed max_seq_len {self.max_seq_len}"
            )
        stack = self.kv_stack
        stack[:, :, :, :, dst_start : dst_start + src_slots.numel()] = stack.index_select(
            4, src_slots
        )

    @torch.no_grad()
    def copy_slots(self, src_row: int, src_slots: Tensor, dst_row: int, dst_start: int) -> None:
        """Copy the K/V of cache row src_row at src_slots [n] long (on the cache's device) to row
        dst_row, slots dst_start..dst_start+n-1, in every layer (gathered first: overlap-safe).
        A batch's per-row `compact_cache`, and its move of a sequence to another row."""
        stack, n = self.kv_stack, src_slots.numel()
        stack[:, :, dst_row, :, dst_start : dst_start + n] = stack[:, :, src_row].index_select(
            3, src_slots
        )


class TransformerBlock(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.attention = Attention(args)
        self.feed_forward = FeedForward(args)
        self.attention_norm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.ffn_norm = RMSNorm(args.hidden_size, args.rms_norm_eps)

    def kernel_weights(self) -> fused_decode.LayerWeights:
        """This layer's tensors and cache as the Triton forward reads them (after `setup_cache`)."""
        attn, ffn, cache = self.attention, self.feed_forward, self.attention.kv_cache
        qk = (
            (attn.q_norm.weight, attn.k_norm.weight, attn.q_norm.eps)
            if attn.q_norm is not None
            else (None, None, 0.0)
        )
        return fused_decode.LayerWeights(
            self.attention_norm.weight,
            self.attention_norm.eps,
            attn.wqkv.weight,
            attn.wqkv.bias,
            *qk,
            attn.wo.weight,
            attn.wo.bias,
            self.ffn_norm.weight,
            self.ffn_norm.eps,
            ffn.w13.weight,
            ffn.w2.weight,
            cache.k_cache,
            cache.v_cache,
            attn.num_heads,
        )

    def forward(
        self, x: Tensor, cos: Tensor, sin: Tensor, cache_slots: Tensor, attn_mask: Tensor
    ) -> Tensor:
        h = x + self.attention(self.attention_norm(x), cos, sin, cache_slots, attn_mask)
        return h + self.feed_forward(self.ffn_norm(h))


class Attention(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = (
            args.num_heads,
            args.num_kv_heads,
            args.head_dim,
        )
        q, kv = args.num_heads * args.head_dim, args.num_kv_heads * args.head_dim
        self.wqkv = FusedLinear(
            args.hidden_size, (q, kv, kv), bias=args.qkv_bias
        )  # q_proj|k_proj|v_proj
        self.wo = nn.Linear(args.num_heads * args.head_dim, args.hidden_size, bias=args.o_bias)
        self.q_norm = RMSNorm(args.head_dim, args.rms_norm_eps) if args.qk_norm else None
        self.k_norm = RMSNorm(args.head_dim, args.rms_norm_eps) if args.qk_norm else None
        self.kv_cache: KVCache | None = None

    def forward(
        self, x: Tensor, cos: Tensor, sin: Tensor, cache_slots: Tensor, attn_mask: Tensor
    ) -> Tensor:
        bsz, seqlen, _ = x.shape
        qkv = (
            self.wqkv(x).view(bsz, seqlen, -1, self.head_dim).transpose(1, 2)
        )  # [B, q+k+v heads, T, D]
        qk, v = qkv.split([self.num_heads + self.num_kv_heads, self.num_kv_heads], dim=1)
        if self.q_norm is not None:  # Qwen3: per-head RMSNorm before RoPE
            q, k = qk.split([self.num_heads, self.num_kv_heads], dim=1)
            qk = torch.cat([self.q_norm(q), self.k_norm(k)], dim=1)
        q, k = apply_rope(qk, cos, sin).split([self.num_heads, self.num_kv_heads], dim=1)
        k, v = self.kv_cache.update(cache_slots, k, v, attn_mask.shape[-1])  # [B, n_kv, S, D]
        # Query head h reads KV head h // (num_heads // num_kv_heads), as transformers' repeat_kv.
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, enable_gqa=self.num_heads != self.num_kv_heads
        )
        return self.wo(y.transpose(1, 2).reshape(bsz, seqlen, self.num_heads * self.head_dim))


class FeedForward(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.w13 = FusedLinear(
            args.hidden_size, (args.intermediate_size,) * 2, bias=False
        )  # gate|up
        self.w2 = nn.Linear(args.intermediate_size, args.hidden_size, bias=False)  # down

    def forward(self, x: Tensor) -> Tensor:
        gate, up = self.w13(x).chunk(2, dim=-1)
        return self.w2(F.silu(gate) * up)


class FusedLinear(nn.Linear):
    """Several projections of one input in one matmul: the weight stacks the parts' rows in order
    (`parts` = rows per part), as the checkpoint's separate projections fill them at load."""

    def __init__(self, in_features: int, parts: tuple[int, ...], bias: bool) -> None:
        super().__init__(in_features, sum(parts), bias=bias)
        self.parts = parts


def rope_cos_sin(
    inv_freq: Tensor, position_ids: Tensor, dtype: torch.dtype
) -> tuple[Tensor, Tensor]:
    """cos, sin [B, 1, T, head_dim] in dtype for position_ids [B, T] (computed in float32)."""
    freqs = position_ids[..., None].float() * inv_freq  # [B, T, D/2]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype)[:, None], emb.sin().to(dtype)[:, None]


def causal_mask(
    start: int | Tensor,
    num_tokens: int,
    max_seq_len: int,
    batch_size: int = 1,
    device: torch.device | str | None = None,
) -> Tensor:
    """Bool mask [batch_size, 1, num_tokens, max_seq_len] for tokens at slots [start, start+T).

    Row i attends to slots 0..start+i (True = attend). Prefill: start = cached length (0 for a
    fresh prompt), T = prompt length. Decode: T = 1, start = the token's slot. `start` may be a
    0-d long tensor on `device`, which keeps the mask build free of Python-side values.
    """
    rows = start + torch.arange(num_tokens, device=device)
    mask = torch.arange(max_seq_len, device=device)[None, :] <= rows[:, None]
    return mask.expand(batch_size, 1, num_tokens, max_seq_len)
