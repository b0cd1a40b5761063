"""specdraft.engine.rounds_ahead: greedy rounds (chains and trees) launched one round ahead of the
host, the verdict, a tree's cache compaction and the next round's state taken on the device.
Without a GPU the graphs run eagerly (each "replay" calls the captured function) and the
drafter's steps run its torch path (`FastDraft.__call__`: Triton's interpreter would take
minutes), float32.

The target's and the drafter's heads are set so that both choose among the same few tokens
(the drafter's whole draft vocabulary for trees), each by its own last hidden state along
random directions: the drafts depend on the drafter's state (aux states, cache), and rounds
accept from none to all of their depth, through any sibling of a tree."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch

from specdraft.engine.round import free_nodes
from tests.support.kernels import ARGS, CUDA, DEVICE, DTYPE, random_target, replay_rounds_eagerly

CHAIN, TREE = (2, 64), (5, 8)  # (tokens the heads choose among, the draft vocabulary)


def _eager_capture(fn, warmups=2, reset=None):
    """capture_graph's stand-in without a GPU: a "graph" whose replay calls fn."""
    return SimpleNamespace(replay=fn), None


def _torch_step(fast, step, slots, mask):
    """`FastDraft.triton_step` through the torch path: slots are contiguous in a round."""
    start, t = int(slots[0]), step.input_ids.shape[0]
    return fast(*step, start, mask[..., : start + t])


@torch.no_grad()
def _pair(num_tokens: int, draft_vocab_size: int):
    """(target, drafter) whose heads score num_tokens tokens (the drafter's draft ids 0.., the
    target's their target ids) with the last hidden state along num_tokens - 1 random directions
    and minus their sum, every other token 0: each one's greedy choice is one of them."""
    from tests.support.drafts import engine_draft

    target = random_target(ARGS["llama"])
    torch.manual_seed(0)
    draft = engine_draft(draft_vocab_size=draft_vocab_size).to(DEVICE, DTYPE).eval()
    tokens = draft.draft_to_target(torch.arange(num_tokens, device=DEVICE)).tolist()
    for weight, rows, seed in (
        (draft.lm_head.weight, list(range(num_tokens)), 5),
        (target.output.weight, tokens, 6),
    ):
        directions = torch.randn(
            num_tokens - 1, weight.shape[1], generator=torch.Generator().manual_seed(seed)
        )
        head = torch.zeros_like(weight)
        head[rows] = torch.cat([directions, -directions.sum(0, keepdim=True)]).to(weight)
        weight.data = head  # the target's head is not tied to its embedding
    return target, draft


@pytest.fixture(scope="module")
def pairs():
    """`_pair` by its arguments, each built once."""
    built: dict[tuple[int, int], tuple] = {}

    def pair(key: tuple[int, int]) -> tuple:
        if key not in built:
            built[key] = _pair(*key)
        return built[key]

    return pair


def _engines(pair, monkeypatch, spec, max_seq_len=64):
    """(an engine running its rounds step by step, the same with `RoundsAhead`), both with
    graphed draft rounds (eager replays without a GPU)."""
    from specdraft.engine import rounds_ahead
    from specdraft.engine.draft_round import GraphedRound
    from specdraft.engine.eagle import FastDraft
    from specdraft.engine.speculate import SpeculativeEngine

    if not CUDA:
        replay_rounds_eagerly(monkeypatch)
        monkeypatch.setattr(rounds_ahead, "capture_graph", _eager_capture)
        monkeypatch.setattr(FastDraft, "triton_step", _torch_step)
    target, draft = pair
    engines = []
    for ahead in (False, True):
        engine = SpeculativeEngine(target, draft, spec, None, max_seq_len, DEVICE)
        engine.proposer.rounds = GraphedRound(
            engine.fast_draft,
            engine.draft_cache,
            spec,
            engine.draft_vocab,
            target.args.vocab_size,
            engine.runner.verify_inputs(spec.num_draft_tokens) if spec.topk > 1 else None,
        )
        if ahead:
            engine.rounds_ahead = rounds_ahead.RoundsAhead(
                engine.proposer.rounds, target, engine.aux_layers, max_seq_len
            )
            _log_launches(engine)
        engines.append(engine)
    return engines


