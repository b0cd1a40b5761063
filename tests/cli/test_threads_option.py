"""--threads on every command that runs torch here: capture, regenerate and train take generate's
option (same help) and set torch's thread count before their stage loads anything."""

from __future__ import annotations

import pytest
import torch

from specdraft.errors import SpecdraftError
from tests.support.cli import flat, invoke
from tests.support.tiny_models import save_tiny_model


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize(
    "command, stage",
    [
        ("capture", "specdraft.capture.stage.capture_dataset"),
        ("regenerate", "specdraft.regenerate.run.regenerate_file"),
        ("train", "specdraft.train.config.train_source"),
    ],
)
def test_threads_are_set_before_the_stage_runs(
    tmp_path, monkeypatch, restore_threads, command, stage
):
    target = save_tiny_model("llama", tmp_path / "target")
    data = tmp_path / "data.jsonl"
    data.write_text('{"text": "hello"}\n')
    seen = []

    def stage_runs(*args, **kwargs):
        seen.append(torch.get_num_threads())
        raise SpecdraftError("stopped by the test")

    module, name = stage.rsplit(".", 1)
    monkeypatch.setattr(module + "." + name, stage_runs)
    threads = torch.get_num_threads() + 1
    args = {
        "capture": [str(target), str(data), str(tmp_path / "store")],
        "regenerate": [
            str(data),
            str(tmp_path / "out.jsonl"),
            "--target",
            str(target),
            "--no-chat",
        ],
        "train": [
            str(data),
            str(tmp_path / "run"),
            "--online",
            "--target",
            str(target),
            "--no-chat",
        ],
    }[command]
    result = invoke([command, *args, "--threads", str(threads)])
    assert "stopped by the test" in result.output and result.exit_code == 1, result.output
    assert seen == [threads]


@pytest.mark.parametrize("command", ["capture", "regenerate", "train"])
def test_threads_help_is_generates(command):
    def threads_help(name: str) -> str:
        text = flat(invoke([name, "--help"]).output)
        return text[text.index("--threads") :][:200]

    assert threads_help(command) == threads_help("generate")


def test_every_command_has_the_one_threads_default_and_the_readme_states_it():
    """--threads: 1 in demo, torch's all cores elsewhere, was two defaults; now every command's is
    `machine_load.DEFAULT_THREADS`, with one help text, and the README says which."""
    from pathlib import Path

    import typer

    from specdraft.cli import app
    from specdraft.machine_load import DEFAULT_THREADS

    def commands(command, path):
        for name, sub in getattr(command, "commands", {}).items():
            yield from commands(sub, [*path, name])
        if not hasattr(command, "commands"):
            yield " ".join(path), command

    threads = {
        path: (param.default, param.help)
        for path, command in commands(typer.main.get_command(app), [])
        for param in command.params
        if "--threads" in param.opts
    }
    assert {"demo", "generate", "serve", "tune", "train", "capture", "regenerate"} <= set(threads)
    assert {default for default, _ in threads.values()} == {DEFAULT_THREADS}
    assert len({text for _, text in threads.values()}) == 1, threads
    readme = " ".join((Path(__file__).parents[2] / "README.md").read_text().split())
    assert f"one CPU thread by default (`--threads {DEFAULT_THREADS}`;" in readme
