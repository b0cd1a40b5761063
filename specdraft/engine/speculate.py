"""`SpeculativeEngine`: batch-1 speculative decoding over a target, with an EAGLE-3 drafter, a
DFlash block drafter (`dflash_block.DFlashBlock`) or none (plain decoding, the baseline), and
the checks of a request's length and of the pairing.

Set-up only: each round is `round.speculative_round` (propose -> verify -> accept -> commit)
between the engine's `round.Proposer` (`eagle.EagleChain`, `eagle_tree.EagleTree`,
`dflash_block.DFlashBlock`, or `round.PlainDecoding`) and its `round.Target` (`round.TargetRunner`). Compiled (CUDA): the
target's forwards replay CUDA graphs (`graphs.GraphedTarget`; plain decoding with the host one
step ahead, `GraphedTarget.decode_ahead`), the drafter's steps too (`draft_round.GraphedDraft`),
a greedy round is one graph replay (`draft_round.GraphedRound`; a DFlash round at any
temperature: `dflash_graph.GraphedBlock`), and greedy EAGLE-3 rounds run one round ahead of the
host (`rounds_ahead.RoundsAhead`). The request (output, stop strings, text) is a
`requests.Request`; loading a target and a drafter from disk is `load.load_engine`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from specdraft.dflash import DFlashDraft
from specdraft.draft import Eagle3Draft
from specdraft.engine.dflash_block import DFlashBlock, block_problems
from specdraft.engine.dflash_graph import GraphedBlock, block_buckets
from specdraft.engine.draft_round import GraphedDraft, GraphedRound, draft_graph_keys
from specdraft.engine.eagle import DraftCache, EagleChain, FastDraft
from specdraft.engine.eagle_tree import EagleTree
from specdraft.engine.errors import EngineError
from specdraft.engine.fast_model import FastTarget
from specdraft.engine.kernels import fused_decode
from specdraft.engine.requests import (
    GenerationResult,
    Request,
    SpecMetrics,
    TokenCallback,
    check_request,
    sampling_generator,
)
from specdraft.engine.round import (
    PlainDecoding,
    Proposer,
    TargetRunner,
    prefill_request,
    speculative_round,
)
from specdraft.engine.rounds_ahead import RoundsAhead, padded_rows
from specdraft.engine.sampling import SamplingParams
from specdraft.engine.spec_config import SpecConfig


class SpeculativeEngine:
    """Batch-1 EAGLE-3 speculative decoding over a FastTarget (plain decoding without a draft).

    target: FastTarget (its cache is (re)allocated here for max_seq_len). draft: Eagle3Draft
    with its embedding loaded, a DFlashDraft with the target's head loaded (`dflash_block`), or
    None. spec: SpecConfig, or None for plain decoding.
    aux_layers: the target layers the drafter reads (specdraft indices); None = the drafter's.
    max_seq_len: cache size = the longest prompt + max_new_tokens (rounds near the cache's end
    verify fewer nodes: `round.free_nodes`).
    tokenizer: anything with decode(list[int]) -> str; needed for stop strings and text.
    compile (CUDA only): compile each target layer (torch.compile, in place), run decode and
    verify forwards of up to 64 tokens through the Triton kernels of `kernels.fused_decode`
    where the target allows (`target_kernels` says which path runs, and why), and replay them
    as CUDA graphs (`TargetRunner.compile`); run the drafter's steps of up to 64 positions
    through the Triton kernels too, replayed as CUDA graphs (`GraphedDraft`; `draft_kernels`
    says which path runs), and greedy requests one round ahead of the host (`RoundsAhead`); a
    DFlash drafter's rounds replay CUDA graphs of its torch ops (`dflash_graph.GraphedBlock`).
    Otherwise the drafter runs eagerly.
    Raises ValueError when the drafter does not fit the target (hidden size, vocab, layers,
    aux layers) or topk exceeds the draft vocabulary.
    """

    def __init__(
        self,
        target: FastTarget,
        draft: Eagle3Draft | DFlashDraft | None,
        spec: SpecConfig | None,
        aux_layers: Sequence[int] | None,
        max_seq_len: int,
        device: torch.device | str,
        tokenizer: Any = None,
        compile: bool = False,
    ) -> None:
        self.target, self.device, self.tokenizer = target, torch.device(device), tokenizer
        self.draft = draft if spec is not None else None
        self.spec = spec if draft is not None else None
        self.max_seq_len = max_seq_len
        self.aux_layers: tuple[int, ...] = ()
        if self.draft is not None:
            self.aux_layers = tuple(aux_layers if aux_layers is not None else draft.cfg.aux_layers)
        self.total = SpecMetrics()
        self.notes: list[str] = []  # what a user should know about the pairing (`load_engine`)
        # the round's Target (allocates the cache) and Proposer
        self.runner = TargetRunner(target, self.aux_layers, max_seq_len, self.device)
        self.proposer: Proposer = PlainDecoding()
        if self.draft is not None:
            self.setup_draft()
        self.rounds_ahead: RoundsAhead | None = None  # greedy rounds one round ahead (compile=True)
        self.target_kernels = self.draft_kernels = "torch"
        # or "transformers" (`hf_target.HFTarget`, set by `load.load_engine`)
        self.target_path = "fast"
        if compile and self.device.type == "cuda":
            self.compile()

    def setup_draft(self) -> None:
        """Check the pairing, then build the drafter's cache, vocabulary map, packed steps and
        proposer (`EagleChain` for a chain, `EagleTree` for a tree; a DFlash drafter's
        `dflash_block.DFlashBlock`)."""
        draft, spec = self.draft, self.spec
        check_pairing(self.target, draft, self.aux_layers, spec)
        if isinstance(draft, DFlashDraft):
            self.proposer = DFlashBlock(draft, spec, self.max_seq_len, self.device)
            return
        cfg, scratch = draft.cfg, (spec.num_steps - 1) * spec.topk
        # + MAX_TOKENS entries no request reaches: GraphedDraft's captures write there
        self.draft_cache = DraftCache(
            cfg.num_key_value_heads,
            cfg.head_dim,
            self.max_seq_len + scratch + fused_decode.MAX_TOKENS,
            draft.fc.weight.dtype,
            self.device,
        )
        self.draft_vocab = draft.draft_to_target(
            torch.arange(cfg.draft_vocab_size, device=self.device)
        )
        self.fast_draft = FastDraft(draft)
        kind = EagleChain if spec.is_chain else EagleTree
        self.proposer = kind(*self.draft_parts(), self.runner)

    def draft_parts(self) -> tuple[FastDraft, DraftCache, SpecConfig, Tensor, int]:
        """What the drafting proposers and `GraphedRound` are built over, in their arguments'
        order: the drafter's steps, its cache, the setting, the draft-to-target ids [Vd] long
        and the target's vocabulary size V."""
        vocab_size = self.target.args.vocab_size
        return self.fast_draft, self.draft_cache, self.spec, self.draft_vocab, vocab_size

    def compile(self) -> None:
        """The target's forwards as CUDA graphs (`TargetRunner.compile`); the drafter's steps,
        greedy rounds and greedy rounds run ahead (`RoundsAhead`) too where its Triton kernels
        run (`target_kernels` / `draft_kernels` say); a DFlash drafter's rounds as graph
        replays (`dflash_graph.GraphedBlock`, torch ops)."""
        self.target_kernels = self.runner.compile()
        if isinstance(self.draft, DFlashDraft):
            self.proposer.graphs = GraphedBlock(self.proposer, block_buckets(self.spec.num_steps))
            self.draft_kernels = "torch, CUDA graphs (a DFlash block drafter)"
        if self.draft is None or isinstance(self.draft, DFlashDraft):
            return
        reason, spec, proposer = self.fast_draft.use_triton(), self.spec, self.proposer
        proposer.use_kernels()
        if reason is None:
            keys = draft_graph_keys(spec.num_steps, spec.topk)
            proposer.run_draft = GraphedDraft(self.fast_draft, self.draft_cache, keys)
            tree_inputs = (
                self.runner.verify_inputs(spec.num_draft_tokens) if spec.topk > 1 else None
            )
            proposer.rounds = GraphedRound(*self.draft_parts(), tree_inputs)
            if padded_rows(spec) <= fused_decode.MAX_TOKENS:  # a padded round's first drafter step
                self.rounds_ahead = RoundsAhead(
                    proposer.rounds, self.target, self.aux_layers, self.max_seq_len
                )
        self.draft_kernels = "triton" if reason is None else f"torch, eager ({reason})"

    # ---- public -------------------------------------------------------------------------------
    @torch.inference_mode()
    def generate(
        self,
        prompt_ids: Sequence[int],
        max_new_tokens: int,
        temperature: float = 0.0,
        top_p: float = 1.0,
        top_k: int = 0,
        eos_ids: Sequence[int] = (),
        stop: Sequence[str] | None = None,
        seed: int | None = None,
        on_tokens: TokenCallback | None = None,
    ) -> GenerationResult:
        """Generate up to max_new_tokens after prompt_ids (target vocabulary ids).

        temperature 0 = greedy (output = the target's greedy output); > 0 samples losslessly
        from the target's distribution after temperature / top_k / top_p. Stops at an id in
        eos_ids or when the decoded output contains a string of `stop` (needs a tokenizer).
        seed: the sampling generator's seed (None = random). on_tokens: called with each batch
        of newly emitted ids. Raises ValueError for an empty prompt, max_new_tokens < 1, stop
        strings without tokenizer, or a length beyond the caches / max positions (with numbers).
        """
        req = self.new_request(
            list(prompt_ids),
            max_new_tokens,
            SamplingParams(temperature, top_p, top_k),
            eos_ids,
            stop,
            seed,
            on_tokens,
        )
        start = time.perf_counter()
        req.emit([self.prefill(req)])
        if self.draft is None and self.runner.graphed is not None and req.finish_reason is None:
            self.runner.graphed.decode_ahead(req, self.max_seq_len)
        if self.rounds_ahead is not None and req.greedy and req.finish_reason is None:
            # the prompt's pending positions: more than a round from device state holds
            speculative_round(req, self.proposer, self.runner)
            if req.finish_reason is None:
                self.rounds_ahead.run(req)
        while req.finish_reason is None:
            speculative_round(req, self.proposer, self.runner)
        result = req.finish(start)
        self.total = self.total.merge(result.metrics)
        return result

    def new_request(
        self,
        prompt_ids: list[int],
        max_new_tokens: int,
        params: SamplingParams,
        eos_ids: Sequence[int],
        stop: Sequence[str] | None,
        seed: int | None,
        on_tokens: TokenCallback | None,
    ) -> Request:
        """Validate a request and build its state (checks lengths before any compute)."""
        check_request(prompt_ids, max_new_tokens, stop, self.tokenizer)
        self.check_limits(len(prompt_ids), max_new_tokens)
        num_steps = self.spec.num_steps if self.spec else 0
        metrics = SpecMetrics(
            num_requests=1, num_prompt_tokens=len(prompt_ids), accepted_per_position=[0] * num_steps
        )
        generator = sampling_generator(params, seed, self.device)
        eos, stops = frozenset(eos_ids), tuple(stop or ())
        return Request(
            prompt_ids,
            params,
            max_new_tokens,
            eos,
            stops,
            generator,
            on_tokens,
            metrics,
            self.tokenizer,
        )

    def context_limits(self) -> list[tuple[str, int]]:
        """Each limit on a request's length as (what sets it, the longest prompt + max_new_tokens
        it allows): the target's and the drafter's max positions, and the cache's max_seq_len
        (a round writes no node past it: `round.free_nodes`)."""
        limits = [
            (
                f"the target's max_position_embeddings {self.target.args.max_position_embeddings}",
                self.target.args.max_position_embeddings,
            )
        ]
        if self.draft is not None:
            limits.append(
                (
                    f"the drafter's max_position_embeddings {self.draft.cfg.max_position_embeddings}",
                    self.draft.cfg.max_position_embeddings,
                )
            )
        limits.append((f"the engine's max_seq_len {self.max_seq_len}", self.max_seq_len))
        return limits

    def longest_request(self) -> int:
        """The longest prompt + max_new_tokens this engine takes: the tightest `context_limits`
        (the server's max_model_len: the model's max positions when the cache is that long, as
        vLLM reports them)."""
        return min(limit for _, limit in self.context_limits())

    def check_limits(self, num_prompt_tokens: int, max_new_tokens: int) -> None:
        """Raise ValueError, with the numbers, when prompt + max_new_tokens exceeds
        `longest_request`; the advice names only what can be done (a max_seq_len within the
        target's max positions, plain decoding where the drafter's positions bind)."""
        total, longest = num_prompt_tokens + max_new_tokens, self.longest_request()
        if total <= longest:
            return
        limits = self.context_limits()
        name = next(name for name, limit in limits if limit == longest)
        if num_prompt_tokens < longest:
            advice = f"ask for at most {longest - num_prompt_tokens} new tokens"
        elif max_new_tokens < longest:
            advice = f"shorten the prompt to at most {longest - max_new_tokens} tokens"
        else:
            advice = f"shorten the prompt and ask for fewer new tokens (together at most {longest})"
        if name.startswith("the drafter"):
            advice += ", or decode without the drafter (its positions then do not bind)"
        elif all(total <= limit for _, limit in limits[:-1]):
            advice += f", or build the engine with max_seq_len >= {total}"
        raise EngineError(
            f"prompt {num_prompt_tokens} + max_new_tokens {max_new_tokens} = {total} tokens "
            f"exceeds {name}: {advice}"
        )

    def prefill(self, req: Request) -> int:
        """Run the prompt through the target; return the first generated token."""
        return prefill_request(req, self.proposer, self.runner, self.device)


