"""The typer app class of `specdraft` and of its sub-apps, and the class of every command it makes."""

from __future__ import annotations

import typer
from typer.core import TyperCommand

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

    def parse_args(self, ctx, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except typer.BadParameter as e:
            e.message = e.message.removeprefix(PYDANTIC_PREFIX)
            raise


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
        return super().command(*args, cls=Command, **kwargs)
