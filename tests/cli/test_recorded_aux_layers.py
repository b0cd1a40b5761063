"""--aux-layers given for a drafter that records its training layers (a specdraft manifest, a
training checkpoint step-N.pt): the same layers are accepted, others are refused in one line naming
both lists in specdraft indices, by every command that takes the option
(`checkpoint.refuse_other_aux_layers`), never ignored."""

from __future__ import annotations

import json

import pytest

from specdraft.checkpoint import load_draft
from tests.support.cli import flat, invoke
from tests.support.doctor_helpers import draft_checkpoint, one_thread  # noqa: F401
from tests.support.drafts import save_training_checkpoint
from tests.support.tiny_tokenizer import save_tiny_tokenizer


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """(drafter with its manifest, the same drafter as a training checkpoint, their 8-layer target):
    trained on [2, 4, 5]."""
    root = tmp_path_factory.mktemp("recorded")
    draft, target = draft_checkpoint(root, num_layers=8, aux=(2, 4, 5))
    save_tiny_tokenizer(target)
    loaded = load_draft(draft)
    return draft, save_training_checkpoint(loaded.model, loaded.manifest, root / "run"), target


@pytest.fixture(autouse=True)
def no_server(monkeypatch):
    import specdraft.serve.server

    monkeypatch.setattr(specdraft.serve.server, "serve", lambda app_, host, port: None)


def command_line(command: str, source, target, out) -> list[str]:
    given = ["--target", str(target)]
    return {
        "inspect": ["inspect", str(source), *given],
        "convert": ["convert", str(source), str(out), "--layout", "sglang", *given],
        "export": ["export", str(source), str(out), "--engine", "vllm", *given],
        "doctor": ["doctor", str(source), *given],
        "generate": [
            "generate",
            *given,
            "--draft",
            str(source),
            "--prompt",
            "hello",
            "--max-new-tokens",
            "2",
        ],
        "serve": ["serve", *given, "--draft", str(source), "--port", "8123"],
    }[command]


@pytest.mark.parametrize(
    "command, source",
    [
        *(
            (command, "manifest")
            for command in ("inspect", "convert", "export", "doctor", "generate", "serve")
        ),
        *((command, "step") for command in ("export", "generate", "serve")),
    ],
)
def test_other_layers_are_refused_naming_both(recorded, tmp_path, command, source):
    draft, step, target = recorded
    path = draft if source == "manifest" else step
    result = invoke(
        [*command_line(command, path, target, tmp_path / "out"), "--aux-layers", "sglang:0,2,5"]
    )
    where = draft / "specdraft_manifest.json" if source == "manifest" else step
    assert result.exit_code == (2 if command == "doctor" else 1), (
        result.output
    )  # doctor: an unusable input
    assert flat(result.output) == (
        f"error: {where}: the drafter was trained on aux layers [2, 4, 5] (specdraft "
        "indices), which it records; --aux-layers [1, 3, 6] names other layers: drop "
        "--aux-layers (it names the layers of a drafter without a manifest)"
    )
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "command, source", [("doctor", "manifest"), ("export", "step"), ("generate", "step")]
)
def test_the_recorded_layers_are_accepted(recorded, tmp_path, command, source):
    draft, step, target = recorded
    path = draft if source == "manifest" else step
    result = invoke(
        [*command_line(command, path, target, tmp_path / "out"), "--aux-layers", "vllm:2,4,5"]
    )
    assert result.exit_code == 0, result.output
    if command == "export":
        assert json.loads((tmp_path / "out" / "config.json").read_text())[
            "eagle_aux_hidden_state_layer_ids"
        ] == [2, 4, 5]
