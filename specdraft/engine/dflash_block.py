"""DFlash block drafting in the engine's round: the block proposer (`DFlashBlock`, a
`round.Proposer`, with the drafter's context cache), the settings it refuses (`block_problems`)
and the target head a DFlash drafter shares (`target_head`).

A round: ONE drafter forward over [root, mask x (block_size - 1)] at positions start ..
start + block_size - 1 (root = the last emitted token, not yet in the target's cache; start =
its position) proposes the chain of the first num_steps block positions' argmax tokens; the target
verifies root + drafts in one forward (`round.TargetRunner.verify`, causal); the accepted
positions (root and accepted drafts: `len(emitted)` of them) then join the drafter's context with
the verify's aux states of those positions. As the references run it: z-lab `dflash/model.py`
`dflash_generate` (the block, the draft cache cropped back to the context after each block, the
accepted positions' hidden states the next context), SGLang `srt/speculative/dflash_worker.py`
(`_append_target_hidden_to_draft_kv`, `_greedy_sample_from_vocab_parallel_head`) and
`dflash_info.py` (`DFlashVerifyInput.verify`: the committed verify positions' hidden states
become the next context), vLLM `v1/spec_decode/dflash.py` (`DFlashProposer`,
`precompute_and_store_context_kv`).

The context is kept, not recomputed: every draft layer's K/V (a `eagle.DraftCache` per layer) of each context position
(`DFlashAttention.context_kv` of hidden_norm(fc(aux)) at that position) is row-wise, independent
of the other positions and of the block, so it is computed once, when the target accepts the
position, and attended from the cache by every later block (SGLang and vLLM materialise it in the
draft KV cache the same way). Recomputing it would cost a forward over the whole prefix per
round; the cache costs num_layers x 2 x kv_heads x head_dim values per position.

The whole block runs even when fewer drafts are kept (num_steps < block_size - 1): its positions
attend to each other both ways, so the kept drafts are those of the block the drafter was trained
on (vLLM runs 1 + num_speculative_tokens queries instead; SGLang the whole block).

Drafts are the argmax of the drafter's logits at every temperature and are verified target-only at
T > 0 (`round.Proposal.accept` without q: `sampling.verify_tree` on the chain), SGLang's rule
(greedy drafts, `dflash_utils` sampling verify); lossless at any temperature. z-lab's newer loop
samples drafts from q and verifies by rejection sampling instead.

Compiled (CUDA), a round is one CUDA-graph replay (`dflash_graph.GraphedBlock`: the pending
positions' context K/V, the block and its argmax at static addresses), not some 70 torch ops
per draft layer launched from the host.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor
from torch.nn.attention import sdpa_kernel

from specdraft.dflash import Attend, DFlashDraft
from specdraft.draft import KV, cast
from specdraft.engine.eagle import DRAFT_SDPA_BACKENDS, NO_CONTEXT, DraftCache
from specdraft.engine.requests import Request
from specdraft.engine.round import Proposal
from specdraft.engine.spec_config import SpecConfig


class DFlashBlock:
    """The `round.Proposer` of a DFlash drafter (see the module docstring): num_steps drafts
    (at most block_size - 1) from one drafter forward per round.

    draft: the DFlashDraft, its target head loaded (`load_target_head`), in eval mode; spec: a
    chain (`block_problems`); max_seq_len: the engine's; caches: the context's per-layer caches
    to use (a batch row's, `dflash_rows.DFlashRows.row`), else new ones of max_seq_len +
    block_size entries, rounded up to a multiple of 16: a graphed round writes its block after
    the context and attends over the whole cache (`dflash_graph.GraphedBlock`, set as `graphs`
    by `SpeculativeEngine.compile`).
    """

    drafts = True
    timed = False

    def __init__(
        self,
        draft: DFlashDraft,
        spec: SpecConfig,
        max_seq_len: int,
        device: torch.device,
        caches: list[DraftCache] | None = None,
    ) -> None:
        cfg = draft.cfg
        self.draft, self.num_drafts, self.device = draft, spec.num_steps, device
        self.dtype = draft.fc.weight.dtype
        entries = -(-(max_seq_len + cfg.block_size) // 16) * 16
        self.caches = caches or [  # per layer: the context's K/V at entries = positions 0..
            DraftCache(cfg.num_key_value_heads, cfg.head_dim, entries, self.dtype, device)
            for _ in draft.layers
        ]
        self.masks = torch.full((cfg.block_size - 1,), cfg.mask_token_id, device=device)
        self.offsets = torch.arange(cfg.block_size, device=device)
        self.graphs: Any = None  # a dflash_graph.GraphedBlock once compiled

    def prefilled(self, req: Request, ids: Tensor, token: int, aux: Tensor | None) -> None:
        """A new sequence: the context emptied, the prompt's positions 0..n-1 pending (aux
        [n, n_aux*H]: `Request.pending_aux`)."""
        for cache in self.caches:
            cache.rollback(0)
        req.pending_aux = aux

    def propose(self, req: Request) -> Proposal:
        """The pending positions' context K/V appended (`extend`), then the root
        (req.output_ids[-1], at position req.length) and the argmax tokens of block positions
        1..num_steps: tokens [num_steps + 1] long on the engine device. Compiled, one graph
        replay (`graphs`) does it all. Eagerly on CUDA the block's attention avoids cuDNN, as
        the EAGLE-3 drafter's does (`eagle.DRAFT_SDPA_BACKENDS`: a plan per context length)."""
        if self.graphs is not None:
            tokens = self.graphs(req.output_ids[-1], req.pending_aux)
            self.timed = bool(self.graphs.events)
            return Proposal(tokens, None, None, None, self.num_drafts)
        self.timed = False
        self.extend(req.pending_aux)  # drafting work: timed as the round's drafting
        block = self.block_ids(req)
        with sdpa_kernel(DRAFT_SDPA_BACKENDS) if self.device.type == "cuda" else NO_CONTEXT:
            hidden = self.block_hidden(block, self.caches[0].length)
        return Proposal(
            torch.cat([block[:1], self.draft_tokens(hidden)]), None, None, None, self.num_drafts
        )

    def block_ids(self, req: Request) -> Tensor:
        """The round's block [block_size] long: req's root (its last emitted token), then the
        mask ids."""
        return torch.cat([self.masks.new_tensor([req.output_ids[-1]]), self.masks])

    def accepted(
        self, req: Request, emitted: list[int], path: Tensor | None, aux: Tensor | None
    ) -> None:
        """The root and the accepted drafts (the first len(emitted) verified positions; a chain's
        path is None) are pending for the context, with their aux states from the verify."""
        req.pending_aux = aux[: len(emitted)]

    def drafting(self, elapsed: float) -> float:
        """The last graph replay's GPU time (it ran behind the host), at most elapsed; eagerly
        none (the host's time is the drafting)."""
        if not self.timed:
            return 0.0
        self.timed = False
        return min(elapsed, self.graphs.gpu_seconds())

    def extend(self, aux: Tensor) -> None:
        """Append the context K/V of the target's aux states aux [n, n_aux*H] at positions
        length..length+n-1 to every layer's cache."""
        n, start = aux.shape[0], self.caches[0].length
        positions = torch.arange(start, start + n, device=self.device)
        for cache, kv in zip(self.caches, self.context_kvs(aux, positions)):
            cache.append(kv)

    def context_kvs(self, aux: Tensor, positions: Tensor) -> list[KV]:
        """Per draft layer, the context K/V (each [1, kv_heads, n, head_dim]) of the aux states
        aux [n, n_aux*H] at positions [n] long."""
        ctx = self.draft.project_context(cast(aux[None], self.dtype))  # [1, n, H]
        cos, sin = self.draft.rope(positions[None], self.dtype)
        return [layer.self_attn.context_kv(ctx, cos, sin) for layer in self.draft.layers]

    def block_hidden(self, block_ids: Tensor, start: int) -> Tensor:
        """The drafter's post-norm states [block_size, H] of block_ids [block_size] long at
        positions start.., attending to the whole context and the whole block."""
        contexts = [cache.view(cache.length) for cache in self.caches]
        return self.block_states(block_ids, start + self.offsets, contexts)

    def block_states(
        self,
        block_ids: Tensor,
        positions: Tensor,
        contexts: Sequence[KV | Attend],
        mask: Tensor | None = None,
    ) -> Tensor:
        """The post-norm states [B, block_size, H] of block_ids [B, block_size] long at positions
        [B, block_size] long (or one row: [block_size] each, the states [block_size, H]), each
        layer's attention over its entry of contexts (the context K/V, or an `Attend` over its
        cache: `DFlashAttention.forward`) under mask (bool over context + block; None: all)."""
        row = block_ids.dim() == 1
        if row:
            block_ids, positions = block_ids[None], positions[None]
        h = self.draft.embed(block_ids, self.dtype)
        rope = self.draft.rope(positions, self.dtype)
        for layer, context in zip(self.draft.layers, contexts):
            h = layer(h, context, rope, mask)
        h = self.draft.norm(h)
        return h[0] if row else h

    def draft_tokens(self, hidden: Tensor) -> Tensor:
        """The drafts [num_steps] long: the argmax of block positions 1..num_steps of hidden
        [block_size, H]."""
        return self.draft.logits(hidden[1 : self.num_drafts + 1]).argmax(-1)