def _log_launches(engine) -> None:
    """engine.launched: per round launched by its RoundsAhead, whether it was launched ahead
    (before the round in flight was read: its draft cache entries start past the host's
    committed ones)."""
    launch, engine.launched = engine.rounds_ahead.launch, []

    def logged_launch(slot, start):
        engine.launched.append(start > engine.draft_cache.length)
        return launch(slot, start)

    engine.rounds_ahead.launch = logged_launch


def _run_both(step, ahead, prompt, max_new_tokens, **kwargs):
    """Each engine's result and the rounds' emitted batches of the step-by-step one (the
    prefill's token first), after checking that they agree (tokens, rounds, accepted drafts,
    committed target K/V and draft cache entries) and that the runner launched each round
    ahead exactly when the round in flight could not end the request by length, and read
    every round but one launched ahead of an EOS."""
    batches, streamed = [], []
    ahead.launched.clear()
    ref = step.generate(prompt, max_new_tokens, on_tokens=batches.append, **kwargs)
    ref_kv = step.target.kv_stack[..., : len(prompt) + len(ref.token_ids) - 1, :].clone()
    got = ahead.generate(prompt, max_new_tokens, on_tokens=streamed.extend, **kwargs)
    got_kv = ahead.target.kv_stack[..., : len(prompt) + len(got.token_ids) - 1, :]
    assert got.token_ids == ref.token_ids == streamed
    assert got.metrics.num_verify_steps == ref.metrics.num_verify_steps
    assert got.metrics.accepted_per_position == ref.metrics.accepted_per_position
    assert (
        ahead.draft_cache.length == step.draft_cache.length
    )  # the host's books: the entries committed
    torch.testing.assert_close(got_kv, ref_kv, rtol=1e-4, atol=1e-5)
    # the runner's round i > 0 is launched ahead iff its round i - 1 cannot end the request by
    # length and round i fits the cache's free slots after round i - 1's most; the output before
    # that one: ends[i] (batches: the prefill's token, the first round's run step by step, then
    # the runner's, then eager ones cut near the cache's end)
    ends = [sum(map(len, batches[: k + 1])) for k in range(len(batches))]
    runner = ahead.rounds_ahead
    free = lambda end, extra: free_nodes(runner.max_seq_len, len(prompt) + end - 1 + extra)  # noqa: E731
    assert ahead.launched == [
        i > 0 and ends[i] + runner.rows < max_new_tokens and free(ends[i], runner.rows) >= runner.n
        for i in range(len(ahead.launched))
    ]
    # the runner reads the rounds after the first while a whole round fits (none: a sampled
    # request's rounds run step by step)
    read = sum(1 for end in ends[1:-1] if free(end, 0) >= runner.n) if ahead.launched else 0
    assert len(ahead.launched) - read in ((0, 1) if got.finish_reason == "eos" else (0,))
    return got, batches


