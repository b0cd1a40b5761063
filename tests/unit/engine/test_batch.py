"""`engine.batch.BatchScheduler`: at T = 0 (fp32) every sequence of a batch emits its own
single-sequence greedy output, with prompts of different lengths and sequences joining and
leaving between rounds, for plain decoding, EAGLE-3 chains and trees, on the fast target and on
the transformers-backed one; K follows the schedule's value for each batch size."""

from __future__ import annotations

import pytest

from specdraft.engine.batch import ABORTED, BatchScheduler
from specdraft.engine.errors import EngineError
from specdraft.engine.sampling import SamplingParams
from specdraft.engine.schedule import BatchSchedule, ScheduleError
from specdraft.engine.spec_config import SpecConfig
from tests.support.batch import NUM_NEW, prompts, requests, staggered_run
from tests.support.engine_helpers import (  # noqa: F401
    hf_setup,
    one_thread,
    random_prompts,
    tiny_setup,
)

SETTINGS = {
    "plain": None,
    "chain": SpecConfig.chain(3),
    "tree": SpecConfig(3, 2, 6),
}


def engine_of(setup, setting: str):
    spec = SETTINGS[setting]
    return setup.engine(None if spec is None else setup.trained, spec)


def single_outputs(engine) -> list[list[int]]:
    """Each prompt generated alone (the batch-1 engine, greedy)."""
    return [engine.generate(p, n).token_ids for p, n in zip(prompts(), NUM_NEW)]


def outputs_of(scheduler, reqs) -> dict[int, list[int]]:
    """`staggered_run`'s outputs: {id(request): its tokens}."""
    return {key: result.token_ids for key, result in staggered_run(scheduler, reqs).items()}


@pytest.mark.parametrize("setting", SETTINGS)
def test_fast_target_batch_equals_each_sequence_alone(setting):
    engine = engine_of(tiny_setup("llama"), setting)
    reference = single_outputs(engine)
    reqs = requests(engine)
    outputs = outputs_of(BatchScheduler(engine, 3), reqs)
    assert [outputs[id(req)] for req in reqs] == reference


def test_sequences_join_and_leave_while_others_run():
    engine = engine_of(tiny_setup("llama"), "chain")
    reqs = requests(engine)
    scheduler = BatchScheduler(engine, 3)
    seen = []
    for req in reqs[:3]:
        scheduler.add(req)
    while scheduler.has_work:
        scheduler.step()
        seen.append([seq.req for seq in scheduler.running])
        if len(seen) == 2:
            scheduler.add(reqs[3])
    # a sequence left (the 6-token one) and one joined while the others still ran
    assert any(reqs[3] in rows and reqs[1] in rows for rows in seen)
    assert any(reqs[2] not in rows and reqs[1] in rows for rows in seen[1:])
    assert set(scheduler.stats) == {1, 2, 3}


@pytest.mark.parametrize("arch", ["llama", "mistral"])  # mistral: a sliding window of 4
@pytest.mark.parametrize("setting", SETTINGS)
def test_transformers_target_batch_equals_each_sequence_alone(arch, setting):
    engine = engine_of(hf_setup(arch), setting)
    reference = single_outputs(engine)
    reqs = requests(engine)
    outputs = outputs_of(BatchScheduler(engine, 3), reqs)
    assert [outputs[id(req)] for req in reqs] == reference, (arch, setting)


def test_k_follows_the_schedule_by_batch_size():
    engine = engine_of(tiny_setup("llama"), "chain")
    reference = single_outputs(engine)
    schedule = BatchSchedule.of([[1, 1, 3], [2, 2, 0], [3, 4, 2]])
    scheduler = BatchScheduler(engine, 4, schedule)
    reqs = requests(engine)
    outputs = outputs_of(scheduler, reqs)
    assert [outputs[id(req)] for req in reqs] == reference
    for size, stats in scheduler.stats.items():
        k = schedule.num_steps(size)
        assert stats.num_steps == k
        # every row of every round at this size drafted k tokens (none at K = 0)
        assert stats.metrics.num_drafted_tokens == k * stats.metrics.num_verify_steps
    assert {2, 3, 4} <= set(scheduler.stats)
    assert scheduler.stats[3].metrics.num_accepted_tokens > 0  # drafting resumed after K = 0
    scheduler.add(requests(engine)[1])  # alone: K = 3
    assert scheduler.run()[0][1].token_ids == reference[1]
    assert scheduler.stats[1].num_steps == 3 and scheduler.stats[1].metrics.num_accepted_tokens


