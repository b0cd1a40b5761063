"""Case FC-14 (engine side): tree drafting with topk 2 reproduces topk 1 greedy output tokens,
and the tree's depth-1/depth-2 nodes contain the chain's drafts with the same draft scores
(a wrong tree attention mask at later steps would change them). The training-side half of
FC-14 (vectorised TTT attention vs a naive recursion) is tests/cases/test_case_fc14_ttt_attention.py.
"""

from __future__ import annotations

import pytest
import torch

from specdraft.engine.eagle_tree import EagleTree
from specdraft.engine.sampling import SamplingParams
from specdraft.engine.spec_config import SpecConfig
from tests.support.engine_helpers import one_thread, random_prompts, tiny_setup  # noqa: F401

NUM_PROMPTS, PROMPT_LEN, NUM_NEW = 20, 8, 24


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_case_fc14_topk2_tree_reproduces_topk1_greedy_tokens(arch):
    setup = tiny_setup(arch)
    prompts = random_prompts(NUM_PROMPTS, PROMPT_LEN, seed=30)
    chain = setup.engine(setup.trained, SpecConfig.chain(3))
    chain_out = [chain.generate(p, NUM_NEW).token_ids for p in prompts]
    tree = setup.engine(setup.trained, SpecConfig(3, 2, 8))
    assert [tree.generate(p, NUM_NEW).token_ids for p in prompts] == chain_out
    assert tree.total.accept_length >= chain.total.accept_length > 1.0


def _first_tree(engine, prompt, proposer=None):
    """The first round's draft tree; proposer: a class to draft with instead of the engine's
    (`EagleTree` on a chain setting: the tree steps with topk 1, which give scores)."""
    if proposer is not None:
        engine.proposer = proposer(
            engine.fast_draft,
            engine.draft_cache,
            engine.spec,
            engine.draft_vocab,
            engine.target.args.vocab_size,
            engine.runner,
        )
    req = engine.new_request(prompt, 8, SamplingParams(), (), None, None, None)
    req.emit([engine.prefill(req)])
    proposal = engine.proposer.propose(req)
    return proposal.tree if proposer is not None or engine.spec.topk > 1 else proposal


@torch.no_grad()
def test_case_fc14_tree_holds_the_chain_drafts_with_equal_scores():
    setup = tiny_setup("llama")
    full = SpecConfig(2, 2, SpecConfig(2, 2, 2).max_draft_tokens)  # every candidate kept: 1 + 2 + 4
    for prompt in random_prompts(5, PROMPT_LEN, seed=31):
        drafted = _first_tree(setup.engine(setup.trained, SpecConfig.chain(2)), prompt)
        chain = _first_tree(setup.engine(setup.trained, SpecConfig.chain(2)), prompt, EagleTree)
        assert drafted.tokens.tolist() == chain.tokens.tolist()  # EagleChain = the topk-1 tree
        tree = _first_tree(setup.engine(setup.trained, full), prompt)
        d1, d2 = chain.tokens[1:].tolist()
        node1 = next(
            i for i in range(1, tree.num_nodes) if tree.parents[i] == 0 and tree.tokens[i] == d1
        )
        node2 = next(
            i for i in range(1, tree.num_nodes) if tree.parents[i] == node1 and tree.tokens[i] == d2
        )
        torch.testing.assert_close(tree.scores[[node1, node2]], chain.scores[1:], rtol=0, atol=1e-5)
