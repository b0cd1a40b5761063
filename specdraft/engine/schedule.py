"""The draft depth K (num_steps) by batch size: a list of (min_batch, max_batch, K), inclusive
ranges that cover batch sizes 1..max_batch without gaps or overlaps, K = 0 meaning plain
decoding at those sizes. The shape of vLLM's `num_speculative_tokens_per_batch_size` (issue #37);
`batch.BatchScheduler` reads the setting for the batch of each round (`BatchSchedule.setting`).

Some ranges may run a tree of depth K (specdraft's own server only: vLLM's value holds a token
count per range). The file says which under TREES_KEY beside vLLM's key: [[min_batch,
max_batch, topk, num_draft_tokens], ...], each range one of vLLM's rows with K > 0.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from specdraft.conventions.spec_schedule import VLLM_SCHEDULE_KEY
from specdraft.engine.spec_config import SpecConfig, SpecConfigError
from specdraft.errors import SpecdraftError

TREES_KEY = "trees_per_batch_size"  # specdraft's: the ranges that run a tree (module docstring)


class ScheduleError(SpecdraftError, ValueError):
    """A schedule whose ranges leave a gap, overlap, or hold a negative or too-deep K; the
    message names the entry and the fix."""


@dataclass(frozen=True)
class BatchSchedule:
    """entries: ((min_batch, max_batch, K), ...) sorted by min_batch, the first starting at 1,
    each next one at the previous max_batch + 1; K >= 0. trees: (entry index, topk,
    num_draft_tokens) of each entry that runs a tree of depth K (a valid `SpecConfig`), by
    index. Raises ScheduleError otherwise."""

    entries: tuple[tuple[int, int, int], ...]
    trees: tuple[tuple[int, int, int], ...] = ()  # (entry index, topk, num_draft_tokens)

    def __post_init__(self) -> None:
        self.check_entries()
        for index, topk, nodes in self.trees:
            low, high, k = self.entries[index]
            try:
                SpecConfig(k, topk, nodes)
            except SpecConfigError as e:
                raise ScheduleError(f"tree of schedule entry {[low, high, k]}: {e}") from None

    def check_entries(self) -> None:
        """Raise ScheduleError for an entry that is not (min_batch, max_batch, K >= 0) or that
        leaves a gap or overlaps."""
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

    def with_trees(self, trees: Sequence[Sequence[int]]) -> BatchSchedule:
        """This schedule with trees [[min_batch, max_batch, topk, num_draft_tokens], ...], each
        range one of its entries with K > 0. Raises ScheduleError naming a range that is not."""
        ranges = {entry[:2]: i for i, entry in enumerate(self.entries) if entry[2] > 0}
        found = []
        for tree in trees:
            if len(tree) != 4 or tuple(tree[:2]) not in ranges:
                raise ScheduleError(
                    f"tree {list(tree)}: need [min_batch, max_batch, topk, num_draft_tokens] "
                    "over the range of an entry with K > 0"
                )
            found.append((ranges[tuple(tree[:2])], tree[2], tree[3]))
        return BatchSchedule(self.entries, tuple(sorted(found)))

    def setting(self, batch_size: int) -> SpecConfig | None:
        """The setting for a batch of batch_size sequences: its entry's tree, else a chain of
        K (None at K = 0). Raises ScheduleError past the last entry."""
        index = self.entry_of(batch_size)
        k = self.entries[index][2]
        tree = next(((t, n) for i, t, n in self.trees if i == index), None)
        if k == 0:
            return None
        return SpecConfig.chain(k) if tree is None else SpecConfig(k, *tree)

    def settings(self) -> list[SpecConfig]:
        """Every setting the schedule runs (K > 0), once each."""
        sizes = [low for low, _, k in self.entries if k > 0]
        return list(dict.fromkeys(self.setting(size) for size in sizes))

    def to_json(self) -> dict[str, list[list[int]]]:
        """The file's object: vLLM's key, and TREES_KEY when an entry runs a tree."""
        data = {VLLM_SCHEDULE_KEY: [list(entry) for entry in self.entries]}
        if self.trees:
            data[TREES_KEY] = [[*self.entries[i][:2], t, n] for i, t, n in self.trees]
        return data

    def describe(self) -> str:
        """One line: each range and what it runs ("1-1: K 3; 2-4: K 2; 5-8: plain")."""

        def runs(low: int) -> str:
            spec = self.setting(low)
            if spec is None:
                return "plain"
            return f"K {spec.num_steps}" + (
                ""
                if spec.is_chain
                else f" tree (topk {spec.topk}, {spec.num_draft_tokens} draft tokens)"
            )

        return "; ".join(f"{low}-{high}: {runs(low)}" for low, high, _ in self.entries)

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
        return self.entries[self.entry_of(batch_size)][2]

    def entry_of(self, batch_size: int) -> int:
        """The index of the entry covering batch_size. Raises ScheduleError past the last."""
        for index, (low, high, _) in enumerate(self.entries):
            if low <= batch_size <= high:
                return index
        raise ScheduleError(
            f"batch size {batch_size}: the schedule covers 1..{self.max_batch_size}; extend its "
            "last entry or admit fewer sequences"
        )

    def check_depth(self, max_num_steps: int) -> None:
        """Raise ScheduleError when an entry drafts deeper than max_num_steps (the engine's
        --num-steps: serve's and generate's, default 3, a DFlash drafter's block_size - 1)."""
        for entry in self.entries:
            if entry[2] > max_num_steps:
                raise ScheduleError(
                    f"schedule entry {list(entry)}: K {entry[2]} exceeds the drafter's depth "
                    f"{max_num_steps} (--num-steps {max_num_steps}): pass --num-steps "
                    f"{entry[2]} (a DFlash drafter: at most its block_size - 1), or use K <= "
                    f"{max_num_steps}"
                )


def read_schedule(path: str | Path, max_num_steps: int) -> BatchSchedule:
    """The schedule of a JSON file {"num_speculative_tokens_per_batch_size": [[min_batch,
    max_batch, K], ...]} (`serve --spec-schedule`; `tune --concurrency` writes it), with the
    trees of TREES_KEY when given, its K at most max_num_steps (the drafter's depth; 0 without
    a drafter). Raises ScheduleError in one line naming the file: unreadable, not JSON, no such
    key, or a schedule `BatchSchedule` refuses (gap, overlap, negative K, a tree off an entry or
    invalid) or that drafts deeper than max_num_steps."""
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
    trees = data.get(TREES_KEY, [])
    try:
        schedule = BatchSchedule.of(entries).with_trees(trees)
        schedule.check_depth(max_num_steps)
    except (ScheduleError, TypeError) as e:
        raise ScheduleError(f"{path}: {e}") from None
    return schedule
