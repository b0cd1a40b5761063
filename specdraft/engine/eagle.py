"""EAGLE-3 drafting on the engine's hot path: the drafter's steps (`FastDraft`), its K/V cache
(`DraftCache`) and the chain proposer (`EagleChain`; the tree's is `eagle_tree.EagleTree`).

`FastDraft` computes what `Eagle3Draft.forward` computes (parity: tests/unit/engine/test_eagle.py)
with the engine's cache protocol and fewer operations per step: q/k/v and gate/up as one matmul
each (weights stacked once: build a new FastDraft after changing the drafter's weights); K/V
written into the `DraftCache` and attended in place; tensors and functions, not modules (batch
1 on the CPU a step is bound by per-call overhead: benchmarks/RESULTS.md). Norm and RoPE are
`draft.py`'s. After `use_triton()` (CUDA, bf16 / fp16) a step of up to 64 positions runs the
Triton kernels (`kernels.linear_ops`, `norm_rope_ops`, `attention_ops`): eleven launches
(twelve on a first step, with fc) where torch makes about forty, RoPE and the K/V writes in
the q|k|v matmul's epilogue, silu(gate) * up in the gate|up matmul's; RoPE then in float32
(agrees to bf16 rounding: tests/unit/engine/kernels/test_fused_decode.py); `draft_round.GraphedDraft` replays them as
CUDA graphs (the kernel step: `kernels.fused_draft`).

The draft cache: entries 0..length-1 are the first-step K/V at committed positions (one per
token the target accepted); entries from `length` on are scratch for the round's later steps,
never committed (the next round's first step overwrites them: rejecting a branch only moves
the length pointer).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention import SDPBackend, sdpa_kernel

from specdraft.draft import KV, Eagle3Draft, apply_rope, fuse_aux, rms_norm, rope_cos_sin
from specdraft.engine.fast_model import causal_mask
from specdraft.engine.kernels import fused_decode
from specdraft.engine.requests import Request
from specdraft.engine.round import Proposal
from specdraft.engine.sampling import logits_to_probs, sample
from specdraft.engine.spec_config import SpecConfig

# Attention kernels for the drafter. Not cuDNN: it builds an execution plan for every new
# shape, and the drafter's past grows every round (benchmarks/RESULTS.md). The target
# keeps every kernel: its decode / verify shapes are static, and cuDNN is the fastest there.
DRAFT_SDPA_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
NO_CONTEXT = contextlib.nullcontext()  # reusable: the CPU's drafter attention (nothing to pick)


class DraftStep(NamedTuple):
    """What one draft step computes (`draft_step` gives the shapes)."""

    input_ids: Tensor
    hidden: Tensor
    positions: Tensor
    first_step: bool
    cache: Any  # a DraftCache, or a batch's `batch_draft.DraftRows`


def draft_step(run: Callable[..., tuple[Tensor, Tensor]]) -> Callable[..., tuple[Tensor, Tensor]]:
    """The drafter's step as the proposers call it (`FastDraft`, `draft_round.GraphedDraft`),
    over the drafter's own `run(self, step, start, attn_mask)`, which gets the step's inputs,
    flag and cache as one `DraftStep`."""

    def __call__(
        self: Any,
        input_ids: Tensor,
        hidden: Tensor,
        positions: Tensor,
        first_step: bool,
        cache: DraftCache,
        start: int,
        attn_mask: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        return run(
            self, DraftStep(input_ids, hidden, positions, first_step, cache), start, attn_mask
        )

    __call__.__doc__ = f"""One draft step over T positions, as `Eagle3Draft.forward` for one
        sequence: input_ids [T] long (target ids); hidden [T, n_aux*H_target] on the first step,
        else [T, H];
        positions [T] long (RoPE). Writes the step's K/V at cache entries start..start+T-1, then
        attends over entries 0..start+T-1 where attn_mask [T, start+T] (or [1, 1, T, start+T])
        bool says, or (None) to every earlier entry and causally among the T. Returns logits
        [T, draft vocab] and the output [T, H] a later step reads as its hidden (pre-norm;
        post-norm for `norm_output`). A batch's rows (`batch_draft`): [B, ...] shapes, a mask.

        {run.__doc__}"""
    return __call__


class FastDraft:
    """Batch-1 EAGLE-3 draft steps over a `DraftCache` (see the module docstring)."""

    @torch.no_grad()
    def __init__(self, draft: Eagle3Draft) -> None:
        cfg = draft.cfg
        self.num_heads, self.num_kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim, self.eps = cfg.head_dim, cfg.rms_norm_eps
        weights = {name: param.detach() for name, param in draft.named_parameters()}  # no autograd
        self.embed, self.fc = weights["embed_tokens.weight"], weights["fc.weight"]
        self.input_fc_norm = weights.get("input_norm.weight")  # norm_before_fc, else None
        self.fc_norms = (
            [weights[f"fc_norm.{i}.weight"] for i in range(cfg.n_aux)] if cfg.fc_norm else None
        )
        self.norm_before_residual, self.norm_output = cfg.norm_before_residual, cfg.norm_output
        self.input_norm = weights["midlayer.input_layernorm.weight"]
        self.hidden_norm = weights["midlayer.hidden_norm.weight"]
        scale = draft.midlayer.self_attn.rope_scale  # yarn's on cos/sin: rope is linear, so on q, k
        self.wqkv = torch.cat(
            [
                weights[f"midlayer.self_attn.{x}_proj.weight"] * s
                for x, s in zip("qkv", (scale, scale, 1))
            ]
        )  # rows q|k|v
        self.qkv_heads = self.wqkv.shape[0] // self.head_dim
        self.wo = weights["midlayer.self_attn.o_proj.weight"]
        self.post_attention_norm = weights["midlayer.post_attention_layernorm.weight"]
        self.w13 = torch.cat(
            [weights[f"midlayer.mlp.{x}_proj.weight"] for x in ("gate", "up")]
        )  # gate|up
        self.w2 = weights["midlayer.mlp.down_proj.weight"]
        self.norm, self.lm_head = weights["norm.weight"], weights["lm_head.weight"]
        compute = (
            torch.float64 if self.fc.dtype == torch.float64 else torch.float32
        )  # rope_cos_sin's
        self.inv_freq = draft.inv_freq.to(self.fc.device, compute)  # converted once, not every step
        self.triton_kernels = False

    def use_triton(self) -> str | None:
        """Run steps of at most `fused_decode.MAX_TOKENS` positions through the Triton kernels
        from now on. Returns None when switched on, else why it cannot be (see
        `fused_decode.kernel_support`)."""
        reason = fused_decode.kernel_support(self.fc, self.head_dim)
        self.triton_kernels = reason is None
        return reason

    @draft_step
    def __call__(
        self, step: DraftStep, start: int, attn_mask: Tensor | None
    ) -> tuple[Tensor, Tensor]:
        """FastDraft: the Triton kernels after `use_triton` (T <= 64, one sequence), else torch
        ops."""
        input_ids, hidden, positions, first_step, cache = step
        t = input_ids.shape[-1]
        if self.triton_kernels and t <= fused_decode.MAX_TOKENS and input_ids.dim() == 1:
            cache.check_write(start, t)
            if attn_mask is None:  # every earlier entry, causal among the T
                attn_mask = causal_mask(start, t, start + t, device=hidden.device)[0, 0]
            slots = torch.arange(start, start + t, device=hidden.device)
            mask = attn_mask.view(1, 1, t, start + t)
            return self.triton_step(step, slots, mask)
        h = hidden
        if first_step:
            h = fuse_aux(hidden, self.fc, self.input_fc_norm, self.fc_norms, self.eps)
        normed_h = rms_norm(h, self.hidden_norm, self.eps)
        emb = rms_norm(F.embedding(input_ids, self.embed), self.input_norm, self.eps)
        x = torch.cat([emb, normed_h], dim=-1)
        cos, sin = rope_cos_sin(positions.view(-1, t), self.inv_freq, x.dtype)
        # q|k|v heads: [B, heads, T, D] (B = 1: one sequence; torch ops: Triton is batch 1)
        qkv = F.linear(x, self.wqkv).view(-1, t, self.qkv_heads, self.head_dim).transpose(1, 2)
        qk, v = qkv.split([self.num_heads + self.num_kv_heads, self.num_kv_heads], dim=1)
        q, k = apply_rope(qk, cos, sin).split([self.num_heads, self.num_kv_heads], dim=1)
        cache.write(KV(k, v), start)
        past = cache.view(start + t)
        if attn_mask is None and t > 1:  # not tril: see tree.verify_mask
            attn_mask = causal_mask(start, t, start + t, device=x.device)[0, 0]
        y = F.scaled_dot_product_attention(
            q, past.k, past.v, attn_mask=attn_mask, enable_gqa=self.num_heads != self.num_kv_heads
        )
        residual = normed_h if self.norm_before_residual else h
        r = F.linear(y.transpose(1, 2).reshape(*input_ids.shape, -1), self.wo) + residual
        normed_r = rms_norm(r, self.post_attention_norm, self.eps)
        gate, up = F.linear(normed_r, self.w13).chunk(2, dim=-1)
        out = r + F.linear(F.silu(gate) * up, self.w2)
        normed = rms_norm(out, self.norm, self.eps)
        return F.linear(normed, self.lm_head), normed if self.norm_output else out

    def triton_step(
        self, step: DraftStep, slots: Tensor, attn_mask: Tensor
    ) -> tuple[Tensor, Tensor]:
        """A step through the Triton kernels (after `use_triton`; T <= 64): step as `__call__`'s;
        writes the K/V at cache entries slots [T] long, then attends where attn_mask [1, 1, T, S]
        bool says over entries 0..S-1 (S <= cache.max_len). Returns what `__call__` returns.
        Tensors, no host values: `GraphedDraft` captures it (`kernels.fused_draft.draft_step`)."""
        from specdraft.engine.kernels.fused_draft import draft_step as kernel_step

        return kernel_step(self, step, slots, attn_mask)


class DraftCache:
    """K/V buffers [1, num_kv_heads, max_len, head_dim] (post-RoPE, like `Eagle3Draft` returns)."""

    def __init__(
        self,
        num_kv_heads: int,
        head_dim: int,
        max_len: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        shape = (1, num_kv_heads, max_len, head_dim)
        self.k: Tensor = torch.zeros(shape, dtype=dtype, device=device)
        self.v: Tensor = torch.zeros(shape, dtype=dtype, device=device)
        self.max_len = max_len
        self.length = 0

    @classmethod
    def over(cls, k: Tensor, v: Tensor) -> DraftCache:
        """An empty cache over the buffers k, v [1, num_kv_heads, max_len, head_dim] (views of a
        batch's rows: `batch_draft.DraftRows`)."""
        cache = cls(k.shape[1], k.shape[3], 0, k.dtype, k.device)
        cache.k, cache.v, cache.max_len = k, v, k.shape[2]
        return cache

    def view(self, end: int) -> KV:
        """Entries 0..end-1 as a KV view (no copy), to pass as the drafter's `past_kv`."""
        if end > self.max_len:
            raise ValueError(f"draft cache view up to {end} exceeds its size {self.max_len}")
        return KV(self.k[:, :, :end], self.v[:, :, :end])

    def check_write(self, start: int, num: int) -> None:
        """Raise ValueError when entries start..start+num-1 run past the end of the buffers (the
        check of every writer: `write`, and the Triton steps that write in their kernels)."""
        if start + num > self.max_len:
            raise ValueError(
                f"draft cache write of {num} entries at {start} exceeds its size {self.max_len}"
            )

    def write(self, kv: KV, start: int) -> None:
        """Store kv (each [1, num_kv_heads, T, head_dim]) at entries start..start+T-1.

        Raises ValueError past the end of the buffers."""
        t = kv.k.shape[2]
        self.check_write(start, t)
        self.k[:, :, start : start + t] = kv.k
        self.v[:, :, start : start + t] = kv.v

    def append(self, kv: KV) -> None:
        """Write kv at the end of the committed entries and commit them."""
        self.write(kv, self.length)
        self.commit(kv.k.shape[2])

    def commit(self, num: int) -> None:
        """Commit the num entries written right after the committed ones (a first draft step's).

        Raises ValueError past the end of the buffers."""
        if self.length + num > self.max_len:
            raise ValueError(
                f"draft cache commit of {num} entries at {self.length} exceeds its size "
                f"{self.max_len}"
            )
        self.length += num

    def rollback(self, length: int) -> None:
        """Keep only the first `length` committed entries (0 resets the cache).

        Raises ValueError for a length outside 0..self.length."""
        if not 0 <= length <= self.length:
            raise ValueError(f"draft cache rollback to {length}: must be in 0..{self.length}")
        self.length = length


class EagleChain:
    """The `round.Proposer` of EAGLE-3 chains (topk 1). A round: the drafter's first step over
    the positions the target accepted last round (`Request.pending_ids` / `pending_aux`: position
    t gets token t+1, the last one the bonus token), then num_steps - 1 steps on its own hidden
    state, each drafting the argmax (T = 0; Triton: ties to the lower draft id) or a draw from
    its q (T > 0: q kept for `sampling.verify_chain`); compiled, a greedy round replays one CUDA
    graph (`rounds`, a `draft_round.GraphedRound`).

    fast: the drafter's steps (`run_draft`: them or their graphs); cache: its DraftCache; vocab:
    [Vd] long target ids of the draft ids; vocab_size: V; runner: the `round.TargetRunner`.
    """

    drafts = True

    def __init__(
        self,
        fast: FastDraft,
        cache: DraftCache,
        spec: SpecConfig,
        vocab: Tensor,
        vocab_size: int,
        runner: Any,
    ) -> None:
        self.fast = self.run_draft = fast
        self.cache, self.spec, self.vocab, self.vocab_size = cache, spec, vocab, vocab_size
        self.runner, self.num_steps, self.num_nodes = runner, spec.num_steps, spec.num_draft_tokens
        self.dtype, self.device = fast.fc.dtype, vocab.device
        self.cuda = self.device.type == "cuda"
        self.rounds: Any = None  # a draft_round.GraphedRound once compiled
        self.kernels = False  # drafts picked by kernels.expand_ops.child_topk (`use_kernels`)
        self.child_topk: Any = None
        self.timed = False  # a graphed round's GPU time to read (`drafting`)
        self.events = (
            (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            if self.cuda
            else None
        )

    def use_kernels(self) -> None:
        """Pick the drafts through `kernels.expand_ops` from now on, where the drafter's steps
        run Triton kernels and the draft vocabulary fits (`expand_ops.MAX_VOCAB`)."""
        if self.fast.triton_kernels:
            from specdraft.engine.kernels.expand_ops import MAX_VOCAB, child_topk

            self.kernels, self.child_topk = self.vocab.numel() <= MAX_VOCAB, child_topk

    def prefilled(self, req: Request, ids: Tensor, token: int, aux: Tensor | None) -> None:
        """A new sequence: the draft cache emptied, the prompt's positions pending."""
        self.cache.rollback(0)
        req.pending_ids = torch.cat([ids[1:], ids.new_tensor([token])])
        req.pending_aux = aux.to(self.dtype)

    def propose(self, req: Request) -> Proposal:
        """The root and num_steps drafts (written into the verify graph's input once compiled)."""
        out = None if self.runner.graphed is None else self.runner.device_input_ids(self.num_nodes)
        out = None if out is None else out[0]
        if self.rounds is not None and req.greedy:
            proposal = self.graphed_round(req, out)
            if proposal is not None:
                return proposal
        draft, cache, vocab, m = self.run_draft, self.cache, self.vocab, req.pending_ids.numel()
        start, sampled = cache.length, not req.greedy
        tokens, probs = [vocab.new_tensor([req.output_ids[-1]])], []
        scores = torch.zeros(1, device=self.device) if self.kernels else None  # the root's
        with sdpa_kernel(DRAFT_SDPA_BACKENDS) if self.cuda else NO_CONTEXT:
            positions = torch.arange(start, start + m, device=self.device)
            logits, hidden = draft(req.pending_ids, req.pending_aux, positions, True, cache, start)
            cache.commit(m)
            logits, hidden = logits[-1:], hidden[-1:]
            for step in range(1, self.num_steps + 1):  # draft `step` at RoPE position t + step
                if sampled:
                    q = logits_to_probs(logits, req.params)  # [1, Vd]
                    child = sample(q, req.generator)[:, None]
                    probs.append(q.new_zeros(1, self.vocab_size).index_copy_(1, vocab, q))
                    token = vocab[child].reshape(-1)
                elif self.kernels:
                    token, scores = self.child_topk(logits, scores, vocab, 1)
                else:
                    logp = logits.float().log_softmax(-1).clamp(max=0.0)
                    token = vocab[logp.topk(1, dim=-1).indices].reshape(-1)
                tokens.append(token)
                if step < self.num_steps:
                    position = torch.full((1,), start + m - 1 + step, device=self.device)
                    logits, hidden = draft(
                        token, hidden, position, False, cache, start + m + step - 1
                    )
        chain = torch.cat(tokens)
        chain = chain if out is None else out.copy_(chain)
        return Proposal(chain, None, None, torch.cat(probs) if probs else None, self.num_steps)

    def replay(self, req: Request) -> tuple | None:
        """A greedy round as one graph replay (`GraphedRound`), its GPU time recorded: its
        candidates, or None when no graph holds this many pending positions."""
        if self.events is not None:
            self.events[0].record()
        candidates = self.rounds(req.pending_ids, req.pending_aux, self.cache.length)
        if candidates is None:
            return None
        if self.events is not None:
            self.events[1].record()
            self.timed = True
        self.cache.commit(req.pending_ids.numel())
        return candidates

    def graphed_round(self, req: Request, out: Tensor | None) -> Proposal | None:
        """A greedy chain from one graph replay (`replay`), or None."""
        candidates = self.replay(req)
        if candidates is None:
            return None
        tokens = candidates[0] if out is None else out.copy_(candidates[0])
        return Proposal(tokens, None, None, None, self.num_steps)

    def accepted(
        self, req: Request, emitted: list[int], path: Tensor | None, aux: Tensor | None
    ) -> None:
        """The accepted positions pending for the next round's first step (emitted: the
        accepted drafts and the bonus, which follow the path's positions)."""
        req.pending_ids = torch.tensor(emitted, device=self.device)
        kept = aux[: len(emitted)] if path is None else aux[path]
        req.pending_aux = kept.to(self.dtype)

    def drafting(self, elapsed: float) -> float:
        """The last graphed round's GPU time (it ran behind the host), at most elapsed."""
        start, end = self.events
        self.timed = False
        return min(elapsed, start.elapsed_time(end) / 1e3)
