"""`engine.schedule.BatchSchedule`: K by batch size, refused in one line when its ranges leave a
gap, overlap, or hold a negative K."""

from __future__ import annotations

import pytest

from specdraft.engine.schedule import BatchSchedule, ScheduleError, read_schedule


@pytest.mark.parametrize(
    "entries, message",
    [
        ([], "empty"),
        ([[2, 4, 3]], "a gap before it"),
        ([[1, 2, 3], [4, 8, 1]], "a gap before it"),
        ([[1, 4, 3], [3, 8, 1]], "overlaps"),
        ([[1, 4, -1]], "K >= 0"),
        ([[1, 4]], "need"),
    ],
)
def test_a_broken_schedule_is_refused_in_one_line(entries, message):
    with pytest.raises(ScheduleError, match=message) as info:
        BatchSchedule.of(entries)
    assert "\n" not in str(info.value)


def test_k_by_batch_size_reads_the_covering_entry():
    schedule = BatchSchedule.of([[1, 2, 3], [3, 8, 0]])
    assert [schedule.num_steps(b) for b in (1, 2, 3, 8)] == [3, 3, 0, 0]
    assert (schedule.max_batch_size, schedule.max_num_steps) == (8, 3)
    assert schedule.describe() == "1-2: K 3; 3-8: plain"  # serve's start-up line
    tree = BatchSchedule.of([[1, 1, 3], [2, 4, 2]]).with_trees([[1, 1, 2, 6]])
    assert tree.describe() == "1-1: K 3 tree (topk 2, 6 draft tokens); 2-4: K 2"
    with pytest.raises(ScheduleError, match="covers 1..8"):
        schedule.num_steps(9)


@pytest.mark.parametrize(
    "text, message",
    [
        ("{", "not JSON"),
        ('{"other": []}', "need an object with 'num_speculative_tokens_per_batch_size'"),
        ('{"num_speculative_tokens_per_batch_size": [[1, 2, 3], [4, 8, 1]]}', "a gap"),
        ('{"num_speculative_tokens_per_batch_size": [[1, 4, 3], [3, 8, 1]]}', "overlaps"),
        ('{"num_speculative_tokens_per_batch_size": [[1, 4, 5]]}', "exceeds the drafter's depth 3"),
    ],
)
def test_a_bad_schedule_file_is_refused_in_one_line_naming_it(tmp_path, text, message):
    path = tmp_path / "schedule.json"
    path.write_text(text)
    with pytest.raises(ScheduleError, match=message) as info:
        read_schedule(path, 3)
    assert str(info.value).startswith(str(path)) and "\n" not in str(info.value)


def test_a_schedule_deeper_than_the_drafter_names_num_steps(tmp_path):
    path = tmp_path / "schedule.json"
    path.write_text('{"num_speculative_tokens_per_batch_size": [[1, 4, 5]]}')
    with pytest.raises(ScheduleError) as info:
        read_schedule(path, 3)
    assert "K 5 exceeds the drafter's depth 3 (--num-steps 3): pass --num-steps 5" in str(
        info.value
    )


def test_a_missing_schedule_file_is_refused_naming_it(tmp_path):
    with pytest.raises(ScheduleError, match="cannot read"):
        read_schedule(tmp_path / "none.json", 3)


def test_a_schedule_file_in_vllms_form_is_read(tmp_path):
    path = tmp_path / "schedule.json"
    path.write_text('{"num_speculative_tokens_per_batch_size": [[1, 4, 3], [5, 16, 0]]}')
    schedule = read_schedule(path, 3)
    assert schedule.entries == ((1, 4, 3), (5, 16, 0))
    assert [schedule.num_steps(b) for b in (1, 4, 5, 16)] == [3, 3, 0, 0]


def test_a_schedule_file_with_trees_is_read_and_written_back(tmp_path):
    """TREES_KEY gives ranges of vLLM's rows a tree; `to_json` writes the same object."""
    import json

    from specdraft.engine.schedule import TREES_KEY
    from specdraft.engine.spec_config import SpecConfig

    data = {
        "num_speculative_tokens_per_batch_size": [[1, 4, 3], [5, 8, 2], [9, 16, 0]],
        TREES_KEY: [[1, 4, 2, 6]],
    }
    path = tmp_path / "schedule.json"
    path.write_text(json.dumps(data))
    schedule = read_schedule(path, 3)
    assert [schedule.setting(b) for b in (1, 5, 9)] == [
        SpecConfig(3, 2, 6),
        SpecConfig.chain(2),
        None,
    ]
    assert schedule.settings() == [SpecConfig(3, 2, 6), SpecConfig.chain(2)]
    assert schedule.to_json() == data


@pytest.mark.parametrize(
    "trees, message",
    [
        ([[1, 3, 2, 6]], "over the range of an entry with K > 0"),  # no such range
        ([[9, 16, 2, 3]], "over the range of an entry with K > 0"),  # K = 0 there
        ([[1, 4, 2, 40]], "a tree verifies 2 <= num_draft_tokens"),  # too many nodes
        ([[1, 4, 2]], "need [min_batch, max_batch, topk, num_draft_tokens]"),
    ],
)
def test_a_bad_tree_is_refused_in_one_line_naming_the_file(tmp_path, trees, message):
    import json

    from specdraft.engine.schedule import TREES_KEY

    path = tmp_path / "schedule.json"
    rows = [[1, 4, 3], [5, 8, 2], [9, 16, 0]]
    path.write_text(json.dumps({"num_speculative_tokens_per_batch_size": rows, TREES_KEY: trees}))
    with pytest.raises(ScheduleError) as info:
        read_schedule(path, 3)
    assert str(info.value).startswith(str(path)) and message in str(info.value)
    assert "\n" not in str(info.value)
