"""specdraft.engine.tree: node selection keeps ancestors, masks, SGLang's expansion counts, and
every tree node's draft score equals an independent chain run along its path."""

from __future__ import annotations

import pytest
import torch

from specdraft.engine.fast_model import causal_mask
from specdraft.engine.sampling import SamplingParams
from specdraft.engine.spec_config import SpecConfig
from specdraft.engine.tree import (
    DraftTree,
    TreeExpansion,
    ancestor_verify_mask,
    framed_ancestors,
    select,
    select_on_device,
    verify_mask,
)
from tests.support.engine_helpers import one_thread, random_prompts, target_pass, tiny_setup  # noqa: F401


def test_select_breaks_ties_towards_ancestors():
    # node 3 (child of 1) ties with its parent; a stable order keeps node 1 first
    assert select([-1, 0, 0, 1], torch.tensor([0.0, -1.0, -0.5, -1.0]), 3) == [0, 1, 2]
    assert select([-1, 0, 1, 2], torch.zeros(4), 3) == [0, 1, 2]  # all tied: a chain prefix
    assert select([-1, 0, 1, 2], torch.zeros(4), 1) == [0]


def test_select_refuses_orphans():
    with pytest.raises(RuntimeError, match="without their parents"):
        select([-1, 0, 1], torch.tensor([0.0, -2.0, -1.0]), 2)


def test_ancestor_and_verify_masks():
    tree = DraftTree(torch.tensor([9, 3, 5, 7]), [-1, 0, 0, 1], [0, 1, 1, 2], torch.zeros(4))
    assert tree.ancestor_mask().int().tolist() == [
        [1, 0, 0, 0],
        [1, 1, 0, 0],
        [1, 0, 1, 0],
        [1, 1, 0, 1],
    ]
    mask = _host_mask(tree, prefix_len=2, num_slots=8)
    assert mask.shape == (1, 1, 4, 8)
    assert mask[0, 0].int().tolist() == [
        [1, 1, 1, 0, 0, 0, 0, 0],
        [1, 1, 1, 1, 0, 0, 0, 0],
        [1, 1, 1, 0, 1, 0, 0, 0],
        [1, 1, 1, 1, 0, 1, 0, 0],
    ]
    chain = DraftTree(torch.tensor([9, 3, 5]), [-1, 0, 1], [0, 1, 2], torch.zeros(3))
    assert _host_mask(chain, prefix_len=2, num_slots=6)[0, 0].int().tolist() == [
        [1, 1, 1, 0, 0, 0],
        [1, 1, 1, 1, 0, 0],
        [1, 1, 1, 1, 1, 0],
    ]


@pytest.mark.parametrize("topk,num_steps,num_keep", [(2, 3, 6), (3, 4, 10), (4, 2, 8), (2, 5, 11)])
def test_selection_on_the_device_is_the_host_selection(topk, num_steps, num_keep):
    """select_on_device (what a captured round runs) keeps the nodes tree_of keeps, in its order,
    with its parents, depths and verify mask, over random expansions; the logits are rounded
    to a few values so that many scores tie (ties go to the earlier node either way)."""
    vocab, prefix, width = 12, 5, 24
    for seed in range(20):
        gen = torch.Generator().manual_seed(seed)
        exp = TreeExpansion(1, topk, False, SamplingParams(), torch.arange(vocab), vocab, None)
        rows, written = 1, False
        for _ in range(num_steps):
            logits = torch.randint(0, 3, (rows, vocab), generator=gen).float()
            exp.expand(logits, torch.zeros(rows, 2), written=written)
            rows, written = topk, True
        tokens, scores, parents, _ = exp.candidates()
        ref = exp.tree(num_keep)
        keep, tree_parents, depths, framed, ok = select_on_device(
            parents, scores, num_keep, num_steps
        )
        assert bool(ok)
        assert tokens[keep].tolist() == ref.tokens.tolist()
        assert (tree_parents.tolist(), depths.tolist()) == (ref.parents, ref.depths)
        assert torch.equal(framed, framed_ancestors(ref.ancestor_mask()))
        for start in (prefix, width - 2):  # the tree inside the slots, then running past them
            mask = ancestor_verify_mask(framed, torch.tensor([start]), torch.arange(width))
            assert torch.equal(mask, _verify_mask_of(ref.ancestor_mask(), start, width))
        assert torch.equal(
            _host_mask(ref, prefix, width)[0, 0],
            _verify_mask_of(ref.ancestor_mask(), prefix, width),
        )


