"""The DFlash block drafter: a few decoder layers predicting a whole block of tokens in one forward.

What z-lab's reference (`dflash/model.py` DFlashDraftModel) and SGLang (`srt/models/dflash.py`)
compute, written out once; the format facts and their sources: `conventions.dflash.DFLASH_FACTS`.

    ctx     = hidden_norm(fc(cat(aux_1, ..., aux_n)))        (n·H_target -> H, no bias; context)
    h       = embed(block ids)                               (the target's embedding: the anchor
                                                              token, then block_size-1 mask tokens)
    per layer:
      x     = input_layernorm(h)
      q     = q_norm(q_proj(x))                              (per head; RoPE at the block positions)
      k, v  = k_norm(k_proj([ctx ; x])), v_proj([ctx ; x])   (context keys from ctx, in every layer)
      h     = h + o_proj(attention(q, k, v))                 (bidirectional within the block)
      h     = h + mlp(post_attention_layernorm(h))           (SwiGLU)
    logits  = lm_head(norm(h))                               (the target's lm_head, full vocabulary)

Block position k (k >= 1) predicts the token at anchor + k; position 0 holds the anchor, a token
the target has already chosen. The drafter owns neither embedding nor lm_head: both are the
target's, frozen, held as non-persistent buffers (`load_target_head`), so its state dict holds
exactly the tensors SGLang's loader reads. RMSNorm, rope and the MLP are `draft.py`'s.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from specdraft.conventions.dflash import dflash_aux_layers
from specdraft.draft import KV, MLP, RMSNorm, apply_rope, cast, rope_cos_sin
from specdraft.draft_config import DraftConfig, DraftError, method_label
from specdraft.draft_rope import rope_inv_freq

# q [B, heads, Q, head_dim] and the block's K/V -> the attention output [B, heads, Q, head_dim]
Attend = Callable[[torch.Tensor, KV], torch.Tensor]
DFLASH_ARCHITECTURE = "DFlashDraftModel"  # config.json architectures: z-lab's and SGLang's class
DEFAULT_BLOCK_SIZE = 16  # SGLang resolve_block_size(default=16), z-lab's b16 drafters
DEFAULT_NUM_LAYERS = 5  # z-lab Qwen3-8B-DFlash-b16: 5 layers, target_layer_ids [1, 9, 17, 25, 33]


@dataclass(frozen=True)
class DFlashConfig:
    """A DFlash drafter's sizes (the target's, as in z-lab's configs) and block format.

    target_layer_ids: 0-based DFlash ids (id i = output of target layer i; specdraft index i + 1,
    `aux_layers`). mask_token_id: the id filling block positions 1..block_size-1; a row of the
    target's embedding. Raises DraftError naming the field for a value the drafter cannot use.
    """

    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    target_layer_ids: tuple[int, ...]
    target_num_layers: int
    mask_token_id: int
    max_position_embeddings: int
    num_hidden_layers: int = DEFAULT_NUM_LAYERS
    block_size: int = DEFAULT_BLOCK_SIZE
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    rms_norm_eps: float = 1e-6

    def __post_init__(self) -> None:
        object.__setattr__(self, "target_layer_ids", tuple(self.target_layer_ids))
        if self.block_size < 2:
            raise DraftError(f"DFlash block_size {self.block_size}: must be at least 2")
        if self.num_hidden_layers < 1:
            raise DraftError(f"DFlash num_hidden_layers {self.num_hidden_layers}: must be >= 1")
        if not 0 <= self.mask_token_id < self.vocab_size:
            raise DraftError(
                f"DFlash mask_token_id {self.mask_token_id}: not a row of the target's "
                f"{self.vocab_size}-row embedding; give an id in 0..{self.vocab_size - 1}"
            )
        bad = [i for i in self.target_layer_ids if not 0 <= i < self.target_num_layers]
        if not self.target_layer_ids or bad:
            raise DraftError(
                f"DFlash target_layer_ids {list(self.target_layer_ids)}: need ids of decoder "
                f"layers 0..{self.target_num_layers - 1} (specdraft indices "
                f"1..{self.target_num_layers})"
            )

    @property
    def aux_layers(self) -> tuple[int, ...]:
        """The specdraft indices of the target layers (what a capture store holds)."""
        return dflash_aux_layers(self.target_layer_ids)

    @property
    def target_hidden_size(self) -> int:
        """The target's hidden size: the drafter's own (fc maps n·H -> H, the embedding and
        lm_head are the target's), as `DraftConfig.target_hidden_size` names it."""
        return self.hidden_size

    @classmethod
    def from_target(
        cls, target_config: Any, aux_layers: tuple[int, ...], mask_token_id: int, **overrides: Any
    ) -> DFlashConfig:
        """The drafter of a target (its sizes and rope, read by `DraftConfig.from_target`) on the
        target states `aux_layers` (specdraft indices; 0, the embeddings, is refused).
        `overrides` replace any field."""
        if 0 in aux_layers:
            raise DraftError(
                f"aux layers {list(aux_layers)}: DFlash reads decoder-layer outputs (specdraft "
                "indices >= 1), not the embeddings (index 0); capture other layers"
            )
        unknown = sorted(set(overrides) - {f.name for f in fields(cls)})
        if unknown:
            raise DraftError(
                f"draft_overrides {', '.join(unknown)}: no DFlashConfig field; the fields are "
                f"{', '.join(f.name for f in fields(cls))}"
            )
        base = asdict(DraftConfig.from_target(target_config, aux_layers))
        values = {f.name: base[f.name] for f in fields(cls) if f.name in base}
        values.update(
            target_layer_ids=tuple(i - 1 for i in aux_layers),
            target_num_layers=base["target_num_layers"],
            mask_token_id=mask_token_id,
        )
        values.update(overrides)
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict of every field."""
        return {**asdict(self), "target_layer_ids": list(self.target_layer_ids)}


class DFlashAttention(nn.Module):
    """Grouped-query attention of the block over [context ; block] keys, with Qwen3's per-head
    q_norm / k_norm (z-lab `Qwen3DFlashAttention`, SGLang `DFlashAttention`)."""

    def __init__(self, cfg: DFlashConfig) -> None:
        super().__init__()
        self.cfg = cfg
        q_width, kv_width = (
            cfg.num_attention_heads * cfg.head_dim,
            cfg.num_key_value_heads * cfg.head_dim,
        )
        self.q_proj = nn.Linear(cfg.hidden_size, q_width, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, kv_width, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, kv_width, bias=False)
        self.o_proj = nn.Linear(q_width, cfg.hidden_size, bias=False)
        self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)

    def context_kv(self, states: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> KV:
        """Keys and values of `states` [B, S, H] (the projected context, or the normed block),
        each [B, num_key_value_heads, S, head_dim]: k_norm(k_proj) rotated by cos, sin
        [B, 1, S, head_dim] (`rope_cos_sin`), and v_proj. Row-wise: the K/V of a position do not
        depend on the others (an engine caches the context's, SGLang `_append_target_hidden_to_draft_kv`)."""
        c = self.cfg
        b, s, _ = states.shape
        k = self.k_norm(self.k_proj(states).view(b, s, c.num_key_value_heads, c.head_dim))
        v = self.v_proj(states).view(b, s, c.num_key_value_heads, c.head_dim)
        return KV(apply_rope(k.transpose(1, 2), cos, sin), v.transpose(1, 2))

    def forward(
        self,
        x: torch.Tensor,
        ctx_kv: KV | Attend,
        rope: tuple[torch.Tensor, torch.Tensor],
        attn_mask: torch.Tensor | None,
    ) -> torch.Tensor:
        """x: [B, Q, H] the normed block states; ctx_kv: the context's K/V, `context_kv` of the
        projected context (or an engine's cache of it), each [B, kv_heads, S, head_dim], or an
        `Attend` (an engine's attention over its own cache: `engine.dflash_graph`; attn_mask then
        unused); rope: cos, sin [B, 1, Q, head_dim] of the block positions; attn_mask: bool
        [B or 1, 1, Q, S + Q], True = attend, or None (every key). Returns [B, Q, H]."""
        c = self.cfg
        b, q_len, _ = x.shape
        cos, sin = rope
        q = self.q_norm(self.q_proj(x).view(b, q_len, c.num_attention_heads, c.head_dim))
        q = apply_rope(q.transpose(1, 2), cos, sin)
        block = self.context_kv(x, cos, sin)
        if callable(ctx_kv):
            out = ctx_kv(q, block)
        else:
            k = torch.cat([ctx_kv.k, block.k], dim=2)
            v = torch.cat([ctx_kv.v, block.v], dim=2)
            gqa = c.num_attention_heads != c.num_key_value_heads
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, enable_gqa=gqa)
        return self.o_proj(out.transpose(1, 2).reshape(b, q_len, -1))


class DFlashLayer(nn.Module):
    """One draft layer (`layers.{i}` in z-lab's and SGLang's checkpoints)."""

    def __init__(self, cfg: DFlashConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = DFlashAttention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, h, ctx_kv, rope, attn_mask) -> torch.Tensor:
        """h: [B, Q, H] block states; the rest as `DFlashAttention.forward`. Returns [B, Q, H]."""
        h = h + self.self_attn(self.input_layernorm(h), ctx_kv, rope, attn_mask)
        return h + self.mlp(self.post_attention_layernorm(h))


class DFlashDraft(nn.Module):
    """DFlash drafter. Parameter names are z-lab's / SGLang's checkpoint names.

    Buffers (not saved): `embed_weight` and `lm_head_weight` [vocab, H], the target's, frozen;
    `load_target_head` fills them before the first forward.
    """

    def __init__(self, cfg: DFlashConfig) -> None:
        super().__init__()
        self.cfg = cfg
        n_ctx = len(cfg.target_layer_ids)
        self.fc = nn.Linear(n_ctx * cfg.hidden_size, cfg.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.layers = nn.ModuleList([DFlashLayer(cfg) for _ in range(cfg.num_hidden_layers)])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        shape = (cfg.vocab_size, cfg.hidden_size)
        self.register_buffer("embed_weight", torch.zeros(shape), persistent=False)
        self.register_buffer("lm_head_weight", torch.zeros(shape), persistent=False)
        self.head_loaded = False
        # A plain attribute, not a buffer: model.to(bfloat16) must not round the frequencies.
        self.inv_freq = rope_inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Normal(0, 0.02) linears, unit norms (Llama's initialisation)."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=0.02)
            elif isinstance(module, RMSNorm):
                nn.init.ones_(module.weight)

    @torch.no_grad()
    def load_target_head(self, embed_weight: torch.Tensor, lm_head_weight: torch.Tensor) -> None:
        """Copy the target's input embedding and lm_head, each [vocab, H]. Raises DraftError for
        other shapes."""
        for name, weight in (("embedding", embed_weight), ("lm_head", lm_head_weight)):
            if tuple(weight.shape) != tuple(self.embed_weight.shape):
                raise DraftError(
                    f"target {name} shape {tuple(weight.shape)} != the DFlash drafter's "
                    f"{tuple(self.embed_weight.shape)}"
                )
        self.embed_weight.copy_(embed_weight)
        self.lm_head_weight.copy_(lm_head_weight)
        self.head_loaded = True

    def forward(
        self,
        block_ids: torch.Tensor,
        aux_hidden: torch.Tensor,
        position_ids: torch.Tensor,
        attn_mask: torch.Tensor,
    ) -> torch.Tensor:
        """Hidden states of the blocks, post-norm, [B, Q, H] (logits: `logits`).

        block_ids:    [B, Q] long: blocks of block_size ids, each the anchor token then mask ids.
        aux_hidden:   [B, S, n·H_target] the target's states at the S context positions.
        position_ids: [B, S + Q] long RoPE positions, the context's then the blocks'.
        attn_mask:    bool [B or 1, 1, Q, S + Q], True = attend (`train.dflash_loss.block_mask`).
        Raises DraftError for aux states of another width, RuntimeError before `load_target_head`.
        """
        ctx = self.project_context(aux_hidden)
        if not self.head_loaded:
            raise RuntimeError("call load_target_head(embedding, lm_head) before the first forward")
        h = self.embed(block_ids, ctx.dtype)
        cos, sin = self.rope(position_ids, h.dtype)
        s = ctx.shape[1]
        block_rope = cos[:, :, s:], sin[:, :, s:]
        for layer in self.layers:
            ctx_kv = layer.self_attn.context_kv(ctx, cos[:, :, :s], sin[:, :, :s])
            h = layer(h, ctx_kv, block_rope, attn_mask)
        return self.norm(h)

    def project_context(self, aux_hidden: torch.Tensor) -> torch.Tensor:
        """hidden_norm(fc(aux)): the context states [..., H] of the target's aux states
        [..., n·H_target]. Raises DraftError for aux states of another width."""
        expected = self.fc.in_features
        if aux_hidden.shape[-1] != expected:
            raise DraftError(
                f"DFlash drafter needs the target's states of layers {list(self.cfg.aux_layers)} "
                f"concatenated (width {expected}), got width {aux_hidden.shape[-1]}"
            )
        return self.hidden_norm(self.fc(aux_hidden))

    def embed(self, block_ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The target's embedding of block_ids [...] long, in dtype: [..., H]."""
        return cast(F.embedding(block_ids, self.embed_weight), dtype)

    def rope(self, position_ids: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        """cos, sin [B, 1, T, head_dim] of position_ids [B, T] long (`rope_cos_sin`)."""
        if self.inv_freq.device != position_ids.device:
            self.inv_freq = self.inv_freq.to(position_ids.device)
        return rope_cos_sin(position_ids, self.inv_freq, dtype)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[..., vocab] logits of `forward`'s states [..., H] through the target's lm_head."""
        return F.linear(hidden, cast(self.lm_head_weight, hidden.dtype))


def drafter_label(cfg: Any) -> str:
    """What a loaded drafter is, in one phrase: "dflash (block size 16, 5 layers)" for a
    DFlashConfig, else `draft_config.method_label` (an EAGLE-3 method and its norm flags)."""
    if isinstance(cfg, DFlashConfig):
        return f"dflash (block size {cfg.block_size}, {cfg.num_hidden_layers} layers)"
    return method_label(cfg)