@torch.no_grad()
@pytest.mark.parametrize(
    "setting",
    [(3, 1, 4), (2, 1, 3), (3, 2, 6), (4, 2, 4), (2, 2, 5), (3, 3, 8), (3, 4, 10), (2, 4, 16)],
)
def test_rounds_run_ahead_and_emit_the_step_by_step_tokens(pairs, monkeypatch, setting):
    """Greedy rounds run ahead (round k + 1 launched before round k's verdict is read; the walk,
    a tree's accepted path's K/V compacted, the next round's pending ids, aux states, count and
    draft cache start, all on the device) emit what the same rounds step by step emit, for
    chains and trees: the same tokens (streamed in order), rounds and accepted drafts per
    position, the same committed K/V and draft cache entries, over rounds that accept none,
    some and all of their depth; max_new_tokens at every distance from a round's end; an EOS
    inside a round. Sampled requests keep the step-by-step rounds."""
    from specdraft.engine.rounds_ahead import padded_rows
    from specdraft.engine.spec_config import SpecConfig

    spec = SpecConfig(*setting)
    step, ahead = _engines(pairs(CHAIN if spec.topk == 1 else TREE), monkeypatch, spec)
    prompt = torch.randint(0, 200, (12,), generator=torch.Generator().manual_seed(3)).tolist()
    got, batches = _run_both(step, ahead, prompt, 36)
    accepted, rounds, depth = (
        got.metrics.accepted_per_position,
        got.metrics.num_verify_steps,
        padded_rows(spec) - 1,
    )
    assert (
        rounds > accepted[0] and accepted[depth - 1] > 0
    )  # rounds accepted none, some and all they could
    ends = [
        sum(map(len, batches[: i + 1])) for i in range(len(batches))
    ]  # output length after each round
    distances = {
        next(end for end in ends if end >= n) - n: n for n in range(ends[1] + 1, ends[-1] + 1)
    }
    assert sorted(distances) == list(
        range(depth + 1)
    )  # 0 = at a round's end, up to a round's size - 1
    full = {
        end for end, batch in zip(ends[2:], batches[2:]) if len(batch) == depth + 1
    }  # ends of rounds
    assert full  # that accepted all: no round may be launched ahead of them
    for n in sorted(full | set(distances.values())):
        _run_both(step, ahead, prompt, n)
    inside = [
        i
        for i, token in enumerate(got.token_ids)
        if i >= ends[1] and got.token_ids.index(token) == i and i + 1 not in ends
    ]
    eos = got.token_ids[inside[0]]
    stopped, _ = _run_both(step, ahead, prompt, 36, eos_ids=[eos])
    assert stopped.token_ids == got.token_ids[: inside[0] + 1] and stopped.finish_reason == "eos"
    ahead.rounds_ahead.run = None  # a sampled request would fail here
    _run_both(step, ahead, prompt, 8, temperature=1.0, seed=4)


@torch.no_grad()
@pytest.mark.parametrize("setting", [(3, 1, 4), (3, 2, 6), (2, 4, 16)])
def test_rounds_ahead_hand_a_request_as_long_as_the_cache_to_cut_rounds(
    pairs, monkeypatch, setting
):
    """prompt + max_new_tokens = max_seq_len: rounds run ahead while a whole round fits the
    cache's free slots (`round.free_nodes`), then the eager rounds, cut, end the request; the
    tokens are plain decoding's and the step-by-step engine's."""
    from specdraft.engine.spec_config import SpecConfig
    from specdraft.engine.speculate import SpeculativeEngine

    spec, prompt = SpecConfig(*setting), list(range(1, 13))
    pair = pairs(CHAIN if spec.topk == 1 else TREE)
    step, ahead = _engines(pair, monkeypatch, spec, max_seq_len=48)
    plain = SpeculativeEngine(pair[0], None, None, None, 48, DEVICE).generate(prompt, 36)
    got, batches = _run_both(step, ahead, prompt, 36)
    assert got.token_ids == plain.token_ids and len(got.token_ids) == 36
    assert any(ahead.launched)  # rounds ran ahead before the cut ones
    assert len(batches[-1]) < spec.num_draft_tokens  # the last round verified fewer nodes


def test_greedy_path_is_the_walk_of_verify_greedy():
    """`kernels.greedy_walk.greedy_path` (Triton's interpreter without a GPU) on random trees
    (parents before children, distinct sibling tokens) and random choices gives `walk`'s
    accepted nodes and bonus, padded with the root; two siblings with the target's choice, at
    the root or deeper, give ok False (the host's walk raises there)."""
    pytest.importorskip("triton")
    from specdraft.engine.kernels.greedy_walk import greedy_path
    from specdraft.engine.sampling import walk
    from specdraft.engine.tree import depths_of

    gen = torch.Generator().manual_seed(0)
    for _ in range(300):
        n = int(torch.randint(2, 12, (), generator=gen))
        parents = [-1] + [int(torch.randint(0, i, (), generator=gen)) for i in range(1, n)]
        tokens = [0] + [int(torch.randint(0, 3, (), generator=gen)) for _ in range(1, n)]
        for node in range(1, n):  # siblings distinct: a later duplicate moves to an unused token
            if tokens[node] in [tokens[j] for j in range(1, node) if parents[j] == parents[node]]:
                tokens[node] = 10 + node
        choices = torch.randint(0, 3, (n,), generator=gen).tolist()
        verdict = walk(parents, tokens, choices)
        length = max(depths_of(parents)) + 1  # the longest path's nodes
        path, accepted, ok = (
            t.cpu()
            for t in greedy_path(
                *(torch.tensor(x, device=DEVICE) for x in (tokens, parents, choices)), length
            )
        )
        assert bool(ok) and int(accepted) == len(verdict.accepted)
        assert path.tolist() == [0] + verdict.accepted + [0] * (length - 1 - len(verdict.accepted))
        assert choices[int(path[int(accepted)])] == verdict.bonus
    for parents, tokens, choices in (
        ([-1, 0, 0], [0, 1, 1], [1, 0, 0]),
        ([-1, 0, 1, 1], [0, 1, 2, 2], [1, 2, 0, 0]),
    ):
        out = greedy_path(*(torch.tensor(x, device=DEVICE) for x in (tokens, parents, choices)), 3)
        assert not bool(out[2])


