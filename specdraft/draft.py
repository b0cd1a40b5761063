"""The EAGLE-3 draft model: one decoder layer, one forward path (its config: `draft_config.py`).

What SGLang (`srt/models/llama_eagle3.py`) and vLLM (`model_executor/models/llama_eagle3.py`)
compute, written out once (DESIGN.md §2):

    first step after the target:  h = fc(cat(aux_1, ..., aux_n))        (n·H_target -> H, no bias)
    later draft steps:            h = the previous step's output `hidden` (H wide, no fc)
    x        = cat(input_layernorm(embed(ids)), hidden_norm(h))         (2H wide; embeddings first)
    a        = o_proj(attention(q(x), k(x), v(x)))                      (RoPE, causal or tree mask)
    r        = a + h                                                    (residual = h before its norm)
    out      = r + mlp(post_attention_layernorm(r))                     (SwiGLU)
    logits   = lm_head(norm(out))                                       (draft vocabulary)
    hidden   = out                                                      (fed to the next step)

Config flags of the published variants, each computed as both engines compute it (SGLang 0.5.23
`srt/models/llama_eagle3.py`, vLLM 0.32 `model_executor/models/llama_eagle3.py`; which engine
implements which: `conventions.FLAG_RULES`):
- `norm_before_residual`: r = a + hidden_norm(h) (vLLM, speculators `Eagle3FirstLayerMixin`).
- `norm_before_fc` (speculators' "gpt-oss style"): fc(input_norm(cat(aux))), one RMSNorm
  n·H_target wide.
- `fc_norm` (EAGLE-3.1): fc(cat(fc_norm[i](aux_i))), one RMSNorm per aux state (after
  input_norm when both are set, as the engines apply them).
- `norm_output` (EAGLE-3.1): hidden = norm(out), the post-norm state, fed to the next step.
EAGLE-3.1 is fc_norm + norm_output (`draft_config.EAGLE3_METHODS` cites the references).

The drafter always knows which step it is in (`first_step`), so it never guesses from widths
whether to apply `fc` (case S2): a first-step input whose width is not n_aux·H_target is an
error that names the aux layers it expected.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention.flex_attention import BlockMask, flex_attention

from specdraft.draft_config import DraftConfig, DraftError
from specdraft.draft_rope import rope_attention_factor, rope_inv_freq


def cast(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x.to(dtype), without the call when x has it already (a draft step is a few dozen small
    ops: on the CPU, no-op casts cost ~8 % of one)."""
    return x if x.dtype == dtype else x.to(dtype)


def rope_cos_sin(
    position_ids: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the RoPE angles, each [B, 1, T, head_dim], in float32 (float64 for float64).

    position_ids: [B, T] long; inv_freq: [head_dim/2] float64. Computed once per forward and
    shared by q and k.
    """
    compute = torch.float64 if dtype == torch.float64 else torch.float32
    angles = position_ids[:, None, :, None].to(compute) * cast(inv_freq, compute)  # [B, 1, T, hd/2]
    angles = torch.cat([angles, angles], -1)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate halves of each head (Hugging Face / SGLang "neox" layout).

    x: [B, heads, T, head_dim]; cos, sin from `rope_cos_sin`. Returned in x's dtype.
    """
    xc = cast(x, cos.dtype)
    x1, x2 = xc.chunk(2, dim=-1)
    return cast(xc * cos + torch.cat([-x2, x1], dim=-1) * sin, x.dtype)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim, computed in float32 (float64 for float64 inputs), as Llama."""
    if x.dtype in (torch.float32, torch.float64):
        return F.rms_norm(x, weight.shape, cast(weight, x.dtype), eps)
    return weight * F.rms_norm(x.float(), weight.shape, eps=eps).to(x.dtype)


def fuse_aux(
    aux: torch.Tensor,
    fc: torch.Tensor,
    input_norm: torch.Tensor | None,
    fc_norms: list[torch.Tensor] | None,
    eps: float,
) -> torch.Tensor:
    """The first step's h: fc over the concatenated aux states [..., n·H_target] -> [..., H].

    input_norm [n·H_target] (`norm_before_fc`) and fc_norms, n weights [H_target] (`fc_norm`),
    are applied first when given, in that order (SGLang `LlamaModel.forward`, vLLM
    `combine_hidden_states`)."""
    if input_norm is not None:
        aux = rms_norm(aux, input_norm, eps)
    if fc_norms is not None:
        chunks = aux.chunk(len(fc_norms), dim=-1)
        aux = torch.cat([rms_norm(c, w, eps) for c, w in zip(chunks, fc_norms)], dim=-1)
    return F.linear(aux, fc)


class RMSNorm(nn.Module):
    """`rms_norm` with a learned weight."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


class Attention(nn.Module):
    """Grouped-query attention whose q/k/v read the 2H-wide [embedding ; hidden] input."""

    def __init__(self, cfg: DraftConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.q_proj = nn.Linear(
            2 * cfg.hidden_size, cfg.num_attention_heads * cfg.head_dim, bias=False
        )
        self.k_proj = nn.Linear(
            2 * cfg.hidden_size, cfg.num_key_value_heads * cfg.head_dim, bias=False
        )
        self.v_proj = nn.Linear(
            2 * cfg.hidden_size, cfg.num_key_value_heads * cfg.head_dim, bias=False
        )
        self.o_proj = nn.Linear(cfg.num_attention_heads * cfg.head_dim, cfg.hidden_size, bias=False)
        self.rope_scale = rope_attention_factor(cfg.rope_scaling)

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        attn_mask: torch.Tensor | BlockMask | None,
        past_kv: KV | None,
    ) -> tuple[torch.Tensor, KV]:
        b, t, _ = x.shape
        c = self.cfg
        q = self.q_proj(x).view(b, t, c.num_attention_heads, c.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, c.num_key_value_heads, c.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, c.num_key_value_heads, c.head_dim).transpose(1, 2)
        q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        if self.rope_scale != 1.0:  # yarn: the engines scale cos and sin, so q and k
            q, k = q * self.rope_scale, k * self.rope_scale
        new_kv = KV(k, v)
        if past_kv is not None:
            k, v = torch.cat([past_kv.k, k], dim=2), torch.cat([past_kv.v, v], dim=2)
        gqa = c.num_attention_heads != c.num_key_value_heads
        if isinstance(attn_mask, BlockMask):
            flex = compiled_flex_attention() if q.is_cuda else flex_attention
            out = flex(q, k, v, block_mask=attn_mask, enable_gqa=gqa)
            return self.o_proj(out.transpose(1, 2).reshape(b, t, -1)), new_kv
        causal = attn_mask is None and t > 1 and past_kv is None
        if attn_mask is None and t > 1 and past_kv is not None:  # causal; every past entry visible
            s = k.shape[2]
            attn_mask = torch.ones(t, s, dtype=torch.bool, device=x.device).tril(s - t)
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, is_causal=causal, enable_gqa=gqa
        )
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1)), new_kv