def _verify_mask_of(ancestors: torch.Tensor, start: int, width: int) -> torch.Tensor:
    """The verify mask [N, width] of a tree at slots start.. (ancestors [N, N]), slot by slot."""
    n = ancestors.shape[0]
    mask = torch.zeros(n, width, dtype=torch.bool)
    mask[:, :start] = True
    for j in range(start, min(start + n, width)):
        mask[:, j] = ancestors[:, j - start]
    return mask


def test_selection_on_the_device_flags_orphans():
    """A kept node whose parent was dropped (scores rising along a path) sets ok False, where
    the host's select raises."""
    parents, scores = torch.tensor([-1, 0, 1]), torch.tensor([0.0, -2.0, -1.0])
    assert not bool(select_on_device(parents, scores, 2, 2)[-1])
    assert bool(select_on_device(parents, torch.tensor([0.0, -1.0, -2.0]), 2, 2)[-1])


def test_expansion_counts_and_draft_masks_follow_sglang():
    """topk 2, 3 steps: 2 + 2·4 = 10 candidates; frontier rows see their own ancestors only."""
    torch.manual_seed(0)
    vocab, topk = 16, 2
    exp = TreeExpansion(1, topk, False, SamplingParams(), torch.arange(vocab), vocab, None)
    tokens, hidden = exp.expand(torch.randn(1, vocab), torch.randn(1, 4), written=False)
    assert tokens.shape == (2,) and hidden.shape == (2, 4) and exp.num_scratch == 0
    assert exp.draft_mask(3)[0, 0].int().tolist() == [[1, 1, 1, 1, 0], [1, 1, 1, 0, 1]]
    exp.expand(torch.randn(2, vocab), torch.randn(2, 4), written=True)
    mask = exp.draft_mask(3)[0, 0]  # committed 3, scratch 2 (depth-1 rows), self 2
    assert mask.shape == (2, 7)
    assert mask[:, 3:5].sum(1).tolist() == [1, 1]  # one depth-1 ancestor each
    assert mask[:, 5:].int().tolist() == [[1, 0], [0, 1]]
    exp.expand(torch.randn(2, vocab), torch.randn(2, 4), written=True)
    assert exp.num_nodes == 1 + SpecConfig(3, 2, 6).max_draft_tokens - 1
    tree = exp.tree(6)
    assert tree.num_nodes == 6 and tree.parents[0] == -1
    assert all(p < i for i, p in enumerate(tree.parents) if i)
    for i, p in enumerate(tree.parents[1:], start=1):
        assert tree.depths[i] == tree.depths[p] + 1 and tree.scores[i] <= tree.scores[p]


@pytest.mark.parametrize("topk", [2, 3])
def test_cache_mask_is_the_draft_mask_over_the_whole_cache(topk):
    """cache_mask (built from device values, as a captured round builds it: the committed
    entries, the scratch entries' slots) is draft_mask(committed) padded with False to the
    cache's length."""
    torch.manual_seed(0)
    exp = TreeExpansion(1, topk, False, SamplingParams(), torch.arange(16), 16, None)
    tokens, hidden = exp.expand(torch.randn(1, 16), torch.randn(1, 4), written=False)
    for _ in range(2):
        tokens, hidden = exp.expand(torch.randn(tokens.numel(), 16), hidden, written=True)
        for committed in (0, 3, 7):
            entries = torch.arange(20)
            got = exp.cache_mask(entries < committed, committed + entries)
            want = torch.zeros(tokens.numel(), 20, dtype=torch.bool)
            mask = exp.draft_mask(committed)
            want[:, : mask.shape[-1]] = mask[0, 0]
            assert torch.equal(got, want)
    assert (
        exp.num_scratch == 2 * topk and exp.seen.sum(1).tolist() == [3] * topk
    )  # 2 ancestors, itself


