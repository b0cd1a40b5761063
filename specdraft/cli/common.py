"""The typer app and what every command shares: its console, the one line an error prints, the one
exit-code mapping (`user_errors`), --version and --threads."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import fields, is_dataclass
from typing import Any

import typer

from specdraft.cli.command import App
from specdraft.errors import SpecdraftError, UnusableInput

app = App()


class OptionError(SpecdraftError, ValueError):
    """Options given together that cannot run (a drafting flag without --draft, --compile off CUDA,
    a port in use, ...): a usage error where checked before anything loads (`USAGE_ERROR`), else 1."""


UNWRAPPED_WIDTH = (
    100_000  # columns of a redirected command's Console: no line of its output is this long
)


REDIRECTED_TEXT_WIDTH = (
    100  # columns a redirected table's long text cells wrap in, at spaces (doctor's evidence)
)


def make_console(stderr: bool = False):
    """The rich Console every command prints with (stdout, or stderr): at a terminal, the terminal's
    width; redirected (a file, a pipe, CliRunner), `UNWRAPPED_WIDTH` and soft wrap, so a line keeps
    its paths and table cells whole (rich would wrap them at 80 columns)."""
    from rich.console import Console

    console = Console(stderr=stderr)
    return (
        console
        if console.is_terminal
        else Console(stderr=stderr, width=UNWRAPPED_WIDTH, soft_wrap=True)
    )


def error(e: Exception, skip_bad_hint: str = "") -> None:
    """Print `error: ...` to stderr (stdout keeps only what the command produced); for one bad data
    record (data.records.BadRecord) add `skip_bad_hint`, how this command skips such records
    (commands without --skip-bad give none or another way)."""
    from specdraft.data.records import BadRecord

    hint = skip_bad_hint if isinstance(e, BadRecord) else ""
    make_console(stderr=True).print(f"error: {e}{hint}", style="red", markup=False, soft_wrap=True)


# What a command reports as one line and exit 1: specdraft's own errors, raised where the input is
# read. Anything else is a bug: its summary and traceback (`command.report_bug`), exit 1.
USER_ERRORS = SpecdraftError


# click's exit code for a bad option value; also that of specdraft's checks of option combinations and
# of any input the user must fix before anything can run (errors.UnusableInput: a file cut short, ...)
USAGE_ERROR = 2


SKIP_BAD_HINT = " (or pass --skip-bad to skip and count bad records)"


@contextmanager
def user_errors(
    console,
    skip_bad_hint: str = "",
    interrupted: Callable[[], str] | None = None,
    exit_code: int = 1,
    usage_errors: type[Exception] = UnusableInput,
) -> Iterator[None]:
    """The one exit-code mapping of every command: a `USER_ERRORS` exception prints one line
    (`error`) and exits `exit_code` (1; `USAGE_ERROR` around checks of the options alone), one of
    `usage_errors` `USAGE_ERROR` wherever it is raised: `errors.UnusableInput`, whose subclasses
    say so of the error whichever command meets it (a damaged file, an output that is the input,
    a config.json that is not valid, an export option that cannot work, a target without a
    tokenizer, ...); doctor: any ValueError, an input it cannot judge. Ctrl-C prints
    `interrupted; <interrupted()>` when given (what was kept and how to resume) and exits 130.
    Usage errors (typer.BadParameter) exit 2 before a command runs."""
    try:
        yield
    except KeyboardInterrupt:
        if interrupted is not None:
            console.print(f"interrupted; {interrupted()}", markup=False, soft_wrap=True)
        raise typer.Exit(130) from None
    except USER_ERRORS as e:
        error(e, skip_bad_hint)
        raise typer.Exit(USAGE_ERROR if isinstance(e, usage_errors) else exit_code) from e


def config_of(cls, params: Mapping[str, Any], read_apart: tuple[str, ...] = (), **given: Any):
    """The frozen config `cls` (a dataclass) of a command's options: each field from the option of
    its name in `params` (click's `ctx.params`: the values after their callbacks, `option_fields`),
    `given` over them (a field the options say otherwise: `chat=not no_chat`; a nested config,
    whose fields take the options of their names); a field no option names keeps its default.
    Every option must land somewhere: a field of `cls` or of a nested config, or one named in
    `read_apart` (read by the command itself, or into a `given` field: "no_chat"); RuntimeError (a
    bug: a renamed field would drop its option silently) naming the others. The config validates
    itself (`__post_init__`)."""
    taken = {f.name for f in fields(cls)} | set(given) | set(read_apart)
    for value in given.values():
        taken |= {f.name for f in fields(value)} if is_dataclass(value) else set()
    lost = sorted(set(params) - taken)
    if lost:
        raise RuntimeError(f"options {lost} map to no field of {cls.__name__} (nor are read apart)")
    return cls(**{**option_fields(cls, params), **given})


def option_fields(cls, params: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of the dataclass `cls` that an option of the same name in `params` sets."""
    return {f.name: params[f.name] for f in fields(cls) if f.name in params}


def set_threads(threads: int) -> None:
    """--threads N (N >= 1, the option's range): torch.set_num_threads(N) (call it before any model
    loads)."""
    import torch

    torch.set_num_threads(threads)


def print_version(value: bool) -> None:
    """--version: print specdraft's version, then exit 0 (an eager option: before any command
    runs; the one way to ask, as `vllm --version` and `pip --version`)."""
    if value:
        from specdraft import __version__

        typer.echo(__version__)
        raise typer.Exit()


@app.callback()
def main(
    ctx: typer.Context,
    _version: bool = typer.Option(
        False,
        "--version",
        help="Print specdraft's version and exit.",
        metavar="",
        callback=print_version,
        is_eager=True,
    ),
) -> None:
    """Train, export, verify and serve speculative-decoding drafters (EAGLE-3, EAGLE-3.1, DFlash)."""
    from transformers.utils import logging as hf_logging

    # transformers' tqdm bars ("Loading weights", ...) would break into the commands' own output;
    # the setting comes back when the command ends (CliRunner, `app` called from Python)
    if hf_logging.is_progress_bar_enabled():
        hf_logging.disable_progress_bar()
        ctx.call_on_close(hf_logging.enable_progress_bar)
