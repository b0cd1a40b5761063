"""Drafter files a user gives that cannot be read: one SpecdraftError naming the file and the fix
(never the OS's or torch's bare exception, which the CLI prints as a bug)."""

import pytest
import torch

from specdraft.checkpoint import CheckpointError, Manifest, load_draft, read_config, save_draft
from specdraft.checkpoint.layouts import UnreadableCheckpointFile, check_layout
from specdraft.checkpoint.weights import DamagedCheckpoint
from specdraft.errors import DamagedFile, SpecdraftError
from tests.support.drafts import tiny_draft


def test_a_config_json_the_os_will_not_read_is_named_with_the_fix(tmp_path):
    (tmp_path / "config.json").mkdir()  # a directory in its place: unreadable, even as root
    with pytest.raises(UnreadableCheckpointFile) as caught:
        read_config(tmp_path)
    error = caught.value
    assert isinstance(error, SpecdraftError) and isinstance(error, OSError)
    assert str(error).startswith(f"{tmp_path / 'config.json'}: cannot be read (Is a directory); ")
    assert "re-export the drafter" in str(error)
    assert error.strerror == "Is a directory"  # for callers that print their own line


def test_a_config_json_that_is_not_text_is_not_json(tmp_path):
    (tmp_path / "config.json").write_bytes(b"\xff\xfe{\x00")
    with pytest.raises(CheckpointError, match=r"config.json: not valid JSON \(not UTF-8 text\); "):
        read_config(tmp_path)


def test_a_manifest_that_cannot_be_read_is_named(tmp_path):
    (tmp_path / "m.json").write_bytes(b"\x80\x81")
    with pytest.raises(CheckpointError, match=r"m.json: not valid JSON \(not UTF-8 text\); "):
        Manifest.read(tmp_path / "m.json")
    (tmp_path / "d.json").mkdir()
    with pytest.raises(
        UnreadableCheckpointFile, match=r"d.json: cannot be read \(Is a directory\)"
    ):
        Manifest.read(tmp_path / "d.json")


def test_an_unknown_layout_and_a_specdraft_layout_without_manifest_are_checkpoint_errors(tmp_path):
    with pytest.raises(CheckpointError, match="unknown layout 'hf': choose one of specdraft"):
        check_layout("hf")
    with pytest.raises(CheckpointError, match="the specdraft layout needs a manifest"):
        save_draft(tiny_draft(), tmp_path / "out", layout="specdraft")
    assert not (tmp_path / "out").exists()


def test_a_damaged_training_checkpoint_is_named_as_damaged(tmp_path):
    step = tmp_path / "run" / "checkpoints" / "step-3.pt"
    step.parent.mkdir(parents=True)
    torch.save({"step": 3, "config": {}, "model": {"w": torch.zeros(4096)}}, step)
    data = bytearray(step.read_bytes())
    data[200:3000] = bytes(2800)  # the archive's members overwritten: still a zip to is_zipfile
    step.write_bytes(bytes(data))
    with pytest.raises(DamagedCheckpoint) as caught:
        load_draft(step)
    assert isinstance(caught.value, DamagedFile)  # the CLI exits 2, as for any file cut short
    assert str(caught.value).startswith(
        f"{step}: cannot be read as a training checkpoint, cut short or damaged ("
    )
    assert str(caught.value).endswith("pass another of the run's checkpoints, or its draft/")