@pytest.mark.parametrize("topk, steps, num_draft_tokens", [(1, 3, 4), (2, 3, 6)])
def test_tree_tokens_written_into_a_given_buffer(topk, steps, num_draft_tokens):
    """tree(out=buf) (the engine's graphed verify input) puts the tokens a plain tree() returns
    into buf itself, and refuses a buffer of another size instead of resizing it."""

    def expanded() -> TreeExpansion:
        torch.manual_seed(1)
        exp = TreeExpansion(1, topk, False, SamplingParams(), torch.arange(16) * 3, 48, None)
        tokens, hidden = exp.expand(torch.randn(1, 16), torch.randn(1, 4), written=False)
        for _ in range(steps - 1):
            tokens, hidden = exp.expand(torch.randn(tokens.numel(), 16), hidden, written=True)
        return exp

    ref = expanded().tree(num_draft_tokens)
    buffer = torch.full((2, num_draft_tokens), -1)
    tree = expanded().tree(num_draft_tokens, out=buffer[0])
    assert (
        tree.tokens.data_ptr() == buffer.data_ptr()
        and buffer[1].tolist() == [-1] * num_draft_tokens
    )
    assert buffer[0].tolist() == ref.tokens.tolist() and tree.parents == ref.parents
    assert torch.equal(tree.scores, ref.scores) and tree.depths == ref.depths
    with pytest.raises(
        ValueError,
        match=f"tree of {num_draft_tokens} nodes written to a token buffer of "
        f"shape \\({num_draft_tokens + 1},\\)",
    ):
        expanded().tree(num_draft_tokens, out=torch.zeros(num_draft_tokens + 1, dtype=torch.long))


@torch.no_grad()
def test_tree_scores_equal_chain_runs_along_each_path():
    """The tree steps (scratch cache + tree masks) give every kept node the same cumulative
    log-prob as running the drafter as a plain chain along that node's path, from scratch."""
    setup = tiny_setup("llama")
    draft, spec = setup.trained, SpecConfig(3, 3, 12)
    engine = setup.engine(draft, spec)
    prompt = random_prompts(1, 10, seed=5)[0]
    req = engine.new_request(prompt, 8, SamplingParams(), (), None, None, None)
    req.emit([engine.prefill(req)])
    tree = engine.proposer.propose(req).tree
    assert tree.num_nodes == 12 and max(tree.depths) >= 2
    ids = torch.tensor([prompt + req.output_ids])
    _, aux = target_pass(setup.target, ids[:, :-1])
    n = len(prompt)
    base = draft(ids[:, 1:], aux, torch.arange(n)[None], first_step=True)
    vocab = draft.draft_to_target(torch.arange(draft.cfg.draft_vocab_size)).tolist()
    draft_id = {token: i for i, token in enumerate(vocab)}
    for node in range(1, tree.num_nodes):
        path = [node]
        while tree.parents[path[-1]] > 0:
            path.append(tree.parents[path[-1]])
        path.reverse()
        logits, hidden, kv, score = base.logits[0, -1], base.hidden[:, -1:], base.kv, 0.0
        for depth, step_node in enumerate(path, start=1):
            token = int(tree.tokens[step_node])
            score += logits.log_softmax(-1)[draft_id[token]].item()
            if depth == len(path):
                break
            out = draft(
                torch.tensor([[token]]),
                hidden,
                torch.tensor([[n - 1 + depth]]),
                first_step=False,
                past_kv=kv,
            )
            logits, hidden, kv = out.logits[0, -1], out.hidden, type(kv).cat([kv, out.kv])
        assert abs(score - float(tree.scores[node])) < 1e-4, (node, path)


def _host_mask(tree, prefix_len, num_slots):
    """The verify's host mask of a DraftTree, as `round.TargetRunner.verify` builds it."""
    if tree.is_chain:
        return causal_mask(prefix_len, tree.num_nodes, num_slots)
    return verify_mask(tree.ancestor_mask(), prefix_len, num_slots)
