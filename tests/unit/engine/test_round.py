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
