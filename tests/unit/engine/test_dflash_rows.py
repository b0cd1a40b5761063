"""`engine.dflash_rows`: a DFlash drafter in the batch loop. At T = 0 (fp32) every sequence of a
batch emits its single-sequence output (the batch-1 engine's `DFlashBlock`), with prompts of
different lengths and sequences joining and leaving between rounds, the blocks of all rows drafted
in one drafter forward (`draft_blocks`) or each row's in turn, on the fast target and on the
transformers-backed one; K follows the schedule (K = 0 rounds keep the context growing); a
schedule tree is refused."""

from __future__ import annotations

import functools

import pytest

from specdraft.engine.batch import BatchScheduler
from specdraft.engine.dflash_rows import DFlashRows
from specdraft.engine.schedule import BatchSchedule, ScheduleError
from specdraft.engine.spec_config import SpecConfig
from tests.support.batch import NUM_NEW, prompts, requests, staggered_run
from tests.support.dflash import TINY_BLOCK, engine_dflash_draft
from tests.support.engine_helpers import (  # noqa: F401
    greedy_sequences,
    hf_setup,
    one_thread,
    random_prompts,
    tiny_setup,
)


@functools.cache
def trained(hf: bool):
    """(setup, a DFlash drafter trained briefly on the target's greedy continuations)."""
    setup = hf_setup("llama") if hf else tiny_setup("llama")
    sequences = greedy_sequences(setup.target, random_prompts(16, 6, seed=2), 12)
    return setup, engine_dflash_draft(setup.target, sequences, 6, 60)


def engine(hf: bool, num_steps: int):
    setup, draft = trained(hf)
    return setup.engine(draft, SpecConfig.chain(num_steps))


def single_outputs(eng) -> list[list[int]]:
    """Each prompt generated alone (the batch-1 engine, greedy)."""
    return [eng.generate(p, n).token_ids for p, n in zip(prompts(), NUM_NEW)]


def batch_outputs(scheduler, reqs) -> list[list[int]]:
    results = staggered_run(scheduler, reqs)
    return [results[id(req)].token_ids for req in reqs]


@pytest.mark.parametrize("batch_drafts", [True, False])
@pytest.mark.parametrize("num_steps", [2, TINY_BLOCK - 1])
def test_fast_target_batch_equals_each_sequence_alone(num_steps, batch_drafts):
    eng = engine(False, num_steps)
    reference = single_outputs(eng)
    scheduler = BatchScheduler(eng, 3, batch_drafts=batch_drafts)
    assert isinstance(scheduler.draft_rows, DFlashRows)
    reqs = requests(eng)
    assert batch_outputs(scheduler, reqs) == reference
    accepted = sum(s.metrics.num_accepted_tokens for s in scheduler.stats.values())
    assert accepted > 0 and set(scheduler.stats) == {1, 2, 3}


def test_transformers_target_batch_equals_each_sequence_alone():
    eng = engine(True, TINY_BLOCK - 1)
    reference = single_outputs(eng)
    reqs = requests(eng)
    assert batch_outputs(BatchScheduler(eng, 3), reqs) == reference


def test_k_follows_the_schedule_and_k_0_keeps_the_context():
    eng = engine(False, 3)
    reference = single_outputs(eng)
    schedule = BatchSchedule.of([[1, 1, 3], [2, 2, 0], [3, 4, 2]])
    scheduler = BatchScheduler(eng, 4, schedule)
    reqs = requests(eng)
    assert batch_outputs(scheduler, reqs) == reference
    assert scheduler.stats[2].metrics.num_drafted_tokens == 0
    # drafting resumed after the K = 0 rounds (the batch shrinks 2 -> 1 as sequences finish)
    assert scheduler.stats[1].metrics.num_drafted_tokens > 0
    assert sum(scheduler.stats[b].metrics.num_accepted_tokens for b in (1, 3, 4)) > 0


def test_a_schedule_tree_is_refused_for_a_dflash_drafter():
    schedule = BatchSchedule.of([[1, 4, 3]]).with_trees([[1, 4, 2, 5]])
    with pytest.raises(ScheduleError, match="a DFlash drafter proposes chains only"):
        BatchScheduler(engine(False, 3), 4, schedule)


def test_rows_as_long_as_the_cache_equal_each_sequence_alone():
    """prompt + max_new_tokens = max_seq_len = the drafter's 128 positions (the engine's
    longest request), rows of different lengths: each row's rounds cut near the cache's end
    (`round.free_nodes`), the batch's outputs the single-sequence ones."""
    from specdraft.engine.sampling import SamplingParams
    from specdraft.engine.speculate import SpeculativeEngine

    setup, draft = trained(False)
    positions = draft.cfg.max_position_embeddings
    eng = SpeculativeEngine(setup.target, draft, SpecConfig.chain(3), None, positions, "cpu")
    assert positions == 128 == eng.longest_request()
    lengths = (112, 122, 116, 125)
    prompts_ = [random_prompts(1, n, seed=60 + i)[0] for i, n in enumerate(lengths)]
    reference = [eng.generate(p, positions - len(p)).token_ids for p in prompts_]
    assert all(len(r) == positions - n for r, n in zip(reference, lengths))
    reqs = [
        eng.new_request(p, positions - len(p), SamplingParams(), (), None, None, None)
        for p in prompts_
    ]
    assert batch_outputs(BatchScheduler(eng, 3), reqs) == reference