@functools.cache
def compiled_flex_attention():
    """torch.compile'd `flex_attention` for CUDA (compiled once per process; eager flex, used on
    the CPU, is an unfused reference implementation)."""
    return torch.compile(flex_attention, dynamic=False)


class MLP(nn.Module):
    """SwiGLU feed-forward: down(silu(gate(x)) * up(x))."""

    def __init__(self, cfg: DraftConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """The drafter's single layer (`midlayer` in SGLang and the official checkpoints)."""

    def __init__(self, cfg: DraftConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)


@dataclass
class KV:
    """Keys and values of some draft positions, post-RoPE: each [B, kv_heads, S, head_dim]."""

    k: torch.Tensor
    v: torch.Tensor

    @staticmethod
    def cat(parts: list[KV]) -> KV:
        """Concatenate along the sequence dim."""
        return KV(torch.cat([p.k for p in parts], 2), torch.cat([p.v for p in parts], 2))


@dataclass
class DraftOutput:
    """One draft forward.

    logits: [B, T, draft_vocab_size] over the draft vocabulary (map with `d2t`).
    hidden: [B, T, H] the output fed back as the next draft step's `hidden`: pre-norm, or
            post-norm with `norm_output`.
    kv:     keys/values of these T positions, for the caller's cache.
    """

    logits: torch.Tensor
    hidden: torch.Tensor
    kv: KV


class Eagle3Draft(nn.Module):
    """EAGLE-3 drafter. Parameter names are the official/SGLang checkpoint names.

    `embed_tokens` is the target's embedding (frozen, not saved) unless the drafter owns it
    (`cfg.owns_embedding`). Buffers: `d2t` [draft_vocab] int64 offsets (target id = i + d2t[i]),
    `t2d` [vocab] bool mask of target ids in the draft vocabulary.
    """

    def __init__(self, cfg: DraftConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.embed_tokens.weight.requires_grad_(cfg.owns_embedding)
        # A shared embedding must come from the target before the first forward (never random).
        self.embedding_loaded = cfg.owns_embedding
        fc_in = cfg.n_aux * cfg.target_hidden_size
        self.input_norm = RMSNorm(fc_in, cfg.rms_norm_eps) if cfg.norm_before_fc else None
        self.fc_norm = (
            nn.ModuleList(
                [RMSNorm(cfg.target_hidden_size, cfg.rms_norm_eps) for _ in range(cfg.n_aux)]
            )
            if cfg.fc_norm
            else None
        )
        self.fc = nn.Linear(fc_in, cfg.hidden_size, bias=False)
        self.midlayer = DecoderLayer(cfg)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.arange(cfg.vocab_size) < cfg.draft_vocab_size)
        # A plain attribute, not a buffer: model.to(bfloat16) must not round the frequencies.
        self.inv_freq = rope_inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Normal(0, 0.02) linears and embedding, unit norms (Llama's initialisation)."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
            elif isinstance(module, RMSNorm):
                nn.init.ones_(module.weight)

    def expected_input_width(self, first_step: bool) -> int:
        """Width of `hidden`: n_aux·H_target on the first step, H on later steps."""
        return self.cfg.n_aux * self.cfg.target_hidden_size if first_step else self.cfg.hidden_size

    def check_hidden(self, hidden: torch.Tensor, first_step: bool) -> None:
        """Raise ValueError unless `hidden` has the width this step needs (case S2)."""
        width, expected = hidden.shape[-1], self.expected_input_width(first_step)
        if width == expected:
            return
        if first_step:
            raise DraftError(
                f"draft first step needs the target's {self.cfg.n_aux} aux hidden states "
                f"concatenated (layers {list(self.cfg.aux_layers)}, width {self.cfg.n_aux} x "
                f"{self.cfg.target_hidden_size} = {expected}), got width {width}: the target side "
                f"is not capturing the aux layers"
            )
        raise DraftError(
            f"draft later step needs the drafter's own hidden state (width {expected}), "
            f"got width {width}"
        )

    def forward(
        self,
        input_ids: torch.Tensor,
        hidden: torch.Tensor,
        position_ids: torch.Tensor,
        *,
        first_step: bool,
        attn_mask: torch.Tensor | BlockMask | None = None,
        past_kv: KV | None = None,
    ) -> DraftOutput:
        """One draft step over T positions.

        input_ids:    [B, T] long, target-vocabulary ids; position t holds token t+1 (the token
                      that follows the position whose hidden state is given).
        hidden:       [B, T, n_aux·H_target] (first_step) or [B, T, H] (an earlier step's
                      `DraftOutput.hidden`).
        position_ids: [B, T] long RoPE positions.
        attn_mask:    bool [B or 1, 1 or heads, T, S_past + T], True = attend; default causal
                      among the new tokens with every past entry visible. Or a flex-attention
                      `BlockMask` over the same [T, S_past + T] (training: computes only the
                      blocks it keeps; compiled on CUDA).
        past_kv:      keys/values already cached, [B, kv_heads, S_past, head_dim] each.
        Raises ValueError when `hidden` has the wrong width for this step (case S2), and
        RuntimeError when the shared embedding was never loaded from the target.
        """
        self.check_hidden(hidden, first_step)
        if not self.embedding_loaded:
            raise RuntimeError(
                "the drafter shares the target's embedding: call "
                "load_target_embedding(target_embedding_weight) first"
            )
        if position_ids.dim() == 1:
            position_ids = position_ids.unsqueeze(0).expand(input_ids.shape[0], -1)
        cfg, layer = self.cfg, self.midlayer
        h = self.fuse_aux(hidden) if first_step else hidden
        emb = cast(self.embed_tokens(input_ids), h.dtype)
        normed_h = layer.hidden_norm(h)
        x = torch.cat([layer.input_layernorm(emb), normed_h], dim=-1)
        if self.inv_freq.device != x.device:
            self.inv_freq = self.inv_freq.to(x.device)
        rope = rope_cos_sin(position_ids, self.inv_freq, x.dtype)
        attn, kv = layer.self_attn(x, rope, attn_mask, past_kv)
        r = attn + (normed_h if cfg.norm_before_residual else h)
        out = r + layer.mlp(layer.post_attention_layernorm(r))
        normed = self.norm(out)
        return DraftOutput(
            logits=self.lm_head(normed), hidden=normed if cfg.norm_output else out, kv=kv
        )

    def fuse_aux(self, aux: torch.Tensor) -> torch.Tensor:
        """The first step's h [B, T, H] from the concatenated aux states [B, T, n_aux·H_target]:
        `fuse_aux` with this drafter's fc and, where its flags set them, its input / fc norms."""
        return fuse_aux(
            aux,
            self.fc.weight,
            None if self.input_norm is None else self.input_norm.weight,
            None if self.fc_norm is None else [n.weight for n in self.fc_norm],
            self.cfg.rms_norm_eps,
        )

    def draft_to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Map draft-vocabulary ids (any shape, long) to target ids: i + d2t[i]."""
        return draft_ids + self.d2t[draft_ids]

    @torch.no_grad()
    def load_target_embedding(self, weight: torch.Tensor) -> None:
        """Copy the target's input embedding [vocab, H] into the (frozen) shared embedding."""
        if tuple(weight.shape) != tuple(self.embed_tokens.weight.shape):
            raise DraftError(
                f"target embedding shape {tuple(weight.shape)} != drafter's "
                f"{tuple(self.embed_tokens.weight.shape)}"
            )
        self.embed_tokens.weight.copy_(weight)
        self.embedding_loaded = True
