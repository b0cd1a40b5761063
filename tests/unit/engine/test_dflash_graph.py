"""specdraft.engine.dflash_graph: the graphed DFlash round (static caches, padded buckets of new
context positions, the block attending over the whole cache, grouped heads folded) proposes what
the eager `DFlashBlock` proposes, with the same context cache and block states; an engine whose
rounds replay it decodes losslessly with the eager engine's acceptance. Without a GPU a replay
runs the captured code eagerly, or the aten ops traced from one run of it, host values frozen
(`tests.support.dflash.replay_blocks_eagerly`); the CUDA tests capture real graphs."""

from __future__ import annotations

import functools
import types

import pytest
import torch

from specdraft.engine.dflash_block import DFlashBlock
from specdraft.engine.dflash_graph import GraphedBlock, block_buckets
from specdraft.engine.spec_config import SpecConfig
from tests.support.dflash import (
    TINY_BLOCK,
    engine_dflash_draft,
    replay_blocks_eagerly,
    tiny_dflash_draft,
)
from tests.support.engine_helpers import greedy_sequences, random_prompts, tiny_setup

CUDA = torch.cuda.is_available()
PROMPT_LEN, NUM_NEW = 6, 12
# pending positions per round: a prompt past the largest bucket (appended eagerly, then a graph
# with none pending), then accepted counts (3 padded to bucket 4)
ROUNDS = (7, 3, 4, 1, 2, 3, 4, 4)


@pytest.mark.parametrize(
    ("num_drafts", "buckets"),
    [(1, (1, 2)), (3, (1, 2, 4)), (4, (1, 2, 4, 5)), (15, (1, 2, 4, 8, 16))],
)
def test_buckets_are_powers_of_two_then_every_position_a_round_accepts(num_drafts, buckets):
    assert block_buckets(num_drafts) == buckets


def test_buckets_past_what_a_round_accepts_are_refused(monkeypatch):
    replay_blocks_eagerly(monkeypatch)
    block = DFlashBlock(tiny_dflash_draft(), SpecConfig.chain(2), 32, torch.device("cpu"))
    with pytest.raises(ValueError, match=r"buckets \[1, 4\]: each in 1..3"):
        GraphedBlock(block, (1, 4))


@torch.no_grad()
def test_capture_leaves_a_live_context_as_it_is(monkeypatch):
    """Warm-up writes only the caches' last block_size entries, past any context."""
    replay_blocks_eagerly(monkeypatch, traced=True)
    block = DFlashBlock(tiny_dflash_draft(), SpecConfig.chain(3), 28, torch.device("cpu"))
    block.extend(torch.randn(28, 96, generator=torch.Generator().manual_seed(4)).double())
    before = [(cache.k.clone(), cache.v.clone()) for cache in block.caches]
    GraphedBlock(block, (1, 2, 4))
    for cache, (k, v) in zip(block.caches, before):
        assert cache.length == 28 and cache.max_len == 32
        assert torch.equal(cache.k[:, :, :28], k[:, :, :28])
        assert torch.equal(cache.v[:, :, :28], v[:, :, :28])
        assert not torch.equal(cache.k[:, :, 28:], k[:, :, 28:])  # the warm-up's block


def _record_states(block: DFlashBlock) -> list[torch.Tensor]:
    """The block states [block_size, H] of each round `block` runs, in order."""
    states, run = [], block.block_states

    def recorded(*args):
        states.append(run(*args))
        return states[-1]

    block.block_states = recorded
    return states


def _rounds(block: DFlashBlock, aux: torch.Tensor) -> list[list[int]]:
    """The proposals' tokens of ROUNDS' rounds on consecutive rows of aux [sum(ROUNDS), W]
    (each round's root: its first pending row's index)."""
    proposals, end = [], 0
    for n in ROUNDS:
        req = types.SimpleNamespace(output_ids=[end % 40], pending_aux=aux[end : end + n])
        proposals.append(block.propose(req).tokens.tolist())
        end += n
    return proposals


@pytest.mark.parametrize("traced", [False, True])
@torch.no_grad()
def test_graphed_rounds_equal_the_eager_block_and_cache(monkeypatch, traced):
    """The same proposals and context cache; the same block states (run eagerly: a traced
    replay runs no Python to record them)."""
    replay_blocks_eagerly(monkeypatch, traced)
    draft = tiny_dflash_draft()  # float64, 4 query heads on 2 kv heads
    aux = torch.randn(sum(ROUNDS), 96, generator=torch.Generator().manual_seed(3))
    spec, device = SpecConfig.chain(TINY_BLOCK - 1), torch.device("cpu")
    eager, graphed = DFlashBlock(draft, spec, 40, device), DFlashBlock(draft, spec, 40, device)
    graphed.graphs = GraphedBlock(graphed, block_buckets(spec.num_steps))
    assert graphed.graphs.buckets == (1, 2, 4)
    want_states, got_states = _record_states(eager), _record_states(graphed)
    assert _rounds(graphed, aux) == _rounds(eager, aux)
    assert not graphed.timed and graphed.drafting(1.0) == 0.0  # no GPU time to read on the CPU
    assert len(got_states) == (0 if traced else len(ROUNDS))
    for got, want in zip(got_states, want_states):
        assert (got - want).abs().max() < 1e-12
    length = sum(ROUNDS)
    for got, want in zip(graphed.caches, eager.caches):
        assert got.length == want.length == length
        assert (got.k[:, :, :length] - want.k[:, :, :length]).abs().max() < 1e-12
        assert (got.v[:, :, :length] - want.v[:, :, :length]).abs().max() < 1e-12


