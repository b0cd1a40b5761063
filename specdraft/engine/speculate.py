"""Speculative decoding, batch 1: prefill, draft, verify, accept, commit (gpt-fast style loop).

One round (`SpeculativeEngine.step`):
1. draft (`FastDraft`: the drafter's weights packed for this loop; with compile=True its Triton
   steps as CUDA graphs, `GraphedDraft`, and a greedy expansion's whole round as one graph,
   `GraphedRound`): the drafter's first step
   extends its cache over the positions the target accepted last round, from the target's aux
   states there (position t gets token t+1; the last one gets the bonus token), then
   num_steps - 1 steps feed back its own hidden state and grow the tree (`tree.TreeExpansion`);
   a graphed tree round also selects the tree and writes the verify's inputs on the device;
2. verify: ONE target forward over the root + drafts with a tree mask and depth positions;
3. accept: `sampling.verify_*` picks the accepted path and the bonus token;
4. commit: the accepted path's target K/V move to contiguous slots (`compact_cache`, unless the
   path is contiguous already, as a chain's always is), the aux states of the accepted
   positions wait for the next round's first draft step.
`draft=None` or `spec=None` runs plain decoding through the same loop (the baseline); on a
graphed target with the host one step ahead of the GPU (`SpeculativeEngine.decode_ahead`).
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from torch import Tensor
from torch.nn.attention import SDPBackend, sdpa_kernel

from specdraft.draft import Eagle3Draft
from specdraft.engine import fused_decode, sampling
from specdraft.engine.draft_cache import DraftCache
from specdraft.engine.draft_round import GraphedRound
from specdraft.engine.fast_draft import FastDraft, GraphedDraft, draft_graph_keys
from specdraft.engine.fast_model import FastTarget, causal_mask, load_fast_target
from specdraft.engine.metrics import SpecMetrics
from specdraft.engine.sampling import SamplingParams, Verdict, logits_to_probs, sample
from specdraft.engine.spec_config import SpecConfig
from specdraft.engine.tree import DraftTree, SelectedTree, TreeExpansion, depths_of, tree_of, verify_mask

TokenCallback = Callable[[list[int]], None]
# Attention kernels for the drafter. Not cuDNN: it builds an execution plan for every new
# shape, and the drafter's past grows every round (H200, torch 2.11: ~13 ms per draft forward
# instead of ~0.5 ms). The target keeps every kernel: its decode / verify shapes are static,
# and cuDNN is the fastest there (10 us vs 50 us per layer for memory-efficient attention).
DRAFT_SDPA_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


@dataclass
class GenerationResult:
    """token_ids: generated ids (EOS / the token completing a stop string included); text: their
    decoding, cut before a stop string (None without tokenizer); finish_reason: "length",
    "eos" or "stop"; metrics: this request's SpecMetrics."""

    token_ids: list[int]
    text: str | None
    finish_reason: str
    metrics: SpecMetrics


@dataclass
class Request:
    """State of one generation: sampling settings, output so far, cache lengths."""

    prompt_ids: list[int]
    params: SamplingParams
    max_new_tokens: int
    eos_ids: frozenset[int]
    stop: tuple[str, ...]
    generator: torch.Generator | None
    on_tokens: TokenCallback | None
    metrics: SpecMetrics
    output_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    length: int = 0  # target cache entries = position of the root (last emitted token)
    pending_ids: Tensor | None = None  # [m] tokens following the m positions not yet drafted
    pending_aux: Tensor | None = None  # [m, n_aux*H] the target's aux states at those positions


