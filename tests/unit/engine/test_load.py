"""A drafter that loads on a target it was not quite trained for is named in a note (generate and
serve print them): a target config whose rope differs from the manifest's record (the sizes match,
so nothing refuses it), and num_steps past the drafter's training-time-test steps."""

from __future__ import annotations

import shutil

import pytest
from typer.testing import CliRunner

from specdraft.cli import app
from specdraft.engine.load import load_engine
from specdraft.engine.spec_config import SpecConfig
from tests.support.cli import cli_args
from tests.support.doctor_helpers import draft_checkpoint, edit_config
from tests.support.tiny_tokenizer import save_tiny_tokenizer


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """(draft dir, target dir) of a seeded drafter whose manifest records 2 TTT steps."""
    draft, target = draft_checkpoint(
        tmp_path_factory.mktemp("notes"), training={"config": {"ttt_steps": 2}}
    )
    save_tiny_tokenizer(target)  # generate reads the target's tokenizer
    return draft, target


def test_a_faithful_pairing_has_no_notes(world):
    draft, target = world
    assert load_engine(target, draft, SpecConfig.chain(2)).notes == []


def test_a_target_with_another_rope_theta_is_noted(world, tmp_path):
    draft, target = world
    moved = tmp_path / "target"
    shutil.copytree(target, moved)

    def set_theta(config):
        if isinstance(config.get("rope_parameters"), dict):
            config["rope_parameters"]["rope_theta"] = 123.0
        config["rope_theta"] = 123.0

    edit_config(moved, set_theta)
    notes = load_engine(moved, draft, SpecConfig.chain(2)).notes
    assert len(notes) == 1, notes
    assert notes[0].startswith(
        f"{moved}: its config differs from the one the drafter was trained on (rope_theta "
    )
    assert "-> 123.0" in notes[0] and f"specdraft doctor {draft} --target {moved}" in notes[0]


def test_num_steps_past_the_ttt_steps_is_noted(world):
    draft, target = world
    notes = load_engine(target, draft, SpecConfig.chain(5)).notes
    assert notes == [
        "num_steps 5 > the drafter's 2 training-time-test steps: draft steps past 2 were never "
        "trained and are rarely accepted"
    ]


def test_generate_prints_the_notes(world, tmp_path):
    draft, target = world
    result = CliRunner().invoke(
        app,
        cli_args(
            "generate", target=target, draft=draft, prompt="a b", max_new_tokens=2, num_steps=5
        ),
        env={"COLUMNS": "400"},
    )
    assert "note: num_steps 5 > the drafter's 2 training-time-test steps" in result.output, (
        result.output
    )
