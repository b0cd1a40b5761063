"""--help of the options a fresh user asked about: every generate / serve / tune option says what it
does (--max-new-tokens and --device had no text), and demo takes the --threads its printed lines use."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from specdraft.cli import app


def help_of(command: str) -> str:
    result = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "200", "NO_COLOR": "1"})
    assert result.exit_code == 0, result.output
    return result.output


def option_help(text: str, option: str) -> str:
    """The help text of `option` in `--help` output (its first line, the type, default and range
    taken off)."""
    line = next(line for line in text.splitlines() if re.match(rf"\s*{option}\b", line))
    return re.sub(r"\[[^\]]*\]", "", re.sub(rf"^\s*{option}(\s+<[^>]+>)?", "", line)).strip()


@pytest.mark.parametrize(
    "command, options",
    [
        ("generate", ["--max-new-tokens", "--device"]),
        ("serve", ["--device"]),
        ("tune", ["--device"]),
        ("demo", ["--threads"]),
    ],
)
def test_options_have_help(command, options):
    text = help_of(command)
    for option in options:
        assert re.search(r"[a-z]{3,}", option_help(text, option)), (
            command,
            option,
            option_help(text, option),
        )
    if command == "demo":  # every command's --threads help and default (test_threads_option.py)
        flat = " ".join(text.split())
        assert (
            "more, e.g. --threads 8, for a large model with the cores to itself. [default: 1; x>=1]"
            in flat
        ), flat


def test_train_shows_its_defaults_as_the_other_commands_do():
    """`[default: N]` as typer writes it elsewhere (train's options default to None so that a
    --config file or a checkpoint can set them: the text carries TrainConfig's default)."""
    from specdraft.train.config import TrainConfig

    flat = " ".join(help_of("train").split())
    defaults = TrainConfig()
    for option, key in (
        ("--batch-size", "batch_size"),
        ("--grad-accum-steps", "grad_accum_steps"),
        ("--max-length", "max_length"),
        ("--ttt-steps", "ttt_steps"),
        ("--warmup-steps", "warmup_steps"),
        ("--save-every", "save_every"),
        ("--precision", "precision"),
    ):
        assert re.search(rf"{option} <[^>]+> [^<]*\[default: {getattr(defaults, key)}\]", flat), (
            option
        )
    assert not re.search(r"\(\d+\)", flat)


def test_every_option_of_every_command_says_what_it_does():
    """Read from the click command typer builds, so a new option without help fails here."""
    import typer

    def commands(command, path):
        for name, sub in getattr(command, "commands", {}).items():
            yield from commands(sub, [*path, name])
        if not hasattr(command, "commands"):
            yield " ".join(path), command

    silent = [
        (path, param.opts[0])
        for path, command in commands(typer.main.get_command(app), [])
        for param in command.params
        if param.param_type_name == "option" and not (param.help or "").strip()
    ]
    assert silent == []


@pytest.mark.parametrize(
    "command, needs",
    [
        ("generate", "Used only with --draft (refused without it or with --no-spec)."),
        ("serve", "Used only with --draft"),
        ("inspect", "Needs --target."),
        ("doctor", "Needs --target."),
    ],
)
def test_aux_layers_help_names_what_the_command_needs_for_it(command, needs):
    """generate / serve require --target: their --aux-layers needs --draft (a drafter to read it for)."""
    text = " ".join(help_of(command).split())
    aux = text[text.index("--aux-layers") :]
    aux = aux[: aux.index("class).") + 80]  # the sentence after the common text
    assert needs in aux, aux
    assert ("Needs --target" in aux) == (command in ("inspect", "doctor")), aux


def test_every_option_with_a_default_shows_it():
    """Walks every command typer builds: an option whose default is a value (not None, "" or a
    flag's False, which mean "not given") shows `[default: ...]`; a train option, None so that a
    --config file or a checkpoint can set it, shows TrainConfig's default when it has one
    (`--lr` showed none)."""
    import click
    import typer

    from specdraft.train.settings import TrainConfig, flagged_settings

    def commands(command, path):
        for name, sub in getattr(command, "commands", {}).items():
            yield from commands(sub, [*path, name])
        if not hasattr(command, "commands"):
            yield " ".join(path), command

    def help_text(command, param) -> str:
        record = param.get_help_record(click.Context(command))
        return " ".join(record[1].split()) if record else ""

    train_defaults = {
        f.metadata["flag"]: getattr(TrainConfig(), f.name)
        for f in flagged_settings()
        if getattr(TrainConfig(), f.name) is not None
    }
    hidden = []
    for path, command in commands(typer.main.get_command(app), []):
        for param in command.params:
            if param.param_type_name != "option" or param.name == "help":
                continue
            text = help_text(command, param)
            if param.default not in (None, "", False) and "[default: " not in text:
                hidden.append((path, param.opts[0], param.default))
            expected = train_defaults.get(param.opts[0]) if path == "train" else None
            if expected is not None and f"[default: {expected}]" not in text:
                hidden.append((path, param.opts[0], expected))
    assert hidden == []
    assert len(train_defaults) >= 8  # --lr, --warmup-steps, --batch-size, ...


def test_the_readme_names_each_commands_arguments_as_its_usage_line():
    """`specdraft train STORE OUT` in the README, `SOURCE OUT` in the CLI's usage: the README's
    command lines spell the positional arguments as `--help` does."""
    from pathlib import Path

    readme = (Path(__file__).parents[2] / "README.md").read_text()
    lines = re.findall(r"`specdraft ([a-z]+(?: [a-z]+)?) ((?:[A-Z][A-Z_]*(?: |`))+)", readme)
    assert len(lines) >= 8, lines
    wrong = []
    for command, args in lines:
        usage = re.search(r"Usage: \S+ [a-z ]+\[OPTIONS\] (.*)", help_of_path(command))
        if args.replace("`", "").split() != usage.group(1).split()[: len(args.split())]:
            wrong.append((command, args, usage.group(1)))
    assert wrong == []


def help_of_path(command: str) -> str:
    result = CliRunner().invoke(
        app, [*command.split(), "--help"], env={"COLUMNS": "200", "NO_COLOR": "1"}
    )
    assert result.exit_code == 0, result.output
    return result.output