def target_head(target) -> tuple[Tensor, Tensor]:
    """The target's input embedding and lm_head weights, each [vocab, H], which a DFlash drafter
    shares (`DFlashDraft.load_target_head`): a FastTarget's `tok_embeddings` / `output`, an
    `hf_target.HFTarget`'s embedding and its transformers model's lm_head."""
    from specdraft.engine.hf_target import HFTarget

    head = target.target.lm_head if isinstance(target, HFTarget) else target.output
    return target.tok_embeddings.weight, head.weight


def block_problems(draft: DFlashDraft, spec: SpecConfig) -> list[str]:
    """What keeps the DFlash `draft` from running `spec` (`speculate.check_pairing` adds the fit to
    the target): a setting other than a chain of at most block_size - 1 drafts, its target head
    not loaded."""
    problems = []
    if not spec.is_chain:
        problems.append(f"topk {spec.topk}: a DFlash drafter proposes one chain per block (topk 1)")
    if spec.num_steps > draft.cfg.block_size - 1:
        problems.append(
            f"num_steps {spec.num_steps} > block_size {draft.cfg.block_size} - 1, the drafts a "
            "block proposes"
        )
    if not draft.head_loaded:
        problems.append(
            "the target's embedding and lm_head are not loaded (call "
            "draft.load_target_head(embedding, lm_head))"
        )
    return problems
