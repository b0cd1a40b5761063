"""specdraft.engine.round: a `Proposer` that is neither the EAGLE chain nor the tree (a toy block
proposer of fixed tokens) runs through the same round, losslessly: a new method adds a class."""

import torch

from specdraft.engine.round import Proposal
from tests.support.engine_helpers import random_prompts, tiny_setup


class FixedBlock:
    """Proposes the same block of `size` tokens every round, whatever was accepted; counts the
    rounds it saw accepted and what they kept."""

    drafts, timed = True, False

    def __init__(self, size: int) -> None:
        self.size, self.kept = size, []

    def prefilled(self, req, ids, token, aux) -> None:
        pass

    def propose(self, req) -> Proposal:
        block = [req.output_ids[-1]] + [(req.output_ids[-1] + i) % 7 for i in range(self.size)]
        return Proposal(torch.tensor(block), None, None, None, self.size)

    def accepted(self, req, emitted, path, aux) -> None:
        assert path is None and 1 <= len(emitted) <= self.size + 1
        self.kept.append(len(emitted))

    def drafting(self, elapsed: float) -> float:
        return 0.0


def test_a_block_proposer_runs_the_same_round_losslessly():
    setup = tiny_setup("llama")
    plain = setup.engine(None, None)
    for prompt in random_prompts(3, 10, seed=11):
        expected = plain.generate(prompt, 16).token_ids
        engine = setup.engine(None, None)
        engine.proposer = block = FixedBlock(3)
        result = engine.generate(prompt, 16)
        assert result.token_ids == expected
        steps = result.metrics.num_verify_steps
        assert steps == len(block.kept) and result.metrics.num_drafted_tokens == 3 * steps
        assert result.metrics.num_emitted_tokens == sum(block.kept)


def test_a_request_as_long_as_the_cache_decodes_as_plain_decoding():
    """prompt + max_new_tokens = max_seq_len = the target's 256 positions (the server's
    max_model_len): chains and trees cut their last rounds to the cache's free slots
    (`round.free_nodes`; the last one, one token left, the root alone) and emit the plain
    greedy tokens, with no slot written past the cache."""
    from specdraft.engine.round import free_nodes
    from specdraft.engine.spec_config import SpecConfig
    from specdraft.engine.speculate import SpeculativeEngine

    setup = tiny_setup("llama")
    positions = setup.target.args.max_position_embeddings
    assert positions == 256 and free_nodes(positions, positions - 2) == 1

    def engine(spec):
        draft = None if spec is None else setup.trained
        return SpeculativeEngine(setup.target, draft, spec, None, positions, "cpu")

    plain = engine(None)
    for prompt_len in (216, 250):
        prompt = random_prompts(1, prompt_len, seed=12)[0]
        max_new = positions - prompt_len
        expected = plain.generate(prompt, max_new).token_ids
        assert len(expected) == max_new
        for spec in (SpecConfig.chain(3), SpecConfig(3, 2, 6), SpecConfig(4, 4, 16)):
            result = engine(spec).generate(prompt, max_new)
            assert result.token_ids == expected, (prompt_len, spec)
            metrics = result.metrics
            # the last rounds drafted fewer than the setting's nodes
            assert (
                metrics.num_drafted_tokens < (spec.num_draft_tokens - 1) * metrics.num_verify_steps
            )
        sampled = engine(SpecConfig(3, 2, 6)).generate(prompt, max_new, temperature=1.0, seed=3)
        assert len(sampled.token_ids) == max_new
