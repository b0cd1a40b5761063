"""`generate` / `serve` run options: --compile (CUDA only, one shared refusal and warm-up),
--threads (torch threads before loading), --no-spec as a bare flag in --help, and no transformers
progress bars in any command's output."""

from __future__ import annotations

import json
import re
import shutil

import pytest
import torch
from typer.testing import CliRunner

import specdraft.engine.load as engine_load
import specdraft.serve.server
from specdraft.cli import app
from tests.support.cli import cli_args
from tests.support.engine_helpers import one_thread, tiny_setup  # noqa: F401
from tests.support.serve_helpers import word_tokenizer
from tests.support.tiny_models import save_tiny_model


def _free_port() -> int:
    """A port nothing listens on now (serve checks its --port, 1..65535, before loading)."""
    import socket

    with socket.create_server(("127.0.0.1", 0)) as sock:
        return sock.getsockname()[1]


COMMANDS = {
    "generate": ["--prompt", "w1 w2 w3", "--max-new-tokens", "8"],
    "serve": ["--port", str(_free_port())],
}


def invoke(args: list[str]):
    return CliRunner().invoke(app, args, env={"COLUMNS": "400", "TERMINAL_WIDTH": "400"})


def _target(tmp_path):
    """The tiny llama target of `tiny_setup` with a word tokenizer, in its own directory."""
    path = tmp_path / "target"
    shutil.copytree(tiny_setup("llama").target_dir, path)
    word_tokenizer().save_pretrained(path)
    return path


def _no_load(*args, **kwargs):
    raise AssertionError("loaded a model")


@pytest.mark.parametrize("command", COMMANDS)
def test_compile_off_cuda_is_one_line_before_loading(tmp_path, command, monkeypatch):
    monkeypatch.setattr(engine_load, "load_engine", _no_load)
    (tmp_path / "config.json").write_text("{}")
    result = invoke(
        [command, "--target", str(tmp_path), "--no-spec", "--compile", *COMMANDS[command]]
    )
    assert result.exit_code == 2, result.output  # a usage error, as click's for a bad value
    assert result.stderr.strip() == (
        "error: --compile needs a CUDA device (CUDA graphs), not --device cpu: "
        "pass --device cuda, or drop --compile"
    )


def test_compile_warms_up_once_before_generating_and_serving(tmp_path, monkeypatch):
    """On CUDA (faked: the engine runs on the CPU) both commands build a compiled engine and run
    the same warm-up generation, reported in the same line; serve's comes before it listens."""
    setup, target = tiny_setup("llama"), _target(tmp_path)
    built, served = [], []

    def fake_load(*args, compile=False, **kwargs):
        built.append(compile)
        return setup.engine(None, None)  # plain decoding on the CPU

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(engine_load, "load_engine", fake_load)
    monkeypatch.setattr(
        specdraft.serve.server,
        "serve",
        lambda app, host, port: served.append(app.state.server.engine.total.num_requests),
    )
    warm_up = "(a warm-up generation, not in the metrics)"
    for command in COMMANDS:
        result = invoke(
            [
                command,
                "--target",
                str(target),
                "--no-spec",
                "--device",
                "cuda",
                "--compile",
                *COMMANDS[command],
            ]
        )
        assert result.exit_code == 0, result.output
        lines = [line for line in result.output.splitlines() if warm_up in line]
        assert len(lines) == 1 and lines[0].startswith("compiled and captured CUDA graphs in "), (
            result.output
        )
    assert built == [True, True]
    assert served == [1]  # the warm-up had run when the server started