def check_pairing(
    target: FastTarget,
    draft: Eagle3Draft | DFlashDraft,
    aux_layers: tuple[int, ...],
    spec: SpecConfig,
) -> None:
    """Raise ValueError naming the mismatch when `draft` was not built for `target` / `aux_layers`
    or cannot run `spec` (a DFlash drafter: `dflash_block.block_problems`)."""
    cfg, args = draft.cfg, target.args
    problems = []
    if cfg.target_hidden_size != args.hidden_size:
        problems.append(
            f"drafter target_hidden_size {cfg.target_hidden_size} != target hidden_size "
            f"{args.hidden_size}"
        )
    if cfg.vocab_size != args.vocab_size:
        problems.append(
            f"drafter vocab_size {cfg.vocab_size} != target vocab_size {args.vocab_size}"
        )
    if cfg.target_num_layers != args.num_layers:
        problems.append(
            f"drafter target_num_layers {cfg.target_num_layers} != target num_layers "
            f"{args.num_layers}"
        )
    if tuple(aux_layers) != tuple(cfg.aux_layers):
        problems.append(
            f"aux layers {list(aux_layers)} != the drafter's training layers {list(cfg.aux_layers)}"
        )
    if isinstance(draft, DFlashDraft):
        problems += block_problems(draft, spec)
    elif spec.topk > cfg.draft_vocab_size:
        problems.append(f"topk {spec.topk} > draft vocabulary {cfg.draft_vocab_size}")
    if isinstance(draft, Eagle3Draft) and not draft.embedding_loaded:
        problems.append(
            "the drafter's shared embedding is not loaded (call "
            "draft.load_target_embedding(target.tok_embeddings.weight))"
        )
    if problems:
        raise EngineError("drafter does not fit the target: " + "; ".join(problems))