def test_sampled_requests_run_and_keep_their_counts():
    engine = engine_of(tiny_setup("llama"), "chain")
    reqs = requests(engine, params=SamplingParams(temperature=1.0))
    outputs = outputs_of(BatchScheduler(engine, 3), reqs)
    assert [len(outputs[id(req)]) for req in reqs] == list(NUM_NEW)
    for req in reqs:
        req.metrics.check()


def test_an_aborted_request_leaves_and_the_others_are_unchanged():
    engine = engine_of(tiny_setup("llama"), "chain")
    reference = single_outputs(engine)
    reqs = requests(engine)[:3]
    scheduler = BatchScheduler(engine, 3)
    for req in reqs:
        scheduler.add(req)
    scheduler.step()
    scheduler.abort(reqs[0])
    results = dict((id(req), result) for req, result in scheduler.run())
    assert results[id(reqs[0])].finish_reason == ABORTED
    assert [results[id(req)].token_ids for req in reqs[1:]] == reference[1:3]


def test_a_request_aborted_while_waiting_comes_back_with_no_tokens():
    engine = engine_of(tiny_setup("llama"), "plain")
    reqs = requests(engine)[:3]
    scheduler = BatchScheduler(engine, 2)
    for req in reqs:
        scheduler.add(req)
    scheduler.abort(reqs[2])
    results = dict((id(req), result) for req, result in scheduler.run())
    assert (results[id(reqs[2])].finish_reason, results[id(reqs[2])].token_ids) == (ABORTED, [])
    assert len(results[id(reqs[0])].token_ids) == NUM_NEW[0]


@pytest.mark.parametrize("where", ["fast", "transformers"])
def test_one_row_and_requests_done_at_their_prefill(where):
    """max_num_seqs 1 (the transformers target's batch-1 cache) and requests of one new token,
    which finish at their prefill and leave before any round."""
    setup = tiny_setup("llama") if where == "fast" else hf_setup("llama")
    engine = engine_of(setup, "chain")
    reference = single_outputs(engine)
    num_new = [1, NUM_NEW[1], 1, NUM_NEW[3], 1, NUM_NEW[5]]
    for max_num_seqs in (1, 3):
        reqs = requests(engine, num_new=num_new)
        outputs = outputs_of(BatchScheduler(engine, max_num_seqs), reqs)
        got = [outputs[id(req)] for req in reqs]
        assert got == [ref[:n] for ref, n in zip(reference, num_new)], max_num_seqs


def test_batch_one_engine_between_batches():
    setup = tiny_setup("llama")
    engine = engine_of(setup, "chain")
    reference = single_outputs(engine)
    scheduler = BatchScheduler(engine, 3)
    first = requests(engine)
    staggered_run(scheduler, first)
    assert engine.generate(prompts()[0], NUM_NEW[0]).token_ids == reference[0]  # batch-1 cache
    second = requests(engine)
    outputs = outputs_of(scheduler, second)  # the batch's cache rebuilt
    assert [outputs[id(req)] for req in second] == reference
    scheduler.add(requests(engine)[0])
    scheduler.step()
    engine.generate(prompts()[1], 2)
    with pytest.raises(EngineError, match="reallocated while 1 batched"):
        scheduler.step()


def test_a_schedule_the_engine_cannot_run_is_refused():
    setup = tiny_setup("llama")
    with pytest.raises(ScheduleError, match="exceeds the drafter's depth 3"):
        BatchScheduler(engine_of(setup, "chain"), 2, BatchSchedule.of([[1, 2, 4]]))
    with pytest.raises(ScheduleError, match="exceeds the drafter's depth 0"):
        BatchScheduler(engine_of(setup, "plain"), 2, BatchSchedule.of([[1, 2, 1]]))
    with pytest.raises(ScheduleError, match="covers batch sizes 1..2, max_num_seqs is 4"):
        BatchScheduler(engine_of(setup, "chain"), 4, BatchSchedule.of([[1, 2, 1]]))
    with pytest.raises(EngineError, match="max_num_seqs 0: a batch needs at least 1 row"):
        BatchScheduler(engine_of(setup, "chain"), 0)


