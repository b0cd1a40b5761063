"""Case FC-10: temperature must not be ignored in verification.

T = 0 output equals the target's greedy output (also tests/unit/engine/test_speculate.py). At T = 1
the first two generated tokens of the speculative engine follow the target's exact two-token
joint distribution (computed from its logits), by a chi-square test over 3 prompts x 400
samples (p > 1e-3), also with top-k / top-p; deliberately biased verifiers (always accept the
draft; verify as if T were 0) fail the same test at the same sample size (p < 1e-6). At T > 0 outputs vary with the seed and repeat with it.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from specdraft.engine import sampling
from specdraft.engine.sampling import (
    SamplingParams,
    Verdict,
    logits_to_probs,
    sample,
    verify_greedy,
)
from specdraft.engine.spec_config import SpecConfig
from tests.support.engine_helpers import VOCAB, one_thread, random_prompts, target_pass, tiny_setup  # noqa: F401

NUM_PROMPTS, SAMPLES_PER_PROMPT, PROMPT_LEN = 3, 400, 6
PASS_P, FAIL_P = 1e-3, 1e-6
MIN_EXPECTED = 5.0
SETTINGS = {  # name -> (spec, sampling); chain: speculative sampling, tree: target-only verification
    "chain-T1": (SpecConfig.chain(2), SamplingParams(1.0)),
    "tree-T1": (SpecConfig(2, 2, 4), SamplingParams(1.0)),
    "chain-T0.8-topk8-topp0.9": (SpecConfig.chain(2), SamplingParams(0.8, top_p=0.9, top_k=8)),
}


@torch.no_grad()
def exact_joint(setup, prompt: list[int], params: SamplingParams) -> np.ndarray:
    """P(x1, x2 | prompt) [V, V] from the target's logits (the same logits_to_probs)."""
    logits, _ = target_pass(setup.target, torch.tensor([prompt]))
    first = logits_to_probs(logits[0, -1], params)
    batch = torch.tensor([prompt + [x] for x in range(VOCAB)])
    logits, _ = target_pass(setup.target, batch)
    second = logits_to_probs(logits[:, -1], params)
    joint = (first[:, None] * second).double().numpy()
    return joint / joint.sum()


def chi_square_pvalue(setup, spec: SpecConfig, params: SamplingParams) -> float:
    """Pooled chi-square p-value of the engine's first two tokens against the exact joint;
    cells expected below MIN_EXPECTED are merged per prompt."""
    engine = setup.engine(setup.trained, spec)
    observed, expected = [], []
    for i, prompt in enumerate(random_prompts(NUM_PROMPTS, PROMPT_LEN, seed=20)):
        joint = exact_joint(setup, prompt, params).reshape(-1) * SAMPLES_PER_PROMPT
        counts = np.zeros(VOCAB * VOCAB)
        for s in range(SAMPLES_PER_PROMPT):
            x1, x2 = engine.generate(
                prompt, 2, params.temperature, params.top_p, params.top_k, seed=1000 * i + s
            ).token_ids
            counts[x1 * VOCAB + x2] += 1
        big = joint >= MIN_EXPECTED
        observed += [*counts[big], counts[~big].sum()]
        expected += [*joint[big], joint[~big].sum()]
    return chisquare(observed, expected, ddof=NUM_PROMPTS - 1).pvalue


def always_accept_chain(target_probs, draft_probs, drafts, generator):
    """Biased: accept every draft, bonus from the target after the last."""
    n = drafts.numel()
    return Verdict(list(range(1, n + 1)), int(sample(target_probs[n], generator)))


def always_descend_tree(parents, tokens, target_probs, generator):
    """Biased: follow the first child at every node, bonus from the target at the leaf."""
    node, accepted = 0, []
    while node in parents:
        node = parents.index(node)  # its first child
        accepted.append(node)
    return Verdict(accepted, int(sample(target_probs[node], generator)))


@pytest.mark.parametrize("name", list(SETTINGS))
def test_case_fc10_first_two_tokens_follow_the_target(name):
    spec, params = SETTINGS[name]
    assert chi_square_pvalue(tiny_setup("llama"), spec, params) > PASS_P


def temperature_ignored_chain(target_probs, draft_probs, drafts, generator):
    """Biased: verify a sampled chain as if T were 0 (argmax match, argmax bonus)."""
    n = drafts.numel()
    return verify_greedy(list(range(-1, n)), [-1] + drafts.tolist(), target_probs)


BIASED = {  # name -> (setting, sampling functions replaced)
    "always-accept-chain": ("chain-T1", {"verify_chain": always_accept_chain}),
    "always-descend-tree": ("tree-T1", {"verify_tree": always_descend_tree}),
    "temperature-ignored": ("chain-T1", {"verify_chain": temperature_ignored_chain}),
}


@pytest.mark.parametrize("name", list(BIASED))
def test_case_fc10_biased_verifier_fails_the_same_test(name, monkeypatch):
    setting, replaced = BIASED[name]
    for function, biased in replaced.items():
        monkeypatch.setattr(sampling, function, biased)
    spec, params = SETTINGS[setting]
    assert chi_square_pvalue(tiny_setup("llama"), spec, params) < FAIL_P


def test_case_fc10_sampling_varies_with_the_seed_and_repeats_with_it():
    setup = tiny_setup("llama")
    engine = setup.engine(setup.trained, SpecConfig(3, 2, 6))
    prompt = random_prompts(1, PROMPT_LEN, seed=21)[0]
    outputs = [
        tuple(engine.generate(prompt, 12, temperature=1.0, seed=s).token_ids) for s in range(6)
    ]
    assert len(set(outputs)) > 1
    assert engine.generate(prompt, 12, temperature=1.0, seed=3).token_ids == list(outputs[3])
    greedy = {tuple(engine.generate(prompt, 12, seed=s).token_ids) for s in range(3)}
    assert len(greedy) == 1
