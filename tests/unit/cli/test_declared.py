"""specdraft.cli.declared: an option's default is declared once with its type and help, an option
group stands for its fields' options in place and reaches the command whole, and a default given in
both places is a bug."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import pytest
import typer
from typer.testing import CliRunner

from specdraft.cli.command import App
from specdraft.cli.declared import OptionGroup, declared_signature
from specdraft.cli.options import flag, option

Width = Annotated[int, option(8, min=1, help="Columns.")]
Label = Annotated[str, option("none", help="A label.")]
Loud = flag("--loud", help="Shout.")
Name = Annotated[str, typer.Option(help="Required: declares no default.")]


@dataclass(frozen=True)
class Shape(OptionGroup):
    width: Width
    loud: Loud


def run(command, *args: str):
    app = App()
    app.command()(command)
    app.command("other")(lambda: None)  # two commands: each is a subcommand by its name
    return CliRunner().invoke(app, [command.__name__.replace("_", "-"), *args])


def test_declared_defaults_and_a_group_reach_the_command():
    seen = []

    def draw(name: Name, shape: Shape, label: Label) -> None:
        seen.append((name, shape, label))

    assert run(draw, "--name", "a").exit_code == 0
    assert run(draw, "--name", "b", "--width", "3", "--loud", "--label", "x").exit_code == 0
    assert seen == [("a", Shape(8, False), "none"), ("b", Shape(3, True), "x")]


def test_the_help_lists_a_groups_options_in_place_with_their_defaults():
    def draw(name: Name, shape: Shape, label: Label) -> None:
        pass

    text = run(draw, "--help").output
    order = [text.index(flag) for flag in ("--name", "--width", "--loud", "--label")]
    assert order == sorted(order), text
    assert "[default: 8; x>=1]" in text and "[default: none]" in text, text
    missing = run(draw)  # --name declares no default: still required
    assert missing.exit_code == 2 and "Missing option '--name'" in missing.output, missing.output


def test_an_out_of_range_value_is_a_usage_error():
    def draw(shape: Shape) -> None:
        pass

    result = run(draw, "--width", "0")
    assert result.exit_code == 2 and "Invalid value for '--width'" in result.output, result.output


def test_a_default_in_both_places_is_a_bug():
    def draw(width: Width = 3) -> None:
        pass

    with pytest.raises(TypeError, match=r"draw\(width\): a default in both places"):
        declared_signature(draw)
