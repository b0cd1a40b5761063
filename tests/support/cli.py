"""Running specdraft's CLI in-process (typer's CliRunner, wide terminal), its argument lists, and
its one-line errors."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from specdraft.checkpoint import convert_draft
from specdraft.cli import app
from tests.support.doctor_helpers import draft_checkpoint
from tests.support.tiny_tokenizer import save_tiny_tokenizer


def flat(output: str) -> str:
    """Typer's boxed error on one line (box drawing and wrapping removed)."""
    return " ".join(re.sub(r"[\u2500-\u257f]", " ", output).split())


def cli_options(**options) -> list[str]:
    """--option value for each option in the order given, as strings (underscores in a name
    become dashes; True stands for a flag without a value)."""
    args = []
    for name, value in options.items():
        args.append("--" + name.replace("_", "-"))
        if value is not True:
            args.append(str(value))
    return args


def cli_args(command: str, *positional, **options) -> list[str]:
    """[command, *positional, *cli_options(**options)] as strings."""
    return [command, *map(str, positional), *cli_options(**options)]


def train_online(data, tmp_path, target_dir, **options):
    """CliRunner's result of `train --online DATA tmp_path/run --target TARGET_DIR` with
    cli_options `options`."""
    args = cli_args("train", data, tmp_path / "run", online=True, target=target_dir)
    return CliRunner().invoke(app, args + cli_options(**options))


def invoke(args: list[str]):
    return CliRunner().invoke(app, args, env={"COLUMNS": "400", "TERMINAL_WIDTH": "400"})


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """(draft dir with manifest, the same drafter without one (sglang layout), target dir with tokenizer)."""
    root = tmp_path_factory.mktemp("corrupt")
    draft, target = draft_checkpoint(root, draft_vocab_size=42)  # d2t ids < the tokenizer's 85
    save_tiny_tokenizer(target)
    convert_draft(draft, root / "plain", layout="sglang", target_num_layers=5)
    return draft, root / "plain", target


def one_error(result, *fragments: str, code: int = 1) -> str:
    """The one error line of a refused command (exit `code`: 1 refused while loading, 2 a bad
    option value or unusable input), holding every fragment."""
    assert result.exit_code == code, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(
        result.exception
    )
    text = flat(result.output)
    assert text.startswith("error: ") and text.count("error: ") == 1, result.output
    assert all(f in text for f in fragments), text
    return text