@pytest.mark.parametrize("where", ["fast", "transformers"])
def test_masks_over_every_slot_give_the_same_outputs(where):
    """static_width (a compiled target's: masks over all max_seq_len slots, few shapes)."""
    setup = tiny_setup("llama") if where == "fast" else hf_setup("llama")
    engine = engine_of(setup, "tree")
    reference = single_outputs(engine)
    scheduler = BatchScheduler(engine, 3)
    scheduler.runner.static_width = True
    reqs = requests(engine)
    outputs = outputs_of(scheduler, reqs)
    assert [outputs[id(req)] for req in reqs] == reference


# layer types with their own masks (sliding + full), MLA + MoE, attention sinks
@pytest.mark.parametrize("arch", ["gemma3", "deepseek_v3", "gpt_oss"])
def test_transformers_classes_batch_a_tree_as_each_sequence_alone(arch):
    engine = engine_of(hf_setup(arch), "tree")
    reference = single_outputs(engine)
    reqs = requests(engine)
    outputs = outputs_of(BatchScheduler(engine, 3), reqs)
    assert [outputs[id(req)] for req in reqs] == reference, arch


@pytest.mark.parametrize("setting", SETTINGS)
def test_sequences_as_long_as_the_cache_equal_each_sequence_alone(setting):
    """Rows whose prompt + max_new_tokens = max_seq_len = the target's positions, of different
    lengths: each row is cut near the cache's end at its own round (`round.free_nodes`) and
    padded to the batch's widest proposal (`BatchRunner.verify_batch`), and emits its
    single-sequence greedy output."""
    from specdraft.engine.speculate import SpeculativeEngine

    setup = tiny_setup("llama")
    positions = setup.target.args.max_position_embeddings
    spec = SETTINGS[setting]
    engine = SpeculativeEngine(
        setup.target, None if spec is None else setup.trained, spec, None, positions, "cpu"
    )
    lengths = (240, 250, 244, 253)
    num_new = [positions - n for n in lengths]
    prompts_ = [random_prompts(1, n, seed=50 + i)[0] for i, n in enumerate(lengths)]
    reference = [engine.generate(p, n).token_ids for p, n in zip(prompts_, num_new)]
    reqs = [
        engine.new_request(p, n, SamplingParams(), (), None, None, None)
        for p, n in zip(prompts_, num_new)
    ]
    scheduler = BatchScheduler(engine, 3)
    verify, sizes = scheduler.runner.verify_batch, []

    def logged(proposals, starts):
        sizes.append({p.tokens.numel() for p in proposals})
        return verify(proposals, starts)

    scheduler.runner.verify_batch = logged
    outputs = outputs_of(scheduler, reqs)
    assert [outputs[id(req)] for req in reqs] == reference
    if spec is not None:  # rows cut while others were not: padded
        assert any(len(round_sizes) > 1 for round_sizes in sizes)


def test_a_schedule_tree_runs_at_its_batch_sizes():
    """A chain engine whose schedule runs a tree (topk 2, 6 nodes) at batch sizes 2..4 and the
    3-chain at 1: every sequence emits its single-sequence greedy output, and the rounds at a
    tree's sizes verify the tree's 5 drafts per row."""
    engine = engine_of(tiny_setup("llama"), "chain")
    reference = single_outputs(engine)
    schedule = BatchSchedule.of([[1, 1, 3], [2, 4, 3]]).with_trees([[2, 4, 2, 6]])
    assert schedule.setting(1) == SpecConfig.chain(3) and schedule.setting(3) == SpecConfig(3, 2, 6)
    scheduler = BatchScheduler(engine, 4, schedule)
    reqs = requests(engine)
    outputs = outputs_of(scheduler, reqs)
    assert [outputs[id(req)] for req in reqs] == reference
    for size in (2, 3):
        metrics = scheduler.stats[size].metrics
        assert metrics.num_drafted_tokens == 5 * metrics.num_verify_steps, size
    one = scheduler.stats[1].metrics
    assert one.num_drafted_tokens == 3 * one.num_verify_steps


def test_a_schedule_tree_wider_than_the_draft_vocabulary_is_refused():
    engine = engine_of(tiny_setup("llama"), "chain")
    vocab = engine.draft.cfg.draft_vocab_size
    schedule = BatchSchedule.of([[1, 4, 2]]).with_trees([[1, 4, vocab + 1, 3]])
    with pytest.raises(ScheduleError, match=f"topk {vocab + 1} exceeds the draft vocabulary"):
        BatchScheduler(engine, 4, schedule)
