"""Speculative decoding, batch 1: prefill, draft, verify, accept, commit (gpt-fast style loop).

One round (`SpeculativeEngine.step`):
1. draft (`FastDraft`: the drafter's weights packed for this loop; with compile=True its Triton
   steps as CUDA graphs, `GraphedDraft`, and a greedy expansion's whole round as one graph,
   `GraphedRound`): the drafter's first step
   extends its cache over the positions the target accepted last round, from the target's aux
   states there (position t gets token t+1; the last one gets the bonus token), then
   num_steps - 1 steps feed back its own hidden state and grow the tree (`tree.TreeExpansion`);
   a graphed tree round also selects the tree and writes the verify's inputs on the device;
2. verify: ONE target forward over the root + drafts with a tree mask and depth positions
   (`TargetRunner.forward`, eager or a CUDA-graph replay);
3. accept: `sampling.verify_*` picks the accepted path and the bonus token;
4. commit: the accepted path's target K/V move to contiguous slots (`compact_cache`, unless the
   path is contiguous already, as a chain's always is), the aux states of the accepted
   positions wait for the next round's first draft step.
`draft=None` or `spec=None` runs plain decoding through the same loop (the baseline); on a
graphed target with the host one step ahead of the GPU (`GraphedTarget.decode_ahead`). Greedy
requests on a compiled engine, chains and trees, run one round ahead after the first round
(`rounds_ahead.RoundsAhead`: the verdict, a tree's cache compaction and the next round's state
taken on the device).
The request (output, stop strings, text) is a `requests.Request`; loading a target and a
drafter from disk is `load.load_engine`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor
from torch.nn.attention import SDPBackend, sdpa_kernel

from specdraft.draft import Eagle3Draft
from specdraft.engine import sampling
from specdraft.engine.draft_cache import DraftCache
from specdraft.engine.draft_round import GraphedRound
from specdraft.engine.errors import EngineError
from specdraft.engine.fast_draft import FastDraft, GraphedDraft, draft_graph_keys
from specdraft.engine.fast_model import FastTarget, causal_mask
from specdraft.engine.graphs import GraphedTarget
from specdraft.engine.kernels import fused_decode
from specdraft.engine.metrics import SpecMetrics
from specdraft.engine.requests import GenerationResult, Request, TokenCallback, check_request
from specdraft.engine.rounds_ahead import RoundsAhead, padded_rows
from specdraft.engine.sampling import SamplingParams, Verdict, logits_to_probs, sample
from specdraft.engine.spec_config import SpecConfig
from specdraft.engine.tree import (
    DraftTree,
    SelectedTree,
    TreeExpansion,
    depths_of,
    tree_of,
    verify_mask,
)

# Attention kernels for the drafter. Not cuDNN: it builds an execution plan for every new
# shape, and the drafter's past grows every round (benchmarks/RESULTS.md). The target
# keeps every kernel: its decode / verify shapes are static, and cuDNN is the fastest there.
DRAFT_SDPA_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


class SpeculativeEngine:
    """Batch-1 EAGLE-3 speculative decoding over a FastTarget (plain decoding without a draft).

    target: FastTarget (its cache is (re)allocated here for max_seq_len). draft: Eagle3Draft
    with its embedding loaded, or None. spec: SpecConfig, or None for plain decoding.
    aux_layers: the target layers the drafter reads (specdraft indices); None = the drafter's.
    max_seq_len: cache size = prompt + max_new_tokens + num_draft_tokens at most.
    tokenizer: anything with decode(list[int]) -> str; needed for stop strings and text.
    compile (CUDA only): compile each target layer (torch.compile, in place), run decode and
    verify forwards of up to 64 tokens through the Triton kernels of `kernels.fused_decode`
    where the target allows (`target_kernels` says which path runs, and why), and replay them
    as CUDA graphs (`TargetRunner.compile`); run the drafter's steps of up to 64 positions
    through the Triton kernels too, replayed as CUDA graphs (`GraphedDraft`; `draft_kernels`
    says which path runs), and greedy requests one round ahead of the host (`RoundsAhead`).
    Otherwise the drafter runs eagerly.
    Raises ValueError when the drafter does not fit the target (hidden size, vocab, layers,
    aux layers) or topk exceeds the draft vocabulary.
    """

    def __init__(
        self,
        target: FastTarget,
        draft: Eagle3Draft | None,
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
        self.runner = TargetRunner(
            target, self.aux_layers, max_seq_len, self.device
        )  # allocates the cache
        if self.draft is not None:
            self.setup_draft()
        self.run_round: GraphedRound | None = None  # greedy rounds as one graph (compile=True)
        self.rounds_ahead: RoundsAhead | None = None  # greedy rounds one round ahead (compile=True)
        # a graphed round's GPU time (it runs behind the host: read once the verdict is read)
        self.round_events = (
            (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            if self.device.type == "cuda"
            else None
        )
        self.round_timed = False
        self.target_kernels = self.draft_kernels = "torch"
        self.target_path = (
            "fast"  # or "transformers" (`hf_target.HFTarget`, set by `load.load_engine`)
        )
        if compile and self.device.type == "cuda":
            self.compile()

    def setup_draft(self) -> None:
        """Check the pairing, then build the drafter's cache, vocabulary map and packed steps."""
        draft, spec = self.draft, self.spec
        check_pairing(self.target, draft, self.aux_layers, spec)
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
        self.run_draft: FastDraft | GraphedDraft = self.fast_draft

    def compile(self) -> None:
        """The target's forwards as CUDA graphs (`TargetRunner.compile`); the drafter's steps,
        greedy rounds and greedy rounds run ahead (`RoundsAhead`) too where its Triton kernels
        run (`target_kernels` / `draft_kernels` say)."""
        self.target_kernels = self.runner.compile()
        if self.draft is None:
            return
        reason, spec = self.fast_draft.use_triton(), self.spec
        if reason is None:
            self.run_draft = GraphedDraft(
                self.fast_draft, self.draft_cache, draft_graph_keys(spec.num_steps, spec.topk)
            )
            self.run_round = GraphedRound(
                self.fast_draft,
                self.draft_cache,
                spec,
                self.draft_vocab,
                self.target.args.vocab_size,
                self.verify_inputs() if spec.topk > 1 else None,
            )
            if padded_rows(spec) <= fused_decode.MAX_TOKENS:  # a padded round's first drafter step
                self.rounds_ahead = RoundsAhead(
                    self.run_round, self.target, self.aux_layers, self.max_seq_len
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
        if self.rounds_ahead is not None and req.params.greedy and req.finish_reason is None:
            self.step(
                req
            )  # the prompt's pending positions: more than a round from device state holds
            if req.finish_reason is None:
                self.rounds_ahead.run(req)
        while req.finish_reason is None:
            self.step(req)
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
        return Request.new(
            prompt_ids,
            max_new_tokens,
            params,
            eos_ids,
            stop,
            seed,
            on_tokens,
            self.tokenizer,
            self.device,
            self.spec.num_steps if self.spec else 0,
        )

    def context_limits(self) -> list[tuple[str, int]]:
        """Each limit on a request's length as (what sets it, the longest prompt + max_new_tokens
        it allows): the target's and the drafter's max positions, and the cache, which also holds
        one round's verified nodes (max_seq_len - num_draft_tokens; 1 without a drafter)."""
        tree = self.spec.num_draft_tokens if self.spec else 1
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
        limits.append(
            (
                f"the engine's max_seq_len {self.max_seq_len} less {tree} verified "
                f"node{'s' if tree > 1 else ''}"
                f" ({self.max_seq_len - tree})",
                self.max_seq_len - tree,
            )
        )
        return limits

    def longest_request(self) -> int:
        """The longest prompt + max_new_tokens this engine takes: the tightest `context_limits`
        (the server's max_model_len)."""
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
        needed = total + (
            self.spec.num_draft_tokens if self.spec else 1
        )  # the cache this request needs
        if name.startswith("the drafter"):
            advice += ", or decode without the drafter (its positions then do not bind)"
        elif all(total <= limit for _, limit in limits[:-1]) and needed <= limits[0][1]:
            advice += f", or build the engine with max_seq_len >= {needed}"
        raise EngineError(
            f"prompt {num_prompt_tokens} + max_new_tokens {max_new_tokens} = {total} tokens "
            f"exceeds {name}: {advice}"
        )

    # ---- the loop -----------------------------------------------------------------------------
    def step(self, req: Request) -> None:
        """One speculative round: draft a tree, verify it in one target forward, accept, commit."""
        t0 = time.perf_counter()
        tree = (
            self.draft_tree(req)
            if self.draft is not None
            else DraftTree.root_only(req.output_ids[-1])
        )
        t1 = time.perf_counter()
        tree, tokens, verdict, aux = self.verify(req, tree)
        emitted = [tokens[node] for node in verdict.accepted] + [verdict.bonus]
        self.commit(req, verdict, emitted, aux)
        t2 = time.perf_counter()
        drafting = 0.0  # a graphed round's GPU time, spent while the host went on to the verify
        if self.round_timed:
            start, end = self.round_events
            drafting, self.round_timed = min(t2 - t1, start.elapsed_time(end) / 1e3), False
        if (
            self.draft is not None
        ):  # plain decoding's root-only tree is bookkeeping ("other"), not drafting
            req.metrics.time_draft_s += t1 - t0 + drafting
        req.metrics.time_verify_s += t2 - t1 - drafting
        req.metrics.record_step(tree.num_nodes - 1, len(verdict.accepted))
        req.emit(emitted)

    def verify(
        self, req: Request, tree: DraftTree | SelectedTree
    ) -> tuple[DraftTree, list[int], Verdict, Tensor | None]:
        """ONE target forward over the tree (root + drafts, tree mask, depth positions), then
        `accept`: (the tree, its tokens as a list, the verdict, aux states [N, n_aux*H] or None)."""
        if isinstance(tree, SelectedTree):  # the verify's inputs are on the device already
            logits, aux = self.runner.forward_in_place(self.verify_inputs())
            tree, tokens, verdict = self.read_selected(req, tree, logits)
            return tree, tokens, verdict, aux
        mask = verify_mask(tree, req.length, self.runner.mask_width(req.length + tree.num_nodes))
        logits, aux = self.runner.forward(
            tree.tokens, req.length + torch.tensor(tree.depths), req.length, mask, graphed=True
        )
        tokens = tree.tokens.tolist()
        return tree, tokens, self.accept(req, tree, tokens, logits), aux

    def prefill(self, req: Request) -> int:
        """Run the prompt through the target; return the first generated token."""
        t0 = time.perf_counter()
        self.runner.reserve()  # the target's cache may have been rebuilt by another user
        n = len(req.prompt_ids)
        ids = torch.tensor(req.prompt_ids, device=self.device)
        logits, aux = self.runner.forward(
            ids,
            torch.arange(n, device=self.device),
            0,
            causal_mask(0, n, self.runner.mask_width(n), device=self.device),
        )
        token = int(sample(logits_to_probs(logits[-1], req.params), req.generator))
        req.length = n
        if self.draft is not None:
            self.draft_cache.rollback(0)
            req.pending_ids = torch.cat([ids[1:], ids.new_tensor([token])])
            req.pending_aux = aux.to(self.fast_draft.fc.dtype)
        req.metrics.time_prefill_s += time.perf_counter() - t0
        return token

    def draft_tree(self, req: Request) -> DraftTree | SelectedTree:
        """The drafter's first step over the pending positions, then num_steps - 1 tree steps
        (compiled: a greedy expansion in one graph replay, `GraphedRound`)."""
        sampled = self.spec.is_chain and not req.params.greedy
        # graphed: the tokens go straight into the verify graph's input (no copy before its replay)
        out = self.runner.device_input_ids(self.spec.num_draft_tokens)
        out = None if out is None else out[0]
        if self.run_round is not None and not sampled:
            tree = self.draft_round(req, out)
            if tree is not None:
                return tree
        return self.draft_steps(req, sampled, out)

    def draft_round(self, req: Request, out: Tensor | None) -> DraftTree | SelectedTree | None:
        """A greedy round as one graph replay (`GraphedRound`): a chain's tree, a tree selected
        on the device, or None when no graph holds this many pending positions."""
        cache, spec, m = self.draft_cache, self.spec, req.pending_ids.numel()
        if spec.topk > 1:
            self.verify_inputs()  # the verify graph before the round writes its inputs (a capture overwrites them)
        if self.round_events is not None:
            self.round_events[0].record()
        candidates = self.run_round(req.pending_ids, req.pending_aux, cache.length)
        if candidates is None:
            return None
        if self.round_events is not None:
            self.round_events[1].record()
            self.round_timed = True
        cache.commit(m)
        if spec.topk > 1:  # its tree's positions start at the draft cache's committed entries
            if cache.length != req.length:
                raise RuntimeError(
                    f"draft cache holds {cache.length} entries, the target {req.length}: "
                    "a graphed tree round would verify at wrong positions"
                )
            return SelectedTree(*candidates)
        return tree_of(*candidates, None, None, spec.num_draft_tokens, out)

    def draft_steps(self, req: Request, sampled: bool, out: Tensor | None) -> DraftTree:
        """The round step by step: the first step over the m pending positions, then the tree
        steps, each expanding the frontier (`TreeExpansion`); sampled: a chain drawn at T > 0."""
        draft, cache, spec = self.run_draft, self.draft_cache, self.spec
        start, m = cache.length, req.pending_ids.numel()
        expansion = TreeExpansion(
            req.output_ids[-1],
            spec.topk,
            sampled,
            req.params,
            self.draft_vocab,
            self.target.args.vocab_size,
            req.generator,
            kernels=self.fast_draft.triton_kernels,
        )
        with self.draft_attention():
            positions = torch.arange(start, start + m, device=self.device)
            logits, hidden = draft(
                req.pending_ids,
                req.pending_aux,
                positions,
                first_step=True,
                cache=cache,
                start=start,
            )
            cache.commit(m)
            tokens, hidden = expansion.expand(logits[-1:], hidden[-1:], written=False)
            for step in range(
                1, spec.num_steps
            ):  # frontier at depth `step`, RoPE position t + step
                past = cache.length + expansion.num_scratch
                position = torch.full(
                    (tokens.numel(),), cache.length - 1 + step, device=self.device
                )
                logits, hidden = draft(
                    tokens,
                    hidden,
                    position,
                    first_step=False,
                    cache=cache,
                    start=past,
                    attn_mask=expansion.draft_mask(cache.length),
                )
                tokens, hidden = expansion.expand(logits, hidden, written=True)
        return expansion.tree(spec.num_draft_tokens, out=out)

    def read_selected(
        self, req: Request, selected: SelectedTree, logits: Tensor
    ) -> tuple[DraftTree, list[int], Verdict]:
        """The tree a graphed round selected, its tokens and the verdict (`accept`'s rules for a
        tree of top-k children: the target's argmax, or one draw from p per node), from one
        read of the device after the verify. Raises RuntimeError when the selection kept a node
        without its parent (as `tree.select` does)."""
        token_ids = self.verify_inputs()[0][0]
        if req.params.greedy:
            choices = logits.argmax(-1)
        else:
            choices = sample(logits_to_probs(logits, req.params), req.generator)
        n = token_ids.numel()
        packed = torch.cat(
            [token_ids, selected.parents, choices, selected.ok.view(1).long()]
        ).tolist()
        if not packed[-1]:
            raise RuntimeError(
                "draft tree selection kept nodes without their parents: scores are not monotone "
                "along paths"
            )
        tokens, parents, choice = packed[:n], packed[n : 2 * n], packed[2 * n : 3 * n]
        tree = DraftTree(token_ids, parents, depths_of(parents), selected.scores)
        return tree, tokens, sampling.walk(parents, tokens, choice)

    def verify_inputs(self) -> list[Tensor]:
        """The tree verify's device inputs a graphed round writes (`TargetRunner.verify_inputs`)."""
        return self.runner.verify_inputs(self.spec.num_draft_tokens)

    def draft_attention(self) -> contextlib.AbstractContextManager:
        """The drafter's attention kernels (CUDA: not cuDNN, see DRAFT_SDPA_BACKENDS); on the CPU
        nothing to choose, and entering sdpa_kernel costs more than a drafter matmul."""
        return (
            sdpa_kernel(DRAFT_SDPA_BACKENDS)
            if self.device.type == "cuda"
            else contextlib.nullcontext()
        )

    def accept(self, req: Request, tree: DraftTree, tokens: list[int], logits: Tensor) -> Verdict:
        """Apply the acceptance rule that keeps this tree lossless (see `sampling`); tokens =
        tree.tokens as a list."""
        if req.params.greedy:
            return sampling.verify_greedy(tree.parents, tokens, logits)
        probs = logits_to_probs(logits, req.params)
        if tree.draft_probs is not None:
            return sampling.verify_chain(probs, tree.draft_probs, tree.tokens[1:], req.generator)
        return sampling.verify_tree(tree.parents, tokens, probs, req.generator)

    def commit(
        self, req: Request, verdict: Verdict, emitted: list[int], aux: Tensor | None
    ) -> None:
        """Keep the accepted path in the target cache; queue its aux states for the drafter
        (emitted: the accepted tokens and the bonus, which follow the path's positions)."""
        path = [0] + verdict.accepted
        contiguous = (
            path[-1] == len(path) - 1
        )  # a path is increasing: 0..n-1 is the only one ending at n-1
        nodes = None if contiguous else torch.tensor(path, device=self.device)
        if nodes is not None:
            self.target.compact_cache(nodes + req.length, req.length)
        req.length += len(path)
        if self.draft is not None:
            req.pending_ids = torch.tensor(emitted, device=self.device)
            kept = aux[: len(path)] if nodes is None else aux[nodes]
            req.pending_aux = kept.to(self.fast_draft.fc.dtype)


class TargetRunner:
    """The target forwards of one engine: a FastTarget whose cache this runner (re)allocates
    for batch 1 and max_seq_len, with aux_layers (specdraft indices) read on every forward;
    eager until `compile` (CUDA only), then decode and verify forwards replay CUDA graphs
    (`graphs.GraphedTarget`)."""

    def __init__(
        self,
        target: FastTarget,
        aux_layers: tuple[int, ...],
        max_seq_len: int,
        device: torch.device,
    ) -> None:
        self.target, self.aux_layers, self.max_seq_len, self.device = (
            target,
            aux_layers,
            max_seq_len,
            device,
        )
        self.graphed: GraphedTarget | None = None
        # `hf_target.HFTarget` reads the mask and slots on the host: its inputs are not copied
        self.host_inputs = getattr(target, "host_inputs", False)
        self.verify_buffers: list[Tensor] | None = None  # `verify_inputs` of a runner not compiled
        target.setup_cache(1, max_seq_len, device=device)

    def compile(self) -> str:
        """Compile each target layer (torch.compile, in place), run forwards of up to 64 tokens
        through the Triton kernels where the target allows, and replay decode / verify forwards
        as CUDA graphs from now on. Returns which kernels run: "triton", or "torch (why not)"."""
        for layer in self.target.layers:
            layer.compile()
        self.graphed = GraphedTarget(self.target, self.aux_layers)
        reason = self.target.use_triton()
        return "triton" if reason is None else f"torch ({reason})"

    def reserve(self) -> None:
        """Rebuild the target's cache for this runner when another user (another engine on the
        same target) reallocated it."""
        if (self.target.max_batch_size, self.target.max_seq_len) != (1, self.max_seq_len):
            self.target.setup_cache(1, self.max_seq_len, device=self.device)

    def mask_width(self, num_slots: int) -> int:
        """Columns of a target mask whose tokens use cache slots 0..num_slots-1: just those (the
        target attends over no more), or max_seq_len when compiled (static shapes for the
        compiled layers and CUDA graphs)."""
        return self.max_seq_len if self.graphed is not None else num_slots

    def forward(
        self, tokens: Tensor, positions: Tensor, start: int, mask: Tensor, graphed: bool = False
    ) -> tuple[Tensor, Tensor | None]:
        """Target forward of T tokens written at slots start..start+T-1: logits [T, V] float32,
        aux states [T, n_aux*H] (None in plain decoding). tokens [T], positions [T] long and
        mask [1, 1, T, S] bool on the CPU or the engine device. graphed: replay a CUDA graph
        after `compile` (decode and verify: few distinct T); its inputs on the CPU are staged in
        one copy."""
        slots = torch.arange(start, start + tokens.numel())
        inputs = (tokens[None], positions[None], slots, mask)
        if graphed and self.graphed is not None:
            out = self.graphed(*inputs, self.aux_layers)
        elif self.host_inputs:
            out = self.target(*inputs, self.aux_layers)
        else:
            out = self.target(*(x.to(self.device) for x in inputs), self.aux_layers)
        return out.logits[0], None if out.aux_hidden is None else out.aux_hidden[0]

    def verify_inputs(self, n: int) -> list[Tensor]:
        """A tree verify's inputs as device tensors that a graphed round writes in place
        (`GraphedRound`): input_ids [1, N], position_ids [1, N], cache_slots [N] long, attn_mask
        [1, 1, N, max_seq_len] bool (N = n, the num_draft_tokens). Compiled: the verify graph's
        own (`GraphedTarget.device_inputs`: captured on first use and again after the target's
        cache was rebuilt, at the same addresses); else buffers of this runner (tests)."""
        if self.graphed is not None:
            return self.graphed.device_inputs(n, self.max_seq_len)
        if self.verify_buffers is None:
            self.verify_buffers = [
                torch.zeros(shape, dtype=dtype, device=self.device)
                for shape, dtype in (
                    ((1, n), torch.long),
                    ((1, n), torch.long),
                    ((n,), torch.long),
                    ((1, 1, n, self.max_seq_len), torch.bool),
                )
            ]
        return self.verify_buffers

    def forward_in_place(self, inputs: Sequence[Tensor]) -> tuple[Tensor, Tensor | None]:
        """`forward` of inputs already on the device (`verify_inputs`): logits [N, V],
        aux states [N, n_aux*H]; a graphed target replays with no copy."""
        out = (self.graphed if self.graphed is not None else self.target)(*inputs, self.aux_layers)
        return out.logits[0], None if out.aux_hidden is None else out.aux_hidden[0]

    def device_input_ids(self, n: int) -> Tensor | None:
        """The compiled verify graph's input_ids [1, n] on the device, which the drafter writes
        its tree into (`GraphedTarget.device_input_ids`), or None when not compiled."""
        return None if self.graphed is None else self.graphed.device_input_ids(n, self.max_seq_len)


def check_pairing(
    target: FastTarget, draft: Eagle3Draft, aux_layers: tuple[int, ...], spec: SpecConfig
) -> None:
    """Raise ValueError naming the mismatch when `draft` was not built for `target` / `aux_layers`."""
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
    if spec.topk > cfg.draft_vocab_size:
        problems.append(f"topk {spec.topk} > draft vocabulary {cfg.draft_vocab_size}")
    if not draft.embedding_loaded:
        problems.append(
            "the drafter's shared embedding is not loaded (call "
            "draft.load_target_embedding(target.tok_embeddings.weight))"
        )
    if problems:
        raise EngineError("drafter does not fit the target: " + "; ".join(problems))
