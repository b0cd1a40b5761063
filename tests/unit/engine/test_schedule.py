"""`engine.schedule.BatchSchedule`: K by batch size, refused in one line when its ranges leave a
gap, overlap, or hold a negative K."""

from __future__ import annotations

import pytest

from specdraft.engine.schedule import BatchSchedule, ScheduleError


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
    with pytest.raises(ScheduleError, match="covers 1..8"):
        schedule.num_steps(9)
