"""specdraft.serve.scoring: presence / frequency penalties applied to the distribution the
verification uses keep speculation lossless (T = 0: a chain's and a tree's output equal plain
decoding's with the same penalties, and both equal a penalised greedy loop over full forwards),
and the scores of the emitted tokens are the target's own log-softmax (greedy and sampled, with
the prompt's for echo); the engine's round target is restored afterwards."""

from __future__ import annotations

import pytest
import torch

from specdraft.engine.spec_config import SpecConfig
from specdraft.serve.scoring import ScoredTarget, path_counts, scoring
from tests.support.engine_helpers import (  # noqa: F401
    one_thread,
    random_prompts,
    target_pass,
    tiny_setup,
)
from tests.support.serve_helpers import engine, own_target

NUM_NEW = 24
# (presence, frequency): repetition discouraged, and encouraged (a draft repeating a token on
# its own path then meets the penalty on that path)
PENALTIES = [(0.8, 0.6), (-1.5, -0.5)]


def penalised_greedy(
    target, prompt: list[int], num_new: int, presence: float, frequency: float
) -> list[int]:
    """The reference: each token the argmax of a full forward's last logits less the
    penalties on the output so far (independent of the engine and of ScoredTarget)."""
    ids, out = list(prompt), []
    for _ in range(num_new):
        logits = target_pass(target, torch.tensor([ids]))[0][0, -1]
        counts = torch.zeros_like(logits)
        for t in out:
            counts[t] += 1
        logits = logits - frequency * counts - presence * (counts > 0).float()
        token = int(logits.argmax())
        ids.append(token)
        out.append(token)
    return out


def scored_run(eng, prompt, num_top=None, presence=0.0, frequency=0.0, echo=False, **kw):
    """(output ids, scores per token, prompt scores) of one scored generation."""
    target = ScoredTarget(eng.runner, num_top, presence, frequency, prompt_scores=echo)
    scores = []

    def on_tokens(ids):
        scores.extend(target.take(ids) or [])

    runner = eng.runner
    with scoring(eng, target):
        result = eng.generate(prompt, NUM_NEW, on_tokens=on_tokens, **kw)
    assert eng.runner is runner  # restored
    return result.token_ids, scores, target.prompt


@pytest.mark.parametrize("presence, frequency", PENALTIES)
def test_penalised_greedy_speculation_equals_penalised_plain_decoding(presence, frequency):
    setup = tiny_setup("llama")
    reference_target = own_target(setup)
    engines = {
        "plain": engine(own_target(setup)),
        "chain": engine(own_target(setup), setup.trained, SpecConfig.chain(3)),
        "tree": engine(own_target(setup), setup.trained, SpecConfig(3, 2, 6)),
    }
    changed = 0
    for prompt in random_prompts(4, 6, seed=31):
        expected = penalised_greedy(reference_target, prompt, NUM_NEW, presence, frequency)
        for name, eng in engines.items():
            out, _, _ = scored_run(eng, prompt, presence=presence, frequency=frequency)
            assert out == expected, (name, prompt)
        plain = engines["plain"].generate(prompt, NUM_NEW).token_ids
        changed += plain != expected
    assert changed >= 2  # the penalties change most outputs: the test can fail
    # the drafts were verified, not bypassed: some were accepted under the penalties
    assert engines["chain"].total.num_accepted_tokens > 0
    assert engines["tree"].total.num_accepted_tokens > 0


def test_scores_are_the_targets_log_softmax_of_each_emitted_token():
    setup = tiny_setup("llama")
    reference_target = own_target(setup)
    spec = engine(own_target(setup), setup.trained, SpecConfig.chain(3))
    prompt = random_prompts(1, 7, seed=32)[0]
    for kwargs in ({}, {"temperature": 0.9, "seed": 5}):
        out, scores, prompt_scores = scored_run(spec, prompt, num_top=3, echo=True, **kwargs)
        rows = target_pass(reference_target, torch.tensor([prompt + out]))[0][0].log_softmax(-1)
        assert [s.token for s in scores] == out
        for i, s in enumerate(scores):
            row = rows[len(prompt) - 1 + i]
            assert abs(s.logprob - float(row[s.token])) < 1e-4
            assert [t for t, _ in s.top] == row.topk(3).indices.tolist()
        assert [s.token for s in prompt_scores] == prompt and prompt_scores[0].logprob is None
        for i, s in enumerate(prompt_scores[1:]):
            assert abs(s.logprob - float(rows[i, prompt[i + 1]])) < 1e-4
    assert spec.total.num_accepted_tokens > 0  # scores of accepted drafts were read too


def test_path_counts_add_each_nodes_path_to_the_output():
    # root 0 (token 7, the output's last), children 1 (token 3) and 2 (token 7), 3 under 1 (3)
    counts = path_counts([-1, 0, 0, 1], [7, 3, 7, 3], output=[5, 7], vocab=10)
    assert counts[:, [3, 5, 7]].tolist() == [[0, 1, 1], [1, 1, 1], [0, 1, 2], [2, 1, 1]]