@torch.no_grad()
def test_a_round_ahead_whose_nodes_are_no_tree_is_refused(pairs, monkeypatch):
    """A verdict whose tree check fails (two siblings taken, or a node selected without its
    parent) raises RuntimeError when the host reads it, as the step-by-step round does."""
    from specdraft.engine.kernels import greedy_walk
    from specdraft.engine.spec_config import SpecConfig

    _, ahead = _engines(pairs(TREE), monkeypatch, SpecConfig(3, 2, 6))
    path = greedy_walk.greedy_path
    twins = torch.zeros(1, dtype=torch.bool, device=DEVICE)
    monkeypatch.setattr(greedy_walk, "greedy_path", lambda *args: (*path(*args)[:2], twins))
    with pytest.raises(RuntimeError, match="no tree of distinct siblings"):
        ahead.generate(list(range(1, 13)), 24)


@pytest.mark.skipif(not CUDA, reason="CUDA graphs and compiled target layers")
@pytest.mark.parametrize("setting", [(3, 1, 4), (3, 2, 6), (4, 4, 12)])
@torch.no_grad()
def test_a_compiled_engine_runs_ahead_and_emits_its_step_by_step_tokens(pairs, setting):
    """compile=True builds the RoundsAhead of a chain and of trees (Triton kernels, CUDA graphs):
    the same greedy tokens and rounds as the same engine's rounds step by step."""
    from specdraft.engine.spec_config import SpecConfig
    from specdraft.engine.speculate import SpeculativeEngine

    target, draft = pairs(CHAIN)
    target = copy.deepcopy(target)  # compile=True compiles the target's layers in place
    engine = SpeculativeEngine(target, draft, SpecConfig(*setting), None, 64, DEVICE, compile=True)
    assert (
        engine.rounds_ahead is not None
        and engine.target_kernels == engine.draft_kernels == "triton"
    )
    prompt = list(range(1, 13))
    got = engine.generate(prompt, 24)
    engine.rounds_ahead = None
    ref = engine.generate(prompt, 24)
    assert got.token_ids == ref.token_ids
    assert got.metrics.num_verify_steps == ref.metrics.num_verify_steps


@pytest.mark.skipif(not CUDA, reason="CUDA graphs and compiled target layers")
@pytest.mark.parametrize("setting", [(3, 1, 4), (4, 4, 12)])
@torch.no_grad()
def test_a_compiled_engine_serves_a_first_request_as_long_as_the_cache(pairs, setting):
    """A fresh compiled engine whose first request is prompt 40 + 8 new tokens = max_seq_len 48:
    graphs first captured while the prompt holds the cache's last slots (their warm-ups' K/V
    put back), rounds cut near the end: the tokens of the same request run again with every
    graph captured (bfloat16: an uncompiled engine may break ties otherwise)."""
    from specdraft.engine.spec_config import SpecConfig
    from specdraft.engine.speculate import SpeculativeEngine

    target, draft = pairs(CHAIN)
    target = copy.deepcopy(target)  # compile=True compiles the target's layers in place
    engine = SpeculativeEngine(target, draft, SpecConfig(*setting), None, 48, DEVICE, compile=True)
    prompt = list(range(1, 41))
    first = engine.generate(prompt, 8)
    assert len(first.token_ids) == 8
    assert first.token_ids == engine.generate(prompt, 8).token_ids