@pytest.mark.parametrize("command", COMMANDS)
def test_threads_are_set_before_loading(tmp_path, command, monkeypatch):
    import transformers

    seen = []

    def record(*args, **kwargs):
        seen.append(torch.get_num_threads())
        raise OSError("stop here")

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", record)
    from specdraft.targets.config import (
        TARGET_REQUIRED_KEYS,
    )  # generate refuses a config without them first

    config = {key: "llama" if key == "model_type" else 2 for key in TARGET_REQUIRED_KEYS}
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "tokenizer.json").write_text("{}")  # a tokenizer file: the refusal gives its reason
    result = invoke(
        [command, "--target", str(tmp_path), "--no-spec", "--threads", "3", *COMMANDS[command]]
    )
    assert result.exit_code == 2 and "stop here" in result.output, result.output
    assert seen == [3]  # one_thread restores the setting afterwards
    refused = invoke(
        [command, "--target", str(tmp_path), "--no-spec", "--threads", "0", *COMMANDS[command]]
    )
    assert refused.exit_code == 2, refused.output  # the option's range, before anything loads
    assert (
        "Invalid value for '--threads': Input should be greater than or equal to 1"
        in refused.output
    )
    assert seen == [3]
    assert "torch.set_num_threads" in invoke([command, "--help"]).output


@pytest.mark.parametrize("command", COMMANDS)
def test_flags_render_without_a_value_type_in_help(command):
    result = invoke([command, "--help"])
    assert result.exit_code == 0, result.output
    flags = {
        flag: [line for line in result.output.splitlines() if f"{flag} " in line]
        for flag in ("--no-spec", "--compile")
    }
    assert [len(lines) for lines in flags.values()] == [1, 1], result.output
    assert not [line for lines in flags.values() for line in lines if "<bool>" in line], (
        result.output
    )


def test_commands_draw_no_transformers_progress_bar(tmp_path):
    """regenerate loads a transformers model (its "Loading weights" bar): not in the output; the
    setting comes back after the command."""
    from transformers.utils import logging as hf_logging

    target = save_tiny_model("llama", tmp_path / "target")
    word_tokenizer().save_pretrained(target)
    data = tmp_path / "data.jsonl"
    data.write_text('{"text": "w1 w2 w3 w4 w5 w6"}\n')
    assert hf_logging.is_progress_bar_enabled()
    result = invoke(
        cli_args(
            "regenerate",
            data,
            tmp_path / "out.jsonl",
            target=target,
            no_chat=True,
            prompt_tokens=2,
            max_new_tokens=3,
        )
    )
    assert result.exit_code == 0, result.output
    assert "1 records written" in result.output
    assert "Loading weights" not in result.output and "it/s" not in result.output
    assert hf_logging.is_progress_bar_enabled()


def test_a_target_with_config_json_is_never_called_missing_it(tmp_path, monkeypatch):
    """`serve --no-spec --target=~/m` (no shell expands ~ after '=') and a file of the directory
    name what to pass instead of "no config.json here"; a path that does not exist says so."""
    monkeypatch.setattr(engine_load, "load_engine", _no_load)
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    unexpanded = (
        f"~/m: ~ was not expanded (a shell leaves it as is after '='); pass {tmp_path / 'm'}"
    )
    a_file = f"is a file; pass the model directory that holds it ({tmp_path / 'm'})"
    missing = f"{tmp_path / 'mm'}: no such directory; pass a transformers model directory"  # a typo
    for given, expected in (
        ("~/m", unexpanded),
        (str(tmp_path / "m" / "config.json"), a_file),
        (str(tmp_path / "mm"), missing),
    ):
        result = invoke(["serve", "--no-spec", f"--target={given}"])
        assert result.exit_code == 2, result.output
        assert expected in " ".join(re.sub(r"[\u2500-\u257f]", " ", result.output).split())


def test_help_wraps_whole_words_at_80_columns():
    """Every command's help fits 80 columns without cutting a word ("--speculative-eagle-to…",
    "RUN/checkpoints/step-…" in the boxed layout a fresh user read)."""
    from specdraft.cli import app

    names = [c.name or c.callback.__name__ for c in app.registered_commands]
    assert "generate" in names and "train" in names
    for name in names:
        result = CliRunner().invoke(app, [name, "--help"], env={"COLUMNS": "80"})
        assert result.exit_code == 0, result.output
        assert "…" not in result.output and max(map(len, result.output.splitlines())) <= 80, (
            name,
            result.output,
        )
    assert (
        "--speculative-eagle-topk"
        in CliRunner().invoke(app, ["generate", "--help"], env={"COLUMNS": "80"}).output
    )
