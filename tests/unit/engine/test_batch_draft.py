"""`engine.batch_draft`: every row's EAGLE-3 chain or tree drafted in one drafter forward per step
gives each sequence the drafts it gets alone (its `EagleChain` / `EagleTree`): the same
acceptance counts at T = 0, the same sampled outputs at T = 1 (each request's generator drawn in
the same order)."""

from __future__ import annotations

import pytest

from specdraft.engine.batch import BatchScheduler
from specdraft.engine.sampling import SamplingParams
from specdraft.engine.spec_config import SpecConfig
from tests.support.batch import requests, staggered_run
from tests.support.engine_helpers import hf_setup, one_thread, tiny_setup  # noqa: F401


def run(engine, batch_drafts: bool, params: SamplingParams):
    """`staggered_run` through three rows: each request's (output, accepted per position), in
    the order added."""
    reqs = requests(engine, params=params)
    results = staggered_run(BatchScheduler(engine, 3, batch_drafts=batch_drafts), reqs)
    return [(results[id(r)].token_ids, results[id(r)].metrics.accepted_per_position) for r in reqs]


@pytest.mark.parametrize("spec", [SpecConfig.chain(3), SpecConfig(3, 2, 6)], ids=["chain", "tree"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("where", ["fast", "transformers"])
def test_drafted_together_equals_drafted_in_turn(where, temperature, spec):
    setup = tiny_setup("llama") if where == "fast" else hf_setup("llama")
    engine = setup.engine(setup.trained, spec)
    params = SamplingParams(temperature=temperature)
    together, in_turn = run(engine, True, params), run(engine, False, params)
    assert together == in_turn
    assert sum(sum(accepted) for _, accepted in together) > 10  # drafts were accepted
