"""Case FC-10: temperature must not be ignored in verification.

T = 0 output equals the target's greedy output (also tests/unit/engine/test_speculate.py). At T = 1
the first two generated tokens of the speculative engine follow the target's exact two-token
joint distribution (computed from its logits), by a chi-square test over 3 prompts x 400
samples (p > 1e-3), also with top-k / top-p; deliberately biased verifiers (always accept the
draft; verify as if T were 0) fail the same test at the same sample size (p < 1e-6). At T > 0 outputs vary with the seed and repeat with it.
"""

from __future__ import annotations

import pytest

from specdraft.engine import sampling
from specdraft.engine.sampling import (
    SamplingParams,
    Verdict,
    sample,
    verify_greedy,
)
from specdraft.engine.spec_config import SpecConfig
from tests.support.engine_helpers import (  # noqa: F401
    FAIL_P,
    PASS_P,
    PROMPT_LEN,
    VOCAB,
    chi_square_pvalue,
    one_thread,
    random_prompts,
    target_pass,
    tiny_setup,
)

SETTINGS = {  # name -> (spec, sampling); chain: speculative sampling, tree: target-only verification
    "chain-T1": (SpecConfig.chain(2), SamplingParams(1.0)),
    "tree-T1": (SpecConfig(2, 2, 4), SamplingParams(1.0)),
    "chain-T0.8-topk8-topp0.9": (SpecConfig.chain(2), SamplingParams(0.8, top_p=0.9, top_k=8)),
}


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
