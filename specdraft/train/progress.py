"""What `train` shows while it runs: rich's bar on a terminal; where stdout is not one (a log
file, a pipe), a plain line every few steps, flushed at once, since a redrawn bar writes nothing
a file keeps until the run ends. `counted_progress` is the same display for any other long stage
(the demo's timing, bench's runs, doctor's acceptance, tune's measurements), on stderr, at most
STAGE_LINES plain lines a stage; `status_while` says what a stage of no count (loading a model)
is doing."""

from __future__ import annotations

import contextlib
import datetime
import math
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

PLAIN_LINES = 20  # plain lines per training run, about (its loss log; the last step gets one)
STAGE_LINES = 4  # plain lines per other counted stage, at most: each quarter of it, the last item
STATUS_AFTER_S = 3.0  # seconds a stage runs before `status_while` prints its plain line


def plain_every(total: int, lines: int = PLAIN_LINES) -> int:
    """Steps between two plain lines of a `total`-step run: at most `lines` lines in all, the
    last step's included."""
    return max(1, math.ceil(total / lines))


def time_left(elapsed_s: float, done: int, remaining: int) -> str:
    """The ETA of `remaining` items at the pace of `done` items in `elapsed_s` seconds: "0:01:05",
    or "-" before the pace is known."""
    if not done or elapsed_s <= 0:
        return "-"
    return str(datetime.timedelta(seconds=round(elapsed_s / done * remaining)))


def plain_line(record: dict[str, Any], total: int, done: int, elapsed_s: float) -> str:
    """One progress line: the step of `total`, the loss and first-position accuracy of the step's
    `record` (`Trainer.train_step`'s), supervised tokens per second and the time left, from the
    `done` steps this process ran in `elapsed_s` seconds."""
    step = record["step"]
    tokens = int(record["total"][0]) if record.get("total") else 0
    rate = f"{tokens * done / elapsed_s:.0f}" if elapsed_s > 0 else "-"
    return (
        f"train step {step}/{total}  loss {record['loss']:.4f}  accuracy {record['accuracy'][0]:.3f}  "
        f"tokens/s {rate}  ETA {time_left(elapsed_s, done, total - step)}"
    )


def progress_bar(label: str, *fields: Any, stderr: bool = False):
    """rich's Progress of a count: `label`, the bar, done/total, the time left while running and
    the time taken once done, then `fields` (more rich columns); on stdout's console (rich's
    global one) unless `stderr`."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    columns = (
        TextColumn(label),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(elapsed_when_finished=True),
        *fields,
    )
    return Progress(*columns, transient=False, console=Console(stderr=True) if stderr else None)


@contextlib.contextmanager
def counted_progress(label: str, total: int, enabled: bool = True) -> Iterator[Callable[[], None]]:
    """Yields advance(), called once per item of a `total`-item stage: a rich bar on stderr when it
    is a terminal, else a plain line "label 3/12  ETA 0:00:40" every `plain_every(total,
    STAGE_LINES)` items and at the last (flushed at once; at most STAGE_LINES lines, so that a
    log file holds a few a stage); nothing when not `enabled`."""
    from rich.console import Console

    if not enabled:
        yield lambda: None
        return
    if not Console(stderr=True).is_terminal:
        every, began, done = plain_every(total, STAGE_LINES), time.monotonic(), [0]

        def line() -> None:
            done[0] += 1
            if done[0] % every == 0 or done[0] == total:
                left = time_left(time.monotonic() - began, done[0], total - done[0])
                print(f"{label} {done[0]}/{total}  ETA {left}", file=sys.stderr, flush=True)

        yield line
        return
    with progress_bar(label, stderr=True) as bar:
        task = bar.add_task(label, total=total)
        yield lambda: bar.update(task, advance=1)


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
    from rich.progress import TextColumn

    with progress_bar("train", TextColumn("loss {task.fields[loss]}")) as bar:
        task = bar.add_task("train", total=total, completed=start, loss="-")
        yield lambda record: bar.update(task, advance=1, loss=f"{record['loss']:.4f}")


@contextlib.contextmanager
def status_while(text: str, after_s: float | None = None, plain: bool = True) -> Iterator[None]:
    """Say on stderr what a stage without a count (loading a model, reading a target) is doing:
    rich's spinner with `text` on a terminal, cleared when the stage ends; elsewhere one plain
    line "`text` ..." once the stage has run `after_s` (STATUS_AFTER_S) seconds, none for one
    that ends or fails sooner (so a refused input stays one error line); no plain line when not
    `plain` (a stage whose error may follow it, such as importing a command's modules). Not
    around a `counted_progress` stage on a terminal: rich shows one live display at a time."""
    from rich.console import Console

    console = Console(stderr=True)
    if console.is_terminal:
        with console.status(text):
            yield
        return
    if not plain:
        yield
        return
    delay = STATUS_AFTER_S if after_s is None else after_s
    timer = threading.Timer(delay, lambda: print(f"{text} ...", file=sys.stderr, flush=True))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
