"""The draft depth K (num_steps) by batch size: a list of (min_batch, max_batch, K), inclusive
ranges that cover batch sizes 1..max_batch without gaps or overlaps, K = 0 meaning plain
decoding at those sizes. The shape of vLLM's `num_speculative_tokens_per_batch_size` (issue #37);
`batch.BatchScheduler` reads K for the batch of each round.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from specdraft.conventions.spec_schedule import VLLM_SCHEDULE_KEY
from specdraft.errors import SpecdraftError


class ScheduleError(SpecdraftError, ValueError):
    """A schedule whose ranges leave a gap, overlap, or hold a negative or too-deep K; the
    message names the entry and the fix."""


@dataclass(frozen=True)
class BatchSchedule:
    """entries: ((min_batch, max_batch, K), ...) sorted by min_batch, the first starting at 1,
    each next one at the previous max_batch + 1; K >= 0. Raises ScheduleError otherwise."""

    entries: tuple[tuple[int, int, int], ...]

    def __post_init__(self) -> None:
        if not self.entries:
            raise ScheduleError("empty K-by-batch-size schedule: give at least (1, max_batch, K)")
        expected = 1
        for entry in self.entries:
            if len(entry) != 3 or not all(isinstance(x, int) for x in entry):
                raise ScheduleError(f"schedule entry {entry!r}: need (min_batch, max_batch, K)")
            low, high, k = entry
            if low != expected:
                what = "a gap before it" if low > expected else "it overlaps the one before"
                raise ScheduleError(
                    f"schedule entry {list(entry)}: {what}; start it at batch size {expected}"
                )
            if high < low or k < 0:
                raise ScheduleError(
                    f"schedule entry {list(entry)}: need min_batch <= max_batch and K >= 0"
                )
            expected = high + 1

    @classmethod
    def of(cls, entries: Sequence[Sequence[int]]) -> BatchSchedule:
        """A schedule from any sequence of [min_batch, max_batch, K] (a JSON list, vLLM's form)."""
        return cls(tuple(tuple(entry) for entry in entries))

    @classmethod
    def constant(cls, num_steps: int, max_batch_size: int) -> BatchSchedule:
        """K = num_steps at every batch size up to max_batch_size."""
        return cls(((1, max_batch_size, num_steps),))

    @property
    def max_batch_size(self) -> int:
        """The largest batch size the schedule covers."""
        return self.entries[-1][1]

    @property
    def max_num_steps(self) -> int:
        """The largest K of any entry."""
        return max(k for _, _, k in self.entries)

    def num_steps(self, batch_size: int) -> int:
        """K for a batch of batch_size sequences (1..max_batch_size). Raises ScheduleError past
        the last entry."""
        for low, high, k in self.entries:
            if low <= batch_size <= high:
                return k
        raise ScheduleError(
            f"batch size {batch_size}: the schedule covers 1..{self.max_batch_size}; extend its "
            "last entry or admit fewer sequences"
        )

    def check_depth(self, max_num_steps: int) -> None:
        """Raise ScheduleError when an entry drafts deeper than max_num_steps."""
        for entry in self.entries:
            if entry[2] > max_num_steps:
                raise ScheduleError(
                    f"schedule entry {list(entry)}: K {entry[2]} exceeds the drafter's depth "
                    f"{max_num_steps}; use K <= {max_num_steps}"
                )


def read_schedule(path: str | Path, max_num_steps: int) -> BatchSchedule:
    """The schedule of a JSON file {"num_speculative_tokens_per_batch_size": [[min_batch,
    max_batch, K], ...]} (`serve --spec-schedule`; `tune --concurrency` writes it), its K at
    most max_num_steps (the drafter's depth; 0 without a drafter). Raises ScheduleError in one
    line naming the file: unreadable, not JSON, no such key, or a schedule `BatchSchedule`
    refuses (gap, overlap, negative K) or that drafts deeper than max_num_steps."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as e:
        raise ScheduleError(f"{path}: cannot read the schedule ({e.strerror or e})") from None
    except ValueError as e:
        raise ScheduleError(
            f"{path}: not JSON ({e}); write {{{VLLM_SCHEDULE_KEY!r}: [...]}}"
        ) from None
    entries = data.get(VLLM_SCHEDULE_KEY) if isinstance(data, dict) else None
    if not isinstance(entries, list) or not all(isinstance(e, list) for e in entries):
        raise ScheduleError(
            f"{path}: need an object with {VLLM_SCHEDULE_KEY!r}: a list of [min_batch, max_batch, K]"
        )
    try:
        schedule = BatchSchedule.of(entries)
        schedule.check_depth(max_num_steps)
    except (ScheduleError, TypeError) as e:
        raise ScheduleError(f"{path}: {e}") from None
    return schedule