class SpeculativeEngine:
    """Batch-1 EAGLE-3 speculative decoding over a FastTarget (plain decoding without a draft).

    target: FastTarget (its cache is (re)allocated here for max_seq_len). draft: Eagle3Draft
    with its embedding loaded, or None. spec: SpecConfig, or None for plain decoding.
    aux_layers: the target layers the drafter reads (specdraft indices); None = the drafter's.
    max_seq_len: cache size = prompt + max_new_tokens + num_draft_tokens at most.
    tokenizer: anything with decode(list[int]) -> str; needed for stop strings and text.
    compile (CUDA only): compile each target layer (torch.compile, in place), run decode and
    verify forwards of up to 16 tokens through the Triton kernels of `fused_decode` where the
    target allows (`target_kernels` says which path runs, and why), and replay them as CUDA
    graphs (`GraphedTarget`); run the drafter's steps of up to 16 positions through the Triton
    kernels too, replayed as CUDA graphs (`GraphedDraft`; `draft_kernels` says which path runs).
    Otherwise the drafter runs eagerly.
    Raises ValueError when the drafter does not fit the target (hidden size, vocab, layers,
    aux layers) or topk exceeds the draft vocabulary.
    """

    def __init__(self, target: FastTarget, draft: Eagle3Draft | None, spec: SpecConfig | None,
                 aux_layers: Sequence[int] | None, max_seq_len: int, device: torch.device | str,
                 tokenizer: Any = None, compile: bool = False) -> None:
        self.target, self.device, self.tokenizer = target, torch.device(device), tokenizer
        self.draft = draft if spec is not None else None
        self.spec = spec if draft is not None else None
        self.max_seq_len = max_seq_len
        self.aux_layers: tuple[int, ...] = ()
        self.total = SpecMetrics()
        self.notes: list[str] = []  # what a user should know about the pairing (`load_engine`)
        target.setup_cache(1, max_seq_len, device=self.device)
        if self.draft is not None:
            self.aux_layers = tuple(aux_layers if aux_layers is not None else draft.cfg.aux_layers)
            check_pairing(target, draft, self.aux_layers, self.spec)
            cfg = draft.cfg
            scratch = (self.spec.num_steps - 1) * self.spec.topk
            # + MAX_TOKENS entries no request reaches: GraphedDraft's captures write there
            self.draft_cache = DraftCache(cfg.num_key_value_heads, cfg.head_dim,
                                          max_seq_len + scratch + fused_decode.MAX_TOKENS, draft.fc.weight.dtype,
                                          self.device)
            self.draft_vocab = draft.draft_to_target(torch.arange(cfg.draft_vocab_size, device=self.device))
            self.fast_draft = FastDraft(draft)
            self.run_draft: FastDraft | GraphedDraft = self.fast_draft
        self.run_round: GraphedRound | None = None  # greedy rounds as one graph (compile=True)
        self.graphed: GraphedTarget | None = None
        self.verify_buffers: list[Tensor] | None = None  # `verify_inputs` of an engine not compiled
        # a graphed round's GPU time (it runs behind the host: read once the verdict is read)
        self.round_events = ((torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                             if self.device.type == "cuda" else None)
        self.round_timed = False
        self.target_kernels = self.draft_kernels = "torch"
        if compile and self.device.type == "cuda":
            for layer in target.layers:
                layer.compile()
            self.graphed = GraphedTarget(target, self.aux_layers)
            reason = target.use_triton()
            self.target_kernels = "triton" if reason is None else f"torch ({reason})"
            if self.draft is not None:
                reason = self.fast_draft.use_triton()
                if reason is None:
                    self.run_draft = GraphedDraft(self.fast_draft, self.draft_cache,
                                                  draft_graph_keys(self.spec.num_steps, self.spec.topk))
                    self.run_round = GraphedRound(self.fast_draft, self.draft_cache, self.spec, self.draft_vocab,
                                                  target.args.vocab_size,
                                                  self.verify_inputs() if self.spec.topk > 1 else None)
                self.draft_kernels = "triton" if reason is None else f"torch, eager ({reason})"

    # ---- public -------------------------------------------------------------------------------
    @torch.inference_mode()
    def generate(self, prompt_ids: Sequence[int], max_new_tokens: int, temperature: float = 0.0,
                 top_p: float = 1.0, top_k: int = 0, eos_ids: Sequence[int] = (),
                 stop: Sequence[str] | None = None, seed: int | None = None,
                 on_tokens: TokenCallback | None = None) -> GenerationResult:
        """Generate up to max_new_tokens after prompt_ids (target vocabulary ids).

        temperature 0 = greedy (output = the target's greedy output); > 0 samples losslessly
        from the target's distribution after temperature / top_k / top_p. Stops at an id in
        eos_ids or when the decoded output contains a string of `stop` (needs a tokenizer).
        seed: the sampling generator's seed (None = random). on_tokens: called with each batch
        of newly emitted ids. Raises ValueError for an empty prompt, max_new_tokens < 1, stop
        strings without tokenizer, or a length beyond the caches / max positions (with numbers).
        """
        req = self.new_request(list(prompt_ids), max_new_tokens, SamplingParams(temperature, top_p, top_k),
                               eos_ids, stop, seed, on_tokens)
        start = time.perf_counter()
        self.emit(req, [self.prefill(req)])
        if self.draft is None and self.graphed is not None and req.finish_reason is None:
            self.decode_ahead(req)
        while req.finish_reason is None:
            self.step(req)
        m = req.metrics
        m.time_other_s = max(0.0, time.perf_counter() - start - m.time_prefill_s - m.time_draft_s
                             - m.time_verify_s)
        m.num_output_tokens = len(req.output_ids)
        m.check()
        self.total = self.total.merge(m)
        return GenerationResult(req.output_ids, self.text_of(req), req.finish_reason, m)

    def check_limits(self, num_prompt_tokens: int, max_new_tokens: int) -> None:
        """Raise ValueError, with the numbers, when prompt + max_new_tokens exceeds the target's
        or the drafter's max positions, or the cache (which also holds one round's tree)."""
        total = num_prompt_tokens + max_new_tokens
        limits = [("the target's max_position_embeddings", self.target.args.max_position_embeddings)]
        if self.draft is not None:
            limits.append(("the drafter's max_position_embeddings", self.draft.cfg.max_position_embeddings))
        for name, limit in limits:
            if total > limit:
                raise ValueError(f"prompt {num_prompt_tokens} + max_new_tokens {max_new_tokens} = {total} "
                                 f"tokens exceeds {name} {limit}")
        tree = self.spec.num_draft_tokens if self.spec else 1
        if total + tree > self.max_seq_len:
            raise ValueError(f"prompt {num_prompt_tokens} + max_new_tokens {max_new_tokens} + "
                             f"{tree} verified nodes = {total + tree} exceeds the engine's max_seq_len "
                             f"{self.max_seq_len}: shorten the request or build the engine with "
                             f"max_seq_len >= {total + tree}")

    # ---- the loop -----------------------------------------------------------------------------
    def step(self, req: Request) -> None:
        """One speculative round: draft a tree, verify it in one target forward, commit."""
        t0 = time.perf_counter()
        tree = self.draft_tree(req) if self.draft is not None else DraftTree.root_only(req.output_ids[-1])
        t1 = time.perf_counter()
        if isinstance(tree, SelectedTree):  # the verify's inputs are on the device already
            logits, aux = self.forward_in_place(self.verify_inputs())
            tree, tokens, verdict = self.read_selected(req, tree, logits)
        else:
            mask = verify_mask(tree, req.length, self.mask_width(req.length + tree.num_nodes))
            logits, aux = self.forward_target(tree.tokens, req.length + torch.tensor(tree.depths), req.length,
                                              mask, graphed=True)
            tokens = tree.tokens.tolist()
            verdict = self.accept(req, tree, tokens, logits)
        emitted = [tokens[node] for node in verdict.accepted] + [verdict.bonus]
        self.commit(req, verdict, emitted, aux)
        t2 = time.perf_counter()
        drafting = 0.0  # a graphed round's GPU time, spent while the host went on to the verify
        if self.round_timed:
            start, end = self.round_events
            drafting, self.round_timed = min(t2 - t1, start.elapsed_time(end) / 1e3), False
        if self.draft is not None:  # plain decoding's root-only tree is bookkeeping ("other"), not drafting
            req.metrics.time_draft_s += t1 - t0 + drafting
        req.metrics.time_verify_s += t2 - t1 - drafting
        req.metrics.record_step(tree.num_nodes - 1, len(verdict.accepted))
        self.emit(req, emitted)

    def decode_ahead(self, req: Request) -> None:
        """Plain decoding on a graphed target with the host one step ahead of the GPU, to the end
        of the request: step k + 1 is launched before step k's token is read, its input written
        on the device by step k's argmax (or draw), so the host's staging, launch and bookkeeping
        (0.03-0.3 ms a token on the H200's host) hide behind the GPU's step instead of adding to
        it (gpt-fast never reads a token back before the end; vLLM and SGLang overlap their
        scheduling the same way). Greedy, a step is one graph replay that also feeds the next
        step (`GraphedTarget.greedy_decode`); sampled, the host stages each step's position and
        mask and draws on the device. The step launched past the last token writes one cache
        slot that no request reads (check_limits leaves it free) and is dropped."""
        launch = self.greedy_steps(req) if req.params.greedy else self.sampled_steps(req)
        tokens = torch.empty(2, dtype=torch.long, pin_memory=True)  # the two steps in flight, read back
        ready = [torch.cuda.Event(), torch.cuda.Event()]
        start, in_flight, slot = time.perf_counter(), 0, 0
        while req.finish_reason is None:
            token = launch(req.length + in_flight)  # the cache holds req.length tokens, the step in flight one more
            tokens[slot:slot + 1].copy_(token, non_blocking=True)
            ready[slot].record()
            in_flight, slot = in_flight + 1, 1 - slot
            if in_flight == 2:  # read the older step (in `slot` now) while the newer one runs
                ready[slot].synchronize()
                req.length, in_flight = req.length + 1, 1
                req.metrics.record_step(0, 0)
                self.emit(req, [int(tokens[slot])])
        req.metrics.time_verify_s += time.perf_counter() - start

    def greedy_steps(self, req: Request) -> Callable[[int], Tensor]:
        """`decode_ahead`'s step launcher at T = 0: sets the self-feeding decode graph's inputs to
        the request's last token and position once, then each call replays it (the position
        argument is the graph's own count) and returns its token [1] long on the device."""
        graph, (ids, positions, slots, mask), token = self.graphed.greedy_decode(self.max_seq_len)
        ids.fill_(req.output_ids[-1])
        positions.fill_(req.length)
        slots.fill_(req.length)
        mask.copy_(causal_mask(req.length, 1, self.max_seq_len, device=self.device))

        def launch(position: int) -> Tensor:
            graph.replay()
            return token
        return launch

    def sampled_steps(self, req: Request) -> Callable[[int], Tensor]:
        """`decode_ahead`'s step launcher at T > 0: each call stages the step's position and mask,
        replays the decode graph, draws the token on the device and writes it as the next step's
        input; returns it ([1] long on the device)."""
        ids = self.graphed.device_input_ids(1, self.max_seq_len)  # [1, 1]: the graph reads it in place
        ids.fill_(req.output_ids[-1])
        root = DraftTree.root_only(0)  # a decode step's mask is a root-only tree's

        def launch(position: int) -> Tensor:
            mask = verify_mask(root, position, self.max_seq_len)
            logits, _ = self.forward_target(ids[0], torch.tensor([position]), position, mask, graphed=True)
            token = sample(logits_to_probs(logits[-1:], req.params), req.generator)
            ids.view(-1).copy_(token)  # the next step's input, before that step's replay
            return token
        return launch

    def prefill(self, req: Request) -> int:
        """Run the prompt through the target; return the first generated token."""
        t0 = time.perf_counter()
        if (self.target.max_batch_size, self.target.max_seq_len) != (1, self.max_seq_len):
            self.target.setup_cache(1, self.max_seq_len, device=self.device)  # shared with another user
        n = len(req.prompt_ids)
        ids = torch.tensor(req.prompt_ids, device=self.device)
        logits, aux = self.forward_target(ids, torch.arange(n, device=self.device), 0,
                                          causal_mask(0, n, self.mask_width(n), device=self.device))
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
        draft, cache, spec = self.run_draft, self.draft_cache, self.spec
        start, m = cache.length, req.pending_ids.numel()
        sampled = spec.is_chain and not req.params.greedy
        # graphed: the tokens go straight into the verify graph's input (no copy before its replay)
        out = (None if self.graphed is None else
               self.graphed.device_input_ids(spec.num_draft_tokens, self.max_seq_len)[0])
        candidates = None
        if self.run_round is not None and not sampled:
            if spec.topk > 1:
                self.verify_inputs()  # the verify graph before the round writes its inputs (a capture overwrites them)
            if self.round_events is not None:
                self.round_events[0].record()
            candidates = self.run_round(req.pending_ids, req.pending_aux, start)
            if self.round_events is not None and candidates is not None:
                self.round_events[1].record()
                self.round_timed = True
        if candidates is not None:
            cache.commit(m)
            if spec.topk > 1:  # its tree's positions start at the draft cache's committed entries
                if cache.length != req.length:
                    raise RuntimeError(f"draft cache holds {cache.length} entries, the target {req.length}: "
                                       "a graphed tree round would verify at wrong positions")
                return SelectedTree(*candidates)
            return tree_of(*candidates, None, None, spec.num_draft_tokens, out)
        expansion = TreeExpansion(req.output_ids[-1], spec.topk, sampled, req.params, self.draft_vocab,
                                  self.target.args.vocab_size, req.generator)
        with self.draft_attention():
            positions = torch.arange(start, start + m, device=self.device)
            logits, hidden = draft(req.pending_ids, req.pending_aux, positions, first_step=True, cache=cache,
                                   start=start)
            cache.commit(m)
            tokens, hidden = expansion.expand(logits[-1:], hidden[-1:], written=False)
            for step in range(1, spec.num_steps):  # frontier at depth `step`, RoPE position t + step
                past = cache.length + expansion.num_scratch
                position = torch.full((tokens.numel(),), cache.length - 1 + step, device=self.device)
                logits, hidden = draft(tokens, hidden, position, first_step=False, cache=cache, start=past,
                                       attn_mask=expansion.draft_mask(cache.length))
                tokens, hidden = expansion.expand(logits, hidden, written=True)
        return expansion.tree(spec.num_draft_tokens, out=out)

    def verify_inputs(self) -> list[Tensor]:
        """A tree verify's inputs as device tensors that a graphed round writes in place
        (`GraphedRound`): input_ids [1, N], position_ids [1, N], cache_slots [N] long, attn_mask
        [1, 1, N, max_seq_len] bool (N = num_draft_tokens). Compiled: the verify graph's own
        (`GraphedTarget.device_inputs`: captured on first use and again after the target's cache
        was rebuilt, at the same addresses); else buffers of this engine (tests)."""
        n = self.spec.num_draft_tokens
        if self.graphed is not None:
            return self.graphed.device_inputs(n, self.max_seq_len)
        if self.verify_buffers is None:
            self.verify_buffers = [torch.zeros(shape, dtype=dtype, device=self.device) for shape, dtype in
                                   (((1, n), torch.long), ((1, n), torch.long), ((n,), torch.long),
                                    ((1, 1, n, self.max_seq_len), torch.bool))]
        return self.verify_buffers

    def forward_in_place(self, inputs: Sequence[Tensor]) -> tuple[Tensor, Tensor | None]:
        """`forward_target` of inputs already on the device (`verify_inputs`): logits [N, V],
        aux states [N, n_aux*H]; a graphed target replays with no copy."""
        out = (self.graphed if self.graphed is not None else self.target)(*inputs, self.aux_layers)
        return out.logits[0], None if out.aux_hidden is None else out.aux_hidden[0]

    def read_selected(self, req: Request, selected: SelectedTree,
                      logits: Tensor) -> tuple[DraftTree, list[int], Verdict]:
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
        packed = torch.cat([token_ids, selected.parents, choices, selected.ok.view(1).long()]).tolist()
        if not packed[-1]:
            raise RuntimeError("draft tree selection kept nodes without their parents: scores are not monotone "
                               "along paths")
        tokens, parents, choice = packed[:n], packed[n:2 * n], packed[2 * n:3 * n]
        tree = DraftTree(token_ids, parents, depths_of(parents), selected.scores)
        return tree, tokens, sampling.walk(parents, tokens, choice)

    def draft_attention(self) -> contextlib.AbstractContextManager:
        """The drafter's attention kernels (CUDA: not cuDNN, see DRAFT_SDPA_BACKENDS); on the CPU
        nothing to choose, and entering sdpa_kernel costs more than a drafter matmul."""
        return sdpa_kernel(DRAFT_SDPA_BACKENDS) if self.device.type == "cuda" else contextlib.nullcontext()

    def accept(self, req: Request, tree: DraftTree, tokens: list[int], logits: Tensor) -> Verdict:
        """Apply the acceptance rule that keeps this tree lossless (see `sampling`); tokens =
        tree.tokens as a list."""
        if req.params.greedy:
            return sampling.verify_greedy(tree.parents, tokens, logits)
        probs = logits_to_probs(logits, req.params)
        if tree.draft_probs is not None:
            return sampling.verify_chain(probs, tree.draft_probs, tree.tokens[1:], req.generator)
        return sampling.verify_tree(tree.parents, tokens, probs, req.generator)

    def commit(self, req: Request, verdict: Verdict, emitted: list[int], aux: Tensor | None) -> None:
        """Keep the accepted path in the target cache; queue its aux states for the drafter
        (emitted: the accepted tokens and the bonus, which follow the path's positions)."""
        path = [0] + verdict.accepted
        contiguous = path[-1] == len(path) - 1  # a path is increasing: 0..n-1 is the only one ending at n-1
        if not contiguous:
            self.target.compact_cache(torch.tensor(path, device=self.device) + req.length, req.length)
        req.length += len(path)
        if self.draft is not None:
            req.pending_ids = torch.tensor(emitted, device=self.device)
            kept = aux[:len(path)] if contiguous else aux[torch.tensor(path, device=self.device)]
            req.pending_aux = kept.to(self.fast_draft.fc.dtype)

    def mask_width(self, num_slots: int) -> int:
        """Columns of a target mask whose tokens use cache slots 0..num_slots-1: just those (the
        target attends over no more), or max_seq_len when compiled (static shapes for the
        compiled layers and CUDA graphs)."""
        return self.max_seq_len if self.graphed is not None else num_slots

    def forward_target(self, tokens: Tensor, positions: Tensor, start: int, mask: Tensor,
                       graphed: bool = False) -> tuple[Tensor, Tensor | None]:
        """Target forward of T tokens written at slots start..start+T-1: logits [T, V] float32,
        aux states [T, n_aux*H] (None in plain decoding). tokens [T], positions [T] long and
        mask [1, 1, T, S] bool on the CPU or the engine device. graphed: replay a CUDA graph
        when the engine was built with compile (decode and verify: few distinct T); its inputs
        on the CPU are staged in one copy."""
        slots = torch.arange(start, start + tokens.numel())
        inputs = (tokens[None], positions[None], slots, mask)
        if graphed and self.graphed is not None:
            out = self.graphed(*inputs, self.aux_layers)
        else:
            out = self.target(*(x.to(self.device) for x in inputs), self.aux_layers)
        return out.logits[0], None if out.aux_hidden is None else out.aux_hidden[0]

    # ---- requests and output ------------------------------------------------------------------
    def new_request(self, prompt_ids: list[int], max_new_tokens: int, params: SamplingParams,
                    eos_ids: Sequence[int], stop: Sequence[str] | None, seed: int | None,
                    on_tokens: TokenCallback | None) -> Request:
        """Validate a request and build its state (checks lengths before any compute)."""
        if not prompt_ids:
            raise ValueError("empty prompt: need at least one token id")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens {max_new_tokens}: must be >= 1")
        if stop and self.tokenizer is None:
            raise ValueError("stop strings need a tokenizer: build the engine with tokenizer=...")
        self.check_limits(len(prompt_ids), max_new_tokens)
        generator = None
        if not params.greedy:
            generator = torch.Generator(device=self.device)
            generator.manual_seed(seed) if seed is not None else generator.seed()
        steps = self.spec.num_steps if self.spec else 0
        metrics = SpecMetrics(num_requests=1, num_prompt_tokens=len(prompt_ids),
                              accepted_per_position=[0] * steps)
        return Request(prompt_ids, params, max_new_tokens, frozenset(eos_ids), tuple(stop or ()),
                       generator, on_tokens, metrics)

    def emit(self, req: Request, tokens: list[int]) -> None:
        """Append tokens until a stop condition; call the stream callback with the kept ones."""
        kept = 0
        for token in tokens:
            req.output_ids.append(token)
            kept += 1
            if token in req.eos_ids:
                req.finish_reason = "eos"
            elif req.stop and self.stop_in_tail(req):
                req.finish_reason = "stop"
            elif len(req.output_ids) >= req.max_new_tokens:
                req.finish_reason = "length"
            if req.finish_reason is not None:
                break
        if req.on_tokens is not None and kept:
            req.on_tokens(tokens[:kept])

    def stop_in_tail(self, req: Request) -> bool:
        """Whether a stop string is in the text of the output's last tokens. A new match ends in
        the newest token's text (an older one would have stopped the request) and spans at most
        4 tokens a character (UTF-8 bytes), so the last 4 * longest + 8 tokens are decoded, after
        the ids before them (`decode_continuation`): linear in the output's length, where
        decoding all of it after every token was quadratic."""
        ids, window = req.output_ids, 4 * max(map(len, req.stop)) + 8
        cut = max(0, len(ids) - window)
        context = (list(req.prompt_ids[-CONTEXT_TOKENS:]) + ids[max(0, cut - CONTEXT_TOKENS):cut])[-CONTEXT_TOKENS:]
        tail = decode_continuation(self.tokenizer, context, ids[cut:])
        return any(s in tail for s in req.stop)

    def text_of(self, req: Request) -> str | None:
        """Decoded output, cut before the first stop string (None without tokenizer)."""
        if self.tokenizer is None:
            return None
        text = decode_continuation(self.tokenizer, req.prompt_ids, req.output_ids)
        cuts = [text.find(s) for s in req.stop if s in text]
        return text[:min(cuts)] if cuts else text


CONTEXT_TOKENS = 4  # prompt ids decoded before an output (`decode_continuation`)


def decode_continuation(tokenizer: Any, prompt_ids: Sequence[int], output_ids: Sequence[int],
                        skip_special_tokens: bool = False) -> str:
    """The text output_ids add after prompt_ids.

    Decoding the output alone loses what depends on the tokens before it: SentencePiece-style
    tokenizers drop the word-start space of a decode's first token ("▁a" alone is "a", after
    "Once upon" it is " a"), so "Once upon" + the output would read "Once upona time". The
    output is decoded after the prompt's last CONTEXT_TOKENS ids and their own text removed,
    as vLLM's incremental detokenizer does; where that text is not a prefix (a multi-byte
    character split across the boundary), the output alone. tokenizer: anything with
    decode(list[int]) -> str (and a skip_special_tokens keyword when that is asked for).
    """
    options = {"skip_special_tokens": True} if skip_special_tokens else {}  # plain decode(ids) suffices
    context = list(prompt_ids[-CONTEXT_TOKENS:])
    head = tokenizer.decode(context, **options)
    text = tokenizer.decode(context + list(output_ids), **options)
    if text.startswith(head):
        return text[len(head):]
    return tokenizer.decode(list(output_ids), **options)


class StaticInputs:
    """A CUDA graph's input tensors, at fixed addresses in one device buffer. Inputs given on the
    CPU are written to a pinned host buffer of the same layout, where they come first, and reach
    the device in one host-to-device copy (`stage`), which `GraphedTarget` captures into its graph:
    a replay then issues no copy of its own. Inputs given on the device are copied to their place
    one by one (`fill`).

    A decode step's inputs (token, position, slot, mask row) are a few bytes each: launching a
    copy for each cost more than the bytes, and on the host each CUDA call costs 5-20 us.
    `shapes` / `dtypes`: the inputs'; `on_host`: which of them are given on the CPU (a graph is
    captured per placement); `device`: any (tests use the CPU).
    """

    def __init__(self, shapes: Sequence[tuple[int, ...]], dtypes: Sequence[torch.dtype],
                 device: torch.device, on_host: Sequence[bool]) -> None:
        offsets, size, self.host_bytes = [0] * len(shapes), 0, 0
        for i in sorted(range(len(shapes)), key=lambda i: not on_host[i]):  # host inputs first
            offsets[i] = size
            size += -(-math.prod(shapes[i]) * dtypes[i].itemsize // 8) * 8  # each input 8-byte aligned
            if on_host[i]:
                self.host_bytes = size
        self.on_host = tuple(on_host)
        self.device_buffer = torch.zeros(size, dtype=torch.uint8, device=device)
        self.host_buffer = torch.zeros(size, dtype=torch.uint8, pin_memory=device.type == "cuda")
        self.tensors = [self.view(self.device_buffer, o, shape, dtype) for o, shape, dtype in
                        zip(offsets, shapes, dtypes)]
        self.host_tensors = [self.view(self.host_buffer, o, shape, dtype) for o, shape, dtype in
                             zip(offsets, shapes, dtypes)]
        # recorded by the staging copy (inside a graph: an external event node)
        self.copied = torch.cuda.Event(external=True) if device.type == "cuda" else None

    @staticmethod
    def view(buffer: Tensor, offset: int, shape: tuple[int, ...], dtype: torch.dtype) -> Tensor:
        """The bytes of one input, as a tensor of its shape and dtype."""
        return buffer[offset:offset + math.prod(shape) * dtype.itemsize].view(dtype).view(shape)

    def fill(self, values: Sequence[Tensor]) -> None:
        """Write values (the inputs' shapes and placement; any dtype that casts): those on the
        CPU into the host buffer (once the last `stage` has read it), those on the device into
        the static tensors. The host values reach the device with the next `stage`. Raises
        ValueError when a shape or a placement differs. A device value that is its static tensor
        (written there by its producer, e.g. `GraphedTarget.device_input_ids`) is not copied."""
        for static, value, on_host in zip(self.tensors, values, self.on_host):
            if value.shape != static.shape:
                raise ValueError(f"graph input of shape {tuple(value.shape)}, captured for {tuple(static.shape)}")
            if value.device != (torch.device("cpu") if on_host else static.device):
                raise ValueError(f"graph input on {value.device.type}, captured for one on "
                                 f"{'the CPU' if on_host else static.device.type}")
        if self.host_bytes:
            if self.copied is not None:
                self.copied.synchronize()  # the last staging copy has left the pinned buffer
            for host, value, on_host in zip(self.host_tensors, values, self.on_host):
                if on_host:
                    host.copy_(value)
        for static, value, on_host in zip(self.tensors, values, self.on_host):
            if not on_host and value.data_ptr() != static.data_ptr():  # not already written in place
                static.copy_(value)

    def stage(self) -> None:
        """Copy the host inputs' bytes to the device (asynchronously, one copy), after `fill`."""
        if self.host_bytes:
            self.device_buffer[:self.host_bytes].copy_(self.host_buffer[:self.host_bytes], non_blocking=True)
            if self.copied is not None:
                self.copied.record()


class GraphedTarget:
    """CUDA-graph replays of `FastTarget.forward`, one graph per token count T, placement of the
    inputs (CPU or device) and KV cache (captured on first use). Inputs are copied into static
    buffers (`StaticInputs`; the host-to-device copy is the graph's first node), so outputs are
    valid until the next call with the same T. Capture warms up with writes to the last T cache
    slots: requests never commit them (the engine keeps one round of tree scratch free at the
    end of the cache).
    """

    def __init__(self, target: FastTarget, aux_layers: tuple[int, ...]) -> None:
        self.target, self.aux_layers = target, aux_layers
        self.graphs: dict[tuple, tuple[torch.cuda.CUDAGraph, StaticInputs, Any]] = {}
        # one set of input buffers per (T, mask width, placement), shared by that key's graphs of
        # every cache: a producer that writes a graph's inputs in place keeps valid addresses
        self.inputs: dict[tuple, StaticInputs] = {}

    def __call__(self, input_ids: Tensor, position_ids: Tensor, cache_slots: Tensor, attn_mask: Tensor,
                 aux_layers: tuple[int, ...] = ()) -> Any:
        """Same arguments and output as FastTarget.forward (aux_layers fixed at construction);
        the tensor arguments on the target's device or the CPU."""
        values = (input_ids, position_ids, cache_slots, attn_mask)
        on_host = tuple(v.device.type == "cpu" for v in values)
        graph, inputs, output = self.graph(input_ids.shape[1], attn_mask.shape[-1], on_host)
        inputs.fill(values)
        graph.replay()
        return output

    def device_input_ids(self, t: int, max_seq_len: int) -> Tensor:
        """input_ids [1, t] long of the graph for T = t tokens with input_ids on the device and the
        other inputs on the host (a verify's placement; mask width max_seq_len), captured on first
        use. A caller that writes its tokens here and passes this tensor back skips the device
        copy of `StaticInputs.fill` (the engine's drafted tree: `TreeExpansion.tree(out=...)`):
        one CUDA call less on the host between drafting and verifying. The values are read by the
        next replay of that graph and must not change before it."""
        return self.graph(t, max_seq_len, (False, True, True, True))[1].tensors[0]

    def device_inputs(self, t: int, max_seq_len: int) -> list[Tensor]:
        """The inputs of the graph for T = t tokens with every input on the device: input_ids
        [1, t], position_ids [1, t], cache_slots [t] long, attn_mask [1, 1, t, max_seq_len] bool,
        captured on first use (a graphed tree round writes them: `GraphedRound`). The same
        tensors for the life of this object, also after the target's cache is rebuilt; passing
        them back replays the graph with no copy. Call this before writing them: a capture
        overwrites them with its warm-up values."""
        return self.graph(t, max_seq_len, (False, False, False, False))[1].tensors

    def graph(self, t: int, max_seq_len: int, on_host: tuple[bool, ...]) -> tuple:
        """(graph, StaticInputs, output) for T = t and this placement, captured on first use."""
        # a new cache (setup_cache) invalidates the graphs: key them by its address too
        cache = self.target.layers[0].attention.kv_cache.k_cache
        key = (t, on_host, cache.data_ptr())
        if key not in self.graphs:
            self.graphs[key] = self.capture(t, max_seq_len, on_host, cache.device)
        return self.graphs[key]

    def greedy_decode(self, max_seq_len: int) -> tuple[torch.cuda.CUDAGraph, list[Tensor], Tensor]:
        """A greedy decode step that feeds the next one, as one graph (the host only replays it):
        the forward of input_ids [1, 1] at position_ids [1, 1] and cache_slots [1] under attn_mask
        [1, 1, 1, max_seq_len] (`device_inputs`' tensors for T = 1), then the argmax written to
        input_ids and to the returned token [1] long, position and slot advanced by one, and the
        mask's column of the new slot set. Returns (graph, its inputs, token): the caller sets
        the inputs for the first step and reads the token after each replay. Captured on first
        use, again for a rebuilt cache (the same input tensors)."""
        cache = self.target.layers[0].attention.kv_cache.k_cache
        key = ("greedy", max_seq_len, cache.data_ptr())
        if key not in self.graphs:
            self.graphs[key] = self.capture(1, max_seq_len, (False,) * 4, cache.device, feed_argmax=True)
        graph, inputs, token = self.graphs[key]
        return graph, inputs.tensors, token

    def capture(self, t: int, max_seq_len: int, on_host: tuple[bool, ...], device: torch.device,
                feed_argmax: bool = False) -> tuple:
        """Warm up (compiles), then capture staging + forward for T = t tokens (feed_argmax: and
        `greedy_decode`'s tail, which then is the graph's output instead of the forward's)."""
        key = (t, max_seq_len, on_host)
        if key not in self.inputs:
            self.inputs[key] = StaticInputs([(1, t), (1, t), (t,), (1, 1, t, max_seq_len)],
                                            [torch.long, torch.long, torch.long, torch.bool], device, on_host)
        inputs = self.inputs[key]
        slots = torch.arange(max_seq_len - t, max_seq_len)
        warm = (torch.zeros(1, t, dtype=torch.long), slots[None], slots,
                torch.ones(1, 1, t, max_seq_len, dtype=torch.bool))
        warm = [v if host else v.to(device) for v, host in zip(warm, on_host)]

        def step() -> Any:
            output = self.target(*inputs.tensors, self.aux_layers)
            if not feed_argmax:
                return output
            ids, positions, cache_slots, mask = inputs.tensors
            token = output.logits[0, -1].argmax(-1, keepdim=True)  # [1]
            ids.view(-1).copy_(token)
            positions.add_(1)
            cache_slots.add_(1)
            mask.view(-1).index_fill_(0, cache_slots.clamp(max=max_seq_len - 1), True)
            return token

        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):
                inputs.fill(warm)  # a fed step advanced them: back to the last cache slots
                inputs.stage()
                step()
        torch.cuda.current_stream().wait_stream(stream)
        inputs.fill(warm)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            inputs.stage()
            output = step()
        return graph, inputs, output


def check_pairing(target: FastTarget, draft: Eagle3Draft, aux_layers: tuple[int, ...],
                  spec: SpecConfig) -> None:
    """Raise ValueError naming the mismatch when `draft` was not built for `target` / `aux_layers`."""
    cfg, args = draft.cfg, target.args
    problems = []
    if cfg.target_hidden_size != args.hidden_size:
        problems.append(f"drafter target_hidden_size {cfg.target_hidden_size} != target hidden_size "
                        f"{args.hidden_size}")
    if cfg.vocab_size != args.vocab_size:
        problems.append(f"drafter vocab_size {cfg.vocab_size} != target vocab_size {args.vocab_size}")
    if cfg.target_num_layers != args.num_layers:
        problems.append(f"drafter target_num_layers {cfg.target_num_layers} != target num_layers "
                        f"{args.num_layers}")
    if tuple(aux_layers) != tuple(cfg.aux_layers):
        problems.append(f"aux layers {list(aux_layers)} != the drafter's training layers "
                        f"{list(cfg.aux_layers)}")
    if spec.topk > cfg.draft_vocab_size:
        problems.append(f"topk {spec.topk} > draft vocabulary {cfg.draft_vocab_size}")
    if not draft.embedding_loaded:
        problems.append("the drafter's shared embedding is not loaded (call "
                        "draft.load_target_embedding(target.tok_embeddings.weight))")
    if problems:
        raise ValueError("drafter does not fit the target: " + "; ".join(problems))


def load_engine(target_dir: str | Path, draft_dir: str | Path | None, spec: SpecConfig | None,
                device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
                max_seq_len: int | None = None, tokenizer: Any = None,
                compile: bool = False) -> SpeculativeEngine:
    """Load a FastTarget and (optionally) a draft checkpoint and pair them.

    The drafter gets the target's embedding unless it owns one. Its manifest (specdraft layout)
    must name the drafter's aux layers and the target's hidden size / layer count / vocab.
    A drafter trained for another target (the manifest's target record, else the sizes its
    config was built for) is refused naming both targets, before any tensor meets the target.
    max_seq_len defaults to min(target max positions, 4096). Raises ValueError on a mismatch,
    and the loaders' errors for unreadable checkpoints. draft_dir None or spec None = plain.
    draft_dir may also be a training checkpoint (RUN/checkpoints/step-N.pt or a sharded step-N
    directory, `train.loop.load_training_checkpoint`: the drafter and its manifest come from it);
    a run directory or its checkpoints directory is refused naming RUN/draft and a step-N file.
    What loads but differs from the drafter's training is in the engine's `notes` (`pairing_notes`).
    """
    from specdraft.checkpoint import (CHECKPOINT_DIR, checkpoint_paths, is_training_checkpoint, load_draft,
                                      load_training_checkpoint)

    if draft_dir is not None and spec is not None:  # before the target loads: a run directory is no drafter
        path, run, what = Path(draft_dir), None, ""
        if path.is_dir() and not (path / "config.json").exists() and not is_training_checkpoint(path):
            if (path / CHECKPOINT_DIR).is_dir():
                run, what = path, "a training run directory"
            elif path.name == CHECKPOINT_DIR or any(path.glob("step-*")):
                run, what = path.parent, "a training run's checkpoints directory"
        if run is not None:
            steps = checkpoint_paths(run)
            example = steps[-1] if steps else run / CHECKPOINT_DIR / "step-N.pt"
            raise ValueError(f"{draft_dir} is {what}, not a drafter: pass {run / 'draft'} (the drafter train "
                             f"writes at the end) or one of its checkpoints, e.g. {example}")
    target = load_fast_target(target_dir, dtype=dtype, device=device)
    max_seq_len = max_seq_len or min(target.args.max_position_embeddings, 4096)
    draft = None
    if draft_dir is not None and spec is not None:
        if is_training_checkpoint(draft_dir):
            loaded = load_training_checkpoint(draft_dir)
            loaded.model.to(device=device, dtype=dtype)
        else:
            loaded = load_draft(draft_dir, device=device, dtype=dtype, target_num_layers=target.args.num_layers)
        draft = loaded.model.eval()
        cfg, args = draft.cfg, target.args
        trained = (dict(loaded.manifest.target) if loaded.manifest is not None else
                   {"num_layers": cfg.target_num_layers, "hidden_size": cfg.target_hidden_size,
                    "vocab_size": cfg.vocab_size})
        given = {"num_layers": args.num_layers, "hidden_size": args.hidden_size, "vocab_size": args.vocab_size}
        differ = [k for k, v in given.items() if trained.get(k) is not None and trained[k] != v]
        if differ:
            def sizes(r: dict) -> str:
                return f"{r.get('num_layers')} layers, hidden {r.get('hidden_size')}, vocab {r.get('vocab_size')}"
            recorded = trained.get("name_or_path")
            trained_for = (f"{recorded} ({sizes(trained)})" if recorded
                           else f"one of {sizes(trained)} (path not recorded)")
            raise ValueError(f"{draft_dir}: this drafter was trained for another target: {trained_for}, not "
                             f"{target_dir} ({sizes(given)}; {', '.join(differ)} differ{'s' * (len(differ) == 1)}); "
                             f"pass the target it was trained for, or a drafter trained for {target_dir}")
        if not draft.cfg.owns_embedding:
            draft.load_target_embedding(target.tok_embeddings.weight)
        check_manifest(loaded.manifest, draft, target, Path(draft_dir))
    engine = SpeculativeEngine(target, draft, spec, None, max_seq_len, device, tokenizer, compile)
    if draft is not None:
        engine.notes = pairing_notes(loaded.manifest, draft_dir, target_dir, spec)
    return engine


def pairing_notes(manifest: Any, draft_dir: str | Path, target_dir: str | Path, spec: SpecConfig) -> list[str]:
    """What loads but is not what the drafter was trained for (each a one-line note; the sizes
    were checked before): a target config whose hash differs from the manifest's record (the same
    sizes, e.g. another rope_theta: the aux states move; a transformers release that adds config
    fields changes the hash too, so this is a note, not an error), and num_steps past the
    drafter's TTT steps (positions training never unrolled to). No manifest: nothing to compare."""
    from transformers import AutoConfig

    from specdraft.draft import rope_from_hf_config
    from specdraft.target import config_hash

    if manifest is None:
        return []
    notes = []
    recorded, config = manifest.target.get("config_hash"), AutoConfig.from_pretrained(target_dir, local_files_only=True)
    digest = config_hash(config)
    if recorded and digest != recorded:
        text = config.get_text_config()
        rope_theta, rope_scaling = rope_from_hf_config(lambda k, d=None: getattr(text, k, d))
        now = {"rope_theta": rope_theta, "rope_scaling": rope_scaling,
               "max_position_embeddings": getattr(text, "max_position_embeddings", None)}
        changed = [f"{key} {manifest.target[key]} -> {value}" for key, value in now.items()
                   if key in manifest.target and manifest.target[key] != value]
        what = ", ".join(changed) or f"config hash {recorded[:12]} -> {digest[:12]}"
        notes.append(f"{target_dir}: its config differs from the one the drafter was trained on ({what}): "
                     f"acceptance may drop; `specdraft doctor {draft_dir} --target {target_dir}` names the difference")
    ttt_steps = ((manifest.training or {}).get("config") or {}).get("ttt_steps")
    if ttt_steps and spec.num_steps > ttt_steps:
        notes.append(f"num_steps {spec.num_steps} > the drafter's {ttt_steps} training-time-test steps: draft "
                     f"steps past {ttt_steps} were never trained and are rarely accepted")
    return notes


def check_manifest(manifest: Any, draft: Eagle3Draft, target: FastTarget, path: Path) -> None:
    """Raise ValueError when a specdraft manifest disagrees with the drafter or the target."""
    if manifest is None:
        return
    problems = []
    if list(manifest.aux_layers) != list(draft.cfg.aux_layers):
        problems.append(f"manifest aux_layers {manifest.aux_layers} != drafter config "
                        f"{list(draft.cfg.aux_layers)}")
    for key, value in (("hidden_size", target.args.hidden_size), ("num_layers", target.args.num_layers),
                       ("vocab_size", target.args.vocab_size)):
        if key in manifest.target and manifest.target[key] != value:
            problems.append(f"manifest target {key} {manifest.target[key]} != the target's {value}")
    if problems:
        raise ValueError(f"{path}: drafter was trained for another target: " + "; ".join(problems))
