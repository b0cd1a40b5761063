"""The typer app class of `specdraft` and of its sub-apps, and the class of every command it makes:
its usage line, its bad-value message, what a bug prints (`report_bug`); its parameters as their options declare them
(`declared.declared_signature`)."""

from __future__ import annotations

import sys
import traceback

import typer
from typer.core import TyperCommand
from typer.exceptions import TyperException

from specdraft.cli.declared import declared_signature

PYDANTIC_PREFIX = (
    "Value error, "  # what typer's pydantic checks put before a ValueError's words (a bad choice)
)


class Command(TyperCommand):
    """Every specdraft command: its usage line names a required argument as its description
    does (`specdraft export [OPTIONS] CHECKPOINT OUT`, not typer's `{CHECKPOINT}`), and a bad
    option value reads as specdraft's other errors ("'int8' is not one of ...", without pydantic's
    "Value error, ")."""

    def collect_usage_pieces(self, ctx) -> list[str]:
        return [
            piece.removeprefix("{").removesuffix("}") for piece in super().collect_usage_pieces(ctx)
        ]

    def invoke(self, ctx):
        """Run the command; an exception that is no user error (`common.user_errors` prints those)
        and no click exit is a bug: `report_bug`, exit 1."""
        try:
            return super().invoke(ctx)
        except (typer.Exit, typer.Abort, TyperException):  # exits and usage errors: click's
            raise
        except Exception as e:
            report_bug(e)
            raise typer.Exit(1) from e

    def parse_args(self, ctx, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except typer.BadParameter as e:
            e.message = e.message.removeprefix(PYDANTIC_PREFIX)
            raise


def report_bug(e: Exception) -> None:
    """A bug's one-line summary, then its traceback, on stderr (a user error is one line alone)."""
    print(
        f"error: unexpected {type(e).__name__}: {e} (a bug in specdraft; the traceback follows)",
        file=sys.stderr,
    )
    traceback.print_exception(e, file=sys.stderr)


class App(typer.Typer):
    """specdraft's typer apps (`specdraft`, `specdraft store`): each command a `Command`; help and
    usage errors in click's plain form (rich_markup_mode=None: whole words wrapped at the terminal's
    width, where typer's boxed panels cut words at 80 columns)."""

    def __init__(self, **kwargs) -> None:
        super().__init__(
            no_args_is_help=True,
            add_completion=False,
            pretty_exceptions_enable=False,
            rich_markup_mode=None,
            **kwargs,
        )

    def command(self, *args, **kwargs):
        """typer's command decorator, each command a `Command` whose parameters are as their
        options declare them (`declared.declared_signature`: defaults, option groups)."""
        register = super().command(*args, cls=Command, **kwargs)
        return lambda function: register(declared_signature(function))
