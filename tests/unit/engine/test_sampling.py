"""specdraft.engine.sampling: logits -> probs, and the three acceptance rules on hand-made trees
and distributions (exact values, and Monte Carlo against the exact first-token distribution)."""

from __future__ import annotations

import pytest
import torch
from scipy.stats import chisquare

from specdraft.engine.sampling import (
    SamplingParams,
    children_of,
    logits_to_probs,
    verify_chain,
    verify_greedy,
    verify_tree,
)

P_VALUE = 1e-3


def test_greedy_probs_are_one_hot_at_argmax():
    probs = logits_to_probs(torch.tensor([[0.1, 2.0, -1.0], [3.0, 0.0, 0.0]]), SamplingParams())
    assert probs.tolist() == [[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]]


def test_temperature_top_k_top_p_exact():
    logits = torch.tensor([0.5, 0.3, 0.15, 0.05]).log()
    assert torch.allclose(
        logits_to_probs(logits, SamplingParams(1.0)), torch.tensor([0.5, 0.3, 0.15, 0.05])
    )
    hot = logits_to_probs(logits, SamplingParams(2.0))
    assert torch.allclose(hot, (logits / 2).softmax(-1))
    top2 = logits_to_probs(logits, SamplingParams(1.0, top_k=2))
    assert torch.allclose(top2, torch.tensor([0.625, 0.375, 0.0, 0.0]))
    # top_p 0.75: 0.5 < 0.75 so 0.3 is needed too; 0.5 + 0.3 >= 0.75, so 0.15 is dropped
    nucleus = logits_to_probs(logits, SamplingParams(1.0, top_p=0.75))
    assert torch.allclose(nucleus, torch.tensor([0.625, 0.375, 0.0, 0.0]))
    tiny_p = logits_to_probs(logits, SamplingParams(1.0, top_p=0.01))  # the largest is always kept
    assert tiny_p.tolist() == [1.0, 0.0, 0.0, 0.0]


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(temperature=-1.0), "temperature"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_k=-2), "top_k"),
    ],
)
def test_sampling_params_refuse_bad_values(kwargs, field):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)


# root 0 -> {3: node 1, 5: node 2}; node 1 -> {7: node 3}; node 2 -> {7: node 4}
PARENTS = [-1, 0, 0, 1, 2]
TOKENS = [9, 3, 5, 7, 7]


def _logits_with_argmax(argmax: list[int], vocab: int = 10) -> torch.Tensor:
    return torch.nn.functional.one_hot(torch.tensor(argmax), vocab).float()


def test_greedy_accepts_longest_matching_path():
    assert verify_greedy(PARENTS, TOKENS, _logits_with_argmax([5, 0, 7, 0, 8])).accepted == [2, 4]
    assert verify_greedy(PARENTS, TOKENS, _logits_with_argmax([5, 0, 7, 0, 8])).bonus == 8
    verdict = verify_greedy(PARENTS, TOKENS, _logits_with_argmax([3, 1, 0, 0, 0]))
    assert (verdict.accepted, verdict.bonus) == ([1], 1)
    verdict = verify_greedy(PARENTS, TOKENS, _logits_with_argmax([4, 7, 7, 0, 0]))
    assert (verdict.accepted, verdict.bonus) == ([], 4)


def test_siblings_with_one_token_are_refused():
    with pytest.raises(ValueError, match="two children with token 3"):
        children_of([-1, 0, 0], [1, 3, 3])


def test_chain_speculative_sampling_first_token_is_target_distributed():
    """Drafts d1 ~ q1, d2 ~ q2; the first emitted token must follow p0 exactly, and d1 must be
    accepted with probability sum_x min(p0(x), q1(x)) (Leviathan et al. 2023, beta)."""
    gen = torch.Generator().manual_seed(0)
    p = torch.tensor([[0.5, 0.3, 0.1, 0.1], [0.1, 0.2, 0.3, 0.4], [0.25, 0.25, 0.25, 0.25]])
    q = torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.4, 0.3, 0.2, 0.1]])
    trials, counts, accepted_first = 6000, torch.zeros(4), 0
    for _ in range(trials):
        drafts = torch.multinomial(q, 1, generator=gen)[:, 0]
        verdict = verify_chain(p, q, drafts, gen)
        first = int(drafts[0]) if verdict.accepted else verdict.bonus
        counts[first] += 1
        accepted_first += bool(verdict.accepted)
    assert chisquare(counts.numpy(), (p[0] * trials).numpy()).pvalue > P_VALUE
    beta = torch.minimum(p[0], q[0]).sum().item()  # 0.1 + 0.2 + 0.1 + 0.1 = 0.5
    assert abs(accepted_first / trials - beta) < 4 * (beta * (1 - beta) / trials) ** 0.5


def test_chain_all_accepted_when_draft_equals_target():
    p = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [1.0, 0.0, 0.0]])
    verdict = verify_chain(p, p[:2], torch.tensor([1, 2]), torch.Generator().manual_seed(0))
    assert (verdict.accepted, verdict.bonus) == ([1, 2], 0)


def test_target_only_tree_first_token_is_target_distributed():
    gen = torch.Generator().manual_seed(1)
    vocab = 10
    probs = torch.full((5, vocab), 0.02)
    probs[0, :5] = torch.tensor([0.3, 0.1, 0.2, 0.15, 0.15])  # root; children carry tokens 3 and 5
    probs = probs / probs.sum(-1, keepdim=True)
    trials, counts = 4000, torch.zeros(vocab)
    for _ in range(trials):
        verdict = verify_tree(PARENTS, TOKENS, probs, gen)
        counts[TOKENS[verdict.accepted[0]] if verdict.accepted else verdict.bonus] += 1
    assert chisquare(counts.numpy(), (probs[0] * trials).numpy()).pvalue > P_VALUE
