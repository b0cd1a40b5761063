"""specdraft.engine.chain_ahead: greedy chain rounds launched one round ahead of the host, the
verdict and the next round's state taken on the device. Without a GPU the graphs run eagerly
(each "replay" calls the captured function) and the drafter's steps run its torch path
(`FastDraft.__call__`: Triton's interpreter would take minutes), float32.

The target's and the drafter's heads are set so that both choose between the same two tokens,
each by the sign of its own last hidden state along a random direction: the drafts depend on
the drafter's state (aux states, cache), and rounds accept from none to all of them."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch

from tests.unit.engine.test_triton_ops import ARGS, CUDA, DEVICE, DTYPE, _random_target, replay_rounds_eagerly


def _eager_capture(fn, warmups=2, reset=None):
    """capture_graph's stand-in without a GPU: a "graph" whose replay calls fn."""
    return SimpleNamespace(replay=fn), None


def _torch_step(fast, ids, hidden, positions, first_step, cache, slots, mask):
    """`FastDraft.triton_step` through the torch path: slots are contiguous in a round."""
    start, t = int(slots[0]), ids.shape[0]
    return fast(ids, hidden, positions, first_step, cache, start, mask[..., :start + t])


@pytest.fixture(scope="module")
@torch.no_grad()
def pair():
    """(target, drafter) whose heads score two tokens +s and -s (s = the last hidden state along
    a random direction, one per model) and every other token 0: each one's greedy choice is one
    of the two."""
    from tests.drafts import tiny_draft

    target = _random_target(ARGS["llama"])
    torch.manual_seed(0)
    draft = tiny_draft(num_layers=2, aux_layers=(0, 1, 2), head_dim=16, hidden_size=64, target_hidden_size=64,
                       vocab_size=200, num_attention_heads=4, num_key_value_heads=2).to(DEVICE, DTYPE).eval()
    tokens = draft.draft_to_target(torch.arange(2, device=DEVICE)).tolist()  # draft ids 0 and 1
    for weight, rows, seed in ((draft.lm_head.weight, [0, 1], 5), (target.output.weight, tokens, 6)):
        direction = torch.randn(weight.shape[1], generator=torch.Generator().manual_seed(seed)).to(weight)
        head = torch.zeros_like(weight)
        head[rows[0]], head[rows[1]] = direction, -direction
        weight.data = head  # the target's head is not tied to its embedding
    return target, draft


def _engines(pair, monkeypatch, steps: int):
    """(a chain engine running its rounds step by step, the same with `ChainAhead`), both with
    graphed draft rounds (eager replays without a GPU)."""
    from specdraft.engine import chain_ahead
    from specdraft.engine.draft_round import GraphedRound
    from specdraft.engine.fast_draft import FastDraft
    from specdraft.engine.spec_config import SpecConfig
    from specdraft.engine.speculate import SpeculativeEngine

    if not CUDA:
        replay_rounds_eagerly(monkeypatch)
        monkeypatch.setattr(chain_ahead, "capture_graph", _eager_capture)
        monkeypatch.setattr(FastDraft, "triton_step", _torch_step)
    target, draft = pair
    engines = []
    for ahead in (False, True):
        engine = SpeculativeEngine(target, draft, SpecConfig.chain(steps), None, 64, DEVICE)
        engine.run_round = GraphedRound(engine.fast_draft, engine.draft_cache, engine.spec, engine.draft_vocab,
                                        target.args.vocab_size)
        if ahead:
            engine.chain_ahead = chain_ahead.ChainAhead(engine.run_round, target, engine.aux_layers, 64)
        engines.append(engine)
    return engines


@torch.no_grad()
def test_chain_rounds_run_ahead_and_emit_the_step_by_step_tokens(pair, monkeypatch):
    """Round k + 1 launched before round k's verdict is read emits what the rounds step by step
    emit (the same rounds, the same accepted drafts per round), streams the tokens in order,
    and stops where they stop: max_new_tokens at every distance from a round's end (a round
    launched ahead only when the one in flight cannot end the request), an EOS id inside a
    round. Sampled requests keep the step-by-step rounds."""
    step, ahead = _engines(pair, monkeypatch, steps=3)
    calls = []
    run = ahead.chain_ahead.run
    ahead.chain_ahead.run = lambda req: (calls.append(req), run(req))
    prompt = torch.randint(0, 200, (12,), generator=torch.Generator().manual_seed(2)).tolist()
    ref = step.generate(prompt, 24)
    streamed: list[int] = []
    got = ahead.generate(prompt, 24, on_tokens=streamed.extend)
    assert got.token_ids == ref.token_ids == streamed and len(calls) == 1
    assert got.metrics.num_verify_steps == ref.metrics.num_verify_steps > 3
    assert got.metrics.accepted_per_position == ref.metrics.accepted_per_position
    assert ahead.draft_cache.length == step.draft_cache.length  # the host's books: the entries committed
    accepted = got.metrics.accepted_per_position
    assert accepted[0] > accepted[-1] > 0  # rounds accepted none, some and all of their drafts
    for n in (1, 2, 3, 5, 9, 13):
        assert ahead.generate(prompt, n).token_ids == ref.token_ids[:n]
    eos = ref.token_ids[10]
    stopped = ahead.generate(prompt, 24, eos_ids=[eos])
    assert stopped.token_ids == ref.token_ids[:ref.token_ids.index(eos) + 1] and stopped.finish_reason == "eos"
    greedy_runs = len(calls)
    sampled = ahead.generate(prompt, 8, temperature=1.0, seed=4)
    assert sampled.token_ids == step.generate(prompt, 8, temperature=1.0, seed=4).token_ids
    assert len(calls) == greedy_runs  # the sampled request did not run ahead


def test_chain_ahead_on_a_tree_is_refused():
    from specdraft.engine.chain_ahead import ChainAhead
    from specdraft.engine.spec_config import SpecConfig

    with pytest.raises(ValueError, match="chains \\(topk 1\\), not topk 2"):
        ChainAhead(SimpleNamespace(spec=SpecConfig(2, 2, 4)), None, (), 64)


@pytest.mark.skipif(not CUDA, reason="CUDA graphs and compiled target layers")
@torch.no_grad()
def test_a_compiled_chain_engine_runs_ahead_and_emits_its_step_by_step_tokens(pair):
    """compile=True builds the ChainAhead of a chain (Triton kernels, CUDA graphs): the same
    greedy tokens and rounds as the same engine's rounds step by step."""
    from specdraft.engine.spec_config import SpecConfig
    from specdraft.engine.speculate import SpeculativeEngine

    target, draft = copy.deepcopy(pair[0]), pair[1]  # compile=True compiles the target's layers in place
    engine = SpeculativeEngine(target, draft, SpecConfig.chain(3), None, 64, DEVICE, compile=True)
    assert engine.chain_ahead is not None and engine.target_kernels == engine.draft_kernels == "triton"
    prompt = list(range(1, 13))
    got = engine.generate(prompt, 24)
    engine.chain_ahead = None
    ref = engine.generate(prompt, 24)
    assert got.token_ids == ref.token_ids
    assert got.metrics.num_verify_steps == ref.metrics.num_verify_steps
