"""What `train` shows while it runs: rich's bar on a terminal; where stdout is not one (a log
file, a pipe), a plain line every few steps, flushed at once, since a redrawn bar writes nothing
a file keeps until the run ends."""

from __future__ import annotations

import contextlib
import datetime
import math
import time
from collections.abc import Callable, Iterator
from typing import Any

PLAIN_LINES = 20  # plain lines per run, about (the last step always gets one)


def plain_every(total: int) -> int:
    """Steps between two plain lines of a `total`-step run: about PLAIN_LINES lines in all."""
    return max(1, math.ceil(total / PLAIN_LINES))


def plain_line(record: dict[str, Any], total: int, done: int, elapsed_s: float) -> str:
    """One progress line: the step of `total`, the loss and first-position accuracy of the step's
    `record` (`Trainer.train_step`'s), supervised tokens per second and the time left, from the
    `done` steps this process ran in `elapsed_s` seconds."""
    step = record["step"]
    tokens = int(record["total"][0]) if record.get("total") else 0
    rate = f"{tokens * done / elapsed_s:.0f}" if elapsed_s > 0 else "-"
    left = (
        datetime.timedelta(seconds=round(elapsed_s / done * (total - step)))
        if done and elapsed_s > 0
        else "-"
    )
    return (
        f"train step {step}/{total}  loss {record['loss']:.4f}  accuracy {record['accuracy'][0]:.3f}  "
        f"tokens/s {rate}  ETA {left}"
    )


@contextlib.contextmanager
def training_progress(
    enabled: bool, total: int, start: int
) -> Iterator[Callable[[dict[str, Any]], None]]:
    """Yields advance(record), called once per step with `Trainer.train_step`'s record: a rich
    bar when stdout is a terminal (rich's Console.is_terminal), else a `plain_line` every
    `plain_every(total)` steps and at the last; nothing when not `enabled`."""
    if not enabled:
        yield lambda record: None
        return
    from rich.console import Console

    if not Console().is_terminal:
        every, began, done = plain_every(total), time.monotonic(), [0]

        def line(record: dict[str, Any]) -> None:
            done[0] += 1
            if record["step"] % every == 0 or record["step"] == total:
                print(plain_line(record, total, done[0], time.monotonic() - began), flush=True)

        yield line
        return
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    columns = (
        TextColumn("train"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(elapsed_when_finished=True),
        TextColumn("loss {task.fields[loss]}"),
    )  # time left while running, time taken once done
    with Progress(*columns, transient=False) as bar:
        task = bar.add_task("train", total=total, completed=start, loss="-")
        yield lambda record: bar.update(task, advance=1, loss=f"{record['loss']:.4f}")