def test_a_round_past_the_caches_is_refused_before_its_replay(monkeypatch):
    replay_blocks_eagerly(monkeypatch)
    block = DFlashBlock(tiny_dflash_draft(), SpecConfig.chain(3), 28, torch.device("cpu"))
    block.graphs = GraphedBlock(block, (1, 2, 4))
    for cache in block.caches:  # 32 entries: a block of 4 after 28 + 1 does not fit
        cache.length = 28
    req = types.SimpleNamespace(output_ids=[1], pending_aux=torch.zeros(1, 96).double())
    with pytest.raises(
        ValueError, match="draft cache write of 5 entries at 28 exceeds its size 32"
    ):
        block.propose(req)
    assert [cache.length for cache in block.caches] == [28, 28]


@functools.cache
def _trained():
    """(setup, DFlash drafter trained on the tiny llama target's greedy continuations)."""
    setup = tiny_setup("llama")
    sequences = greedy_sequences(setup.target, random_prompts(32, PROMPT_LEN, seed=2), NUM_NEW)
    return setup, sequences, engine_dflash_draft(setup.target, sequences, PROMPT_LEN, 100)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@torch.no_grad()
def test_an_engine_replaying_the_rounds_decodes_as_the_eager_engine(monkeypatch, temperature):
    """Greedy output = the target's greedy output; at T = 1 the same draws (same seeds); the
    same acceptance per position as the eager block's in both. Each graph is replayed as traced
    once, its host values frozen, as a CUDA graph replays."""
    replay_blocks_eagerly(monkeypatch, traced=True)
    setup, sequences, draft = _trained()
    prompts = sequences[:6, :PROMPT_LEN].tolist() + random_prompts(2, PROMPT_LEN, seed=10)
    spec = SpecConfig.chain(TINY_BLOCK - 1)
    eager, graphed = setup.engine(draft, spec), setup.engine(draft, spec)
    graphed.proposer.graphs = GraphedBlock(graphed.proposer, block_buckets(spec.num_steps))
    outputs = []
    for engine in (eager, graphed):
        outputs.append(
            [
                engine.generate(p, NUM_NEW, temperature, seed=i).token_ids
                for i, p in enumerate(prompts)
            ]
        )
    assert outputs[1] == outputs[0]
    if temperature == 0.0:
        assert (
            outputs[1] == greedy_sequences(setup.target, prompts, NUM_NEW)[:, PROMPT_LEN:].tolist()
        )
    assert graphed.total.accepted_per_position == eager.total.accepted_per_position
    assert graphed.total.accept_length > (1.2 if temperature == 0.0 else 1.05)


@pytest.mark.skipif(not CUDA, reason="CUDA graphs")
@torch.no_grad()
def test_captured_graphs_equal_the_eager_block_on_cuda():
    """Real captures (float32 on the GPU): the same proposals as the eager block, the block
    states and context cache within float32 rounding."""
    draft = tiny_dflash_draft().float().cuda()
    aux = torch.randn(sum(ROUNDS), 96, generator=torch.Generator().manual_seed(3)).cuda()
    spec, device = SpecConfig.chain(TINY_BLOCK - 1), torch.device("cuda")
    eager, graphed = DFlashBlock(draft, spec, 40, device), DFlashBlock(draft, spec, 40, device)
    graphed.graphs = GraphedBlock(graphed, block_buckets(spec.num_steps))
    states = _record_states(graphed)
    got_tokens = _rounds(graphed, aux)
    assert states == []  # replays: the block's torch code ran at capture only
    assert graphed.timed and 0 < graphed.drafting(10.0) < 10.0  # the last replay's GPU time
    assert not graphed.timed
    assert got_tokens == _rounds(eager, aux)
    length = sum(ROUNDS)
    for got, want in zip(graphed.caches, eager.caches):
        assert got.length == want.length == length
        assert (got.k[:, :, :length] - want.k[:, :, :length]).abs().max() < 1e-4
        assert (got.v[:, :, :length] - want.v[:, :, :length]).abs().max() < 1e-4


@pytest.mark.skipif(not CUDA, reason="CUDA graphs and compiled target layers")
@torch.no_grad()
def test_a_compiled_engine_replays_dflash_rounds_and_decodes_losslessly():
    """compile=True gives the DFlash proposer its graphs; its greedy output and rounds equal the
    same compiled engine's with eager rounds (the same target graphs), with drafts accepted."""
    import copy

    from specdraft.engine.speculate import SpeculativeEngine

    setup, sequences, draft = _trained()
    target = copy.deepcopy(setup.target).cuda()  # compile=True compiles its layers in place
    draft = copy.deepcopy(draft).cuda()
    spec = SpecConfig.chain(TINY_BLOCK - 1)
    engine = SpeculativeEngine(target, draft, spec, None, 64, "cuda", compile=True)
    assert isinstance(engine.proposer.graphs, GraphedBlock)
    assert engine.draft_kernels == "torch, CUDA graphs (a DFlash block drafter)"
    prompts = sequences[:4, :PROMPT_LEN].tolist()
    got = [engine.generate(p, NUM_NEW) for p in prompts]
    engine.proposer.graphs = None
    want = [engine.generate(p, NUM_NEW) for p in prompts]
    assert [r.token_ids for r in got] == [r.token_ids for r in want]
    assert [r.metrics.num_verify_steps for r in got] == [r.metrics.num_verify_steps for r in want]
    assert engine.total.accept_length > 1.2
