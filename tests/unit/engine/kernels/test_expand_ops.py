"""specdraft.engine.kernels.expand_ops against the torch expansion (`tree.TreeExpansion`): the
children's top-k and scores, the next frontier, the draft-cache mask, and whole expansions;
ties go to the lower index. Without a GPU the kernels run in Triton's interpreter
(TRITON_INTERPRET=1, tests/conftest.py)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

if importlib.util.find_spec("triton") is None:
    pytest.skip("Triton is not installed (pip install triton)", allow_module_level=True)

from specdraft.engine.kernels.expand_ops import child_topk, next_frontier, tree_mask  # noqa: E402
from specdraft.engine.sampling import SamplingParams  # noqa: E402
from specdraft.engine.tree import TreeExpansion  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _stable_top(values: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the k largest of each row, ties to the lower index."""
    return torch.sort(-values, dim=-1, stable=True).indices[..., :k]


@pytest.mark.parametrize("f, vocab, k", [(1, 100, 1), (3, 100, 4), (8, 513, 8)])
def test_child_topk_is_log_softmax_top_k_with_ties_to_the_lower_id(f, vocab, k):
    logits = (torch.randn(f, vocab, generator=_gen(0)) * 4).round() / 2  # coarse values: many ties
    logits[0, : k + 2] = logits[0].max()  # the best value k + 2 times in row 0
    row_scores = -torch.rand(f, generator=_gen(1))
    d2t = torch.randperm(4 * vocab, generator=_gen(2))[:vocab]
    tokens, scores = child_topk(logits.to(DEVICE), row_scores.to(DEVICE), d2t.to(DEVICE), k)
    logp = logits.double().log_softmax(-1)
    child = _stable_top(logits, k)
    assert tokens.cpu().tolist() == d2t[child].reshape(-1).tolist()
    assert child[0].tolist() == list(range(k))  # the tied best: the lowest ids, in order
    ref = row_scores[:, None].double() + logp.gather(1, child)
    torch.testing.assert_close(scores.cpu().double(), ref.reshape(-1), rtol=0, atol=1e-5)


def test_child_topk_refuses_more_children_than_the_vocabulary_and_vocabularies_past_its_limit():
    with pytest.raises(ValueError, match="top-5 children of a draft vocabulary of 4"):
        child_topk(
            torch.zeros(1, 4, device=DEVICE),
            torch.zeros(1, device=DEVICE),
            torch.arange(4, device=DEVICE),
            5,
        )
    with pytest.raises(ValueError, match="vocabulary of 4097 .kernel: k <= vocabulary <= 4096"):
        child_topk(
            torch.zeros(1, 4097, device=DEVICE),
            torch.zeros(1, device=DEVICE),
            torch.arange(4097, device=DEVICE),
            2,
        )


def test_an_expansion_past_the_kernels_vocabulary_runs_the_torch_ops():
    """A drafter with more draft ids than a kernel program holds (32000, SpecForge's usual) keeps
    the torch expansion; sampled chains always do."""

    def expansion(vocab: int, sampled: bool = False) -> TreeExpansion:
        return TreeExpansion(
            0,
            4,
            sampled,
            SamplingParams(),
            torch.arange(vocab, device=DEVICE),
            vocab,
            None,
            kernels=True,
        )

    assert (
        expansion(4096).kernels
        and not expansion(32000).kernels
        and not expansion(4096, sampled=True).kernels
    )
    tokens, scores = expansion(32000).add_children(
        torch.randn(1, 32000, generator=_gen(0)).to(DEVICE), False
    )
    assert tokens.shape == scores.shape == (4,)


@pytest.mark.parametrize("f, k, c", [(1, 4, 0), (4, 4, 8), (3, 3, 5)])
def test_next_frontier_takes_the_stable_best_children_and_their_rows(f, k, c):
    n, width = f * k, 40
    scores = -(
        torch.randint(0, 6, (n,), generator=_gen(0)).float() / 4
    )  # ties across rows and within
    tokens = torch.randint(0, 1000, (n,), generator=_gen(1))
    hidden = torch.randn(f, width, generator=_gen(2))
    wide = torch.rand(f, c + 3, generator=_gen(3)) > 0.5  # seen's first c columns: a strided view
    got = next_frontier(
        scores.to(DEVICE), tokens.to(DEVICE), hidden.to(DEVICE), wide.to(DEVICE)[:, :c], k, k, 7
    )
    best = _stable_top(scores, k)
    rows = best // k
    seen = torch.cat([wide[:, :c][rows], torch.eye(k, dtype=torch.bool)], 1)
    for value, ref in zip(got, (scores[best], best + 7, tokens[best], hidden[rows], seen)):
        assert torch.equal(value.cpu(), ref)


def test_next_frontier_refuses_a_frontier_larger_than_the_children():
    with pytest.raises(ValueError, match="a frontier of 5 out of 4 children"):
        next_frontier(
            torch.zeros(4, device=DEVICE),
            torch.zeros(4, dtype=torch.long, device=DEVICE),
            torch.zeros(1, 8, device=DEVICE),
            torch.zeros(1, 0, dtype=torch.bool, device=DEVICE),
            4,
            5,
            0,
        )


def test_tree_mask_is_the_committed_entries_then_what_each_row_sees():
    seen = torch.rand(4, 12, generator=_gen(0)) > 0.5
    committed, length = 30, 2100  # entries in three mask blocks
    got = tree_mask(seen.to(DEVICE), torch.tensor([committed], device=DEVICE), length).cpu()
    ref = torch.zeros(4, length, dtype=torch.bool)
    ref[:, :committed] = True
    ref[:, committed : committed + 12] = seen
    assert torch.equal(got, ref)


@pytest.mark.parametrize("topk, steps", [(1, 4), (4, 3), (8, 3)])
def test_an_expansion_through_the_kernels_is_the_torch_expansion(topk, steps):
    """Round by round on random logits without ties: the same nodes, parents, frontier rows and
    masks; scores to float32 rounding."""
    vocab, width, committed, length = 64, 16, 9, 64
    d2t = torch.randperm(200, generator=_gen(0))[:vocab].to(DEVICE)
    expansions = [
        TreeExpansion(
            torch.tensor([5], device=DEVICE),
            topk,
            False,
            SamplingParams(),
            d2t,
            200,
            None,
            kernels=kernels,
        )
        for kernels in (False, True)
    ]
    prefix = torch.arange(length, device=DEVICE) < committed
    slots = committed + torch.arange(length - committed, device=DEVICE)
    gen, rows = _gen(1), 1
    for step in range(steps):
        logits = torch.randn(rows, vocab, generator=gen).to(DEVICE)
        hidden = torch.randn(rows, width, generator=gen).to(DEVICE)
        outs = [e.expand(logits, hidden, written=step > 0) for e in expansions]
        assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])
        if topk > 1:
            assert torch.equal(expansions[0].seen, expansions[1].seen)
            assert torch.equal(*(e.cache_mask(prefix, slots) for e in expansions))
        rows = topk
    (tokens, scores, parents, _), (k_tokens, k_scores, k_parents, _) = (
        e.candidates() for e in expansions
    )
    assert torch.equal(tokens, k_tokens) and (parents is None or torch.equal(parents, k_parents))
    torch.testing.assert_close(k_scores, scores, rtol=0, atol=1e-5)
