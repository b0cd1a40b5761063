"""specdraft.engine.draft_round: a graphed round drafts what the round step by step drafts (the
same nodes, scores, verify inputs and cache entries, bit for bit) and stays a short list of
small torch ops around its drafter steps (each op is a kernel launch inside the CUDA graph).
Without a GPU the round runs eagerly and its drafter steps run `FastDraft`'s torch path, float32.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from specdraft.engine.draft_round import GraphedRound
from specdraft.engine.eagle import DraftCache, FastDraft
from specdraft.engine.fast_model import causal_mask
from specdraft.engine.kernels import fused_decode
from specdraft.engine.sampling import SamplingParams
from specdraft.engine.spec_config import SpecConfig
from specdraft.engine.tree import TreeExpansion, tree_of, verify_mask
from tests.support.drafts import engine_draft

SETTINGS = {
    "chain7": SpecConfig.chain(7),
    "tree5x4_16": SpecConfig(5, 4, 16),
    "tree6x8_32": SpecConfig(6, 8, 32),
}
# aten ops of one round (m = 1, bf16 logits) outside its drafter steps; the rounds ran 90, 237
# and 276 before their constants were built once and their bookkeeping folded (#25); with the
# expansion's Triton kernels (each launch counted as one op)
MAX_OPS = {"chain7": 49, "tree5x4_16": 113, "tree6x8_32": 129}
MAX_OPS_KERNELS = {"chain7": 14, "tree5x4_16": 60, "tree6x8_32": 64}
EXPAND_KERNELS = ("child_topk", "next_frontier", "tree_mask")
COMMITTED, NUM_SLOTS = 20, 80  # the round's start (entries already in the cache); the verify's S


class OpCounter(TorchDispatchMode):
    """Counts the aten ops run inside it (views excluded), except while `paused`."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()
        self.paused = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self.paused and not func.is_view:
            self.ops[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def _setup(spec: SpecConfig, dtype: torch.dtype, monkeypatch, counter: OpCounter | None = None):
    """(GraphedRound without graphs, its drafter, its cache, the tree's verify buffers): the
    drafter's steps run its torch path (Triton's interpreter would take minutes), uncounted."""

    def torch_step(fast, step, slots, mask):
        if counter is not None:
            counter.paused = True
        start, t = int(slots[0]), step.input_ids.shape[0]  # a step's slots are contiguous
        out = fast(*step, start, mask[..., : start + t])
        if counter is not None:
            counter.paused = False
        return out

    monkeypatch.setattr(FastDraft, "triton_step", torch_step)
    monkeypatch.setattr(
        GraphedRound, "capture", lambda self, m: (None, self.static_inputs(m), None)
    )
    torch.manual_seed(0)
    draft = engine_draft().to(dtype).eval()
    cfg = draft.cfg
    cache = DraftCache(
        cfg.num_key_value_heads, cfg.head_dim, 96 + fused_decode.MAX_TOKENS, dtype, "cpu"
    )
    gen = torch.Generator().manual_seed(1)
    cache.k.copy_(
        torch.randn(cache.k.shape, generator=gen)
    )  # the committed entries the round attends to
    cache.v.copy_(torch.randn(cache.v.shape, generator=gen))
    n = spec.num_draft_tokens
    inputs = [torch.zeros(shape, dtype=torch.long) for shape in ((1, n), (1, n), (n,))]
    inputs.append(torch.zeros(1, 1, n, NUM_SLOTS, dtype=torch.bool))
    fast = FastDraft(draft)
    vocab = draft.draft_to_target(torch.arange(cfg.draft_vocab_size))
    rounds = GraphedRound(fast, cache, spec, vocab, 128, inputs if spec.topk > 1 else None)
    return rounds, fast, cache, inputs


def _pending(m: int, width: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(m)
    return torch.randint(0, 128, (m,), generator=gen), torch.randn(m, width, generator=gen).to(
        dtype
    )


def _count_expand_kernels(monkeypatch, counter: OpCounter) -> None:
    """Rounds expand through `kernels.expand_ops` (Triton's interpreter without a GPU); each
    launch counts as one op of `counter`, the interpreter's own tensor ops not at all."""
    from specdraft.engine.kernels import expand_ops

    init = TreeExpansion.__init__
    monkeypatch.setattr(
        TreeExpansion, "__init__", lambda self, *args, **kwargs: init(self, *args, kernels=True)
    )
    for name in EXPAND_KERNELS:

        def launch(*args, kernel=getattr(expand_ops, name), name=name):  # noqa: B008
            counter.paused = True
            try:
                return kernel(*args)
            finally:
                counter.paused = False
                counter.ops[name] += 1

        monkeypatch.setattr(expand_ops, name, launch)


@torch.no_grad()
@pytest.mark.parametrize("kernels", [False, True])
@pytest.mark.parametrize("name", list(SETTINGS))
def test_round_runs_few_torch_ops_around_its_drafter_steps(name, kernels, monkeypatch):
    """Every torch op of a round is a kernel of its graph: the step offsets, masks and
    constants are built once (not replayed), the expansion and the selection folded; bf16
    logits as on the GPU (their float32 copy counts). With the expansion's Triton kernels a
    step is one launch of a chain, three of a tree (the last step's one), besides no torch op
    of the expansion."""
    spec = SETTINGS[name]
    counter = OpCounter()
    rounds, fast, _, _ = _setup(spec, torch.bfloat16, monkeypatch, counter)
    if kernels:
        pytest.importorskip("triton")
        if torch.cuda.is_available():
            pytest.skip(
                "the interpreter's count (the kernels would be compiled for CUDA and given CPU tensors)"
            )
        _count_expand_kernels(monkeypatch, counter)
    ids, aux = _pending(1, fast.fc.shape[1], torch.bfloat16)
    with counter:
        out = rounds.round(ids, aux, torch.tensor([COMMITTED]))
    assert len(out) == (2 if spec.topk == 1 else 3)
    if kernels:
        moves = (
            spec.num_steps - 1 if spec.topk > 1 else 0
        )  # a tree's frontiers moved, each one's mask built
        assert [counter.ops[k] for k in EXPAND_KERNELS] == [spec.num_steps, moves, moves]
        assert counter.ops["_log_softmax"] == counter.ops["topk"] == 0
        assert sum(counter.ops.values()) <= MAX_OPS_KERNELS[name], counter.ops
        return
    assert counter.ops["_log_softmax"] == spec.num_steps  # one expansion per step, each counted
    assert sum(counter.ops.values()) <= MAX_OPS[name], counter.ops


def _step_by_step(
    fast: FastDraft,
    cache: DraftCache,
    spec: SpecConfig,
    ids: torch.Tensor,
    aux: torch.Tensor,
    vocab: torch.Tensor,
):
    """`SpeculativeEngine.draft_steps`' round (greedy) from entry COMMITTED: the DraftTree."""
    m = ids.shape[0]
    expansion = TreeExpansion(int(ids[-1]), spec.topk, False, SamplingParams(), vocab, 128, None)
    logits, hidden = fast(ids, aux, torch.arange(COMMITTED, COMMITTED + m), True, cache, COMMITTED)
    committed = COMMITTED + m
    tokens, hidden = expansion.expand(logits[-1:], hidden[-1:], written=False)
    for step in range(1, spec.num_steps):
        position = torch.full((tokens.numel(),), committed - 1 + step)
        logits, hidden = fast(
            tokens,
            hidden,
            position,
            False,
            cache,
            committed + expansion.num_scratch,
            expansion.draft_mask(committed),
        )
        tokens, hidden = expansion.expand(logits, hidden, written=True)
    return tree_of(*expansion.candidates(), spec.num_draft_tokens)


@torch.no_grad()
@pytest.mark.parametrize("kernels", [False, True])
@pytest.mark.parametrize("name", ["chain7", "tree5x4_16", "tree3x3_8"])
def test_round_drafts_the_step_by_step_tree_bit_for_bit(name, kernels, monkeypatch):
    """The round's outputs (a chain's tokens and scores; a tree's parents, scores and ok, its
    verify inputs: tokens, positions, slots, mask) and the cache entries it writes equal those
    of the round step by step, exactly, after 1 and 3 pending positions; with the expansion's
    torch ops or its Triton kernels (`kernels.expand_ops`, Triton's interpreter on the CPU)."""
    if kernels:
        pytest.importorskip("triton")
        if (
            torch.cuda.is_available()
        ):  # the kernels would be compiled for CUDA and given these CPU tensors
            pytest.skip(
                "the interpreter's check of the kernels in a round (test_expand_ops covers CUDA)"
            )
        init = TreeExpansion.__init__
        monkeypatch.setattr(
            TreeExpansion, "__init__", lambda self, *args, **kwargs: init(self, *args, kernels=True)
        )
    spec = SETTINGS.get(name, SpecConfig(3, 3, 8))
    rounds, fast, cache, inputs = _setup(spec, torch.float32, monkeypatch)
    ref_cache = DraftCache(2, 16, cache.max_len, torch.float32, "cpu")
    for m in (1, 3):
        ref_cache.k.copy_(cache.k)
        ref_cache.v.copy_(cache.v)
        ids, aux = _pending(m, fast.fc.shape[1], torch.float32)
        out = rounds.round(ids, aux, torch.tensor([COMMITTED]))
        tree = _step_by_step(fast, ref_cache, spec, ids, aux, rounds.draft_to_target)
        assert torch.equal(cache.k, ref_cache.k) and torch.equal(cache.v, ref_cache.v)
        if spec.topk == 1:
            assert torch.equal(out[0], tree.tokens) and torch.equal(out[1], tree.scores)
            continue
        parents, scores, ok = out
        assert parents.tolist() == tree.parents and torch.equal(scores, tree.scores) and bool(ok)
        committed = COMMITTED + m
        input_ids, positions, slots, mask = inputs
        assert torch.equal(input_ids[0], tree.tokens)
        assert positions[0].tolist() == [committed + depth for depth in tree.depths]
        assert slots.tolist() == list(range(committed, committed + spec.num_draft_tokens))
        assert torch.equal(mask, _host_mask(tree, committed, NUM_SLOTS))
        assert (
            max(tree.depths) >= 2 and len(set(tree.parents)) > 2
        )  # nodes below depth 1, several parents


def _host_mask(tree, prefix_len, num_slots):
    """The verify's host mask of a DraftTree, as `round.TargetRunner.verify` builds it."""
    if tree.is_chain:
        return causal_mask(prefix_len, tree.num_nodes, num_slots)
    return verify_mask(tree.ancestor_mask(), prefix_len, num_slots)
