"""A DFlash drafter (its manifest, config.json or training checkpoint) given to a command that
reads EAGLE-3 drafters is the one DFlash line (`layouts.dflash_refusal`), not DraftConfig's
"unknown keys" (a fresh user's inspect / export / doctor of a `train --method dflash` run)."""

from __future__ import annotations

import json

import pytest
import torch

from specdraft.checkpoint import CheckpointError
from specdraft.checkpoint.manifest import Manifest
from specdraft.checkpoint.training import load_training_checkpoint

LINE = "a DFlash drafter (DFlashDraftModel); specdraft trains DFlash drafters (train --method dflash) but does not"
DFLASH_DRAFT = {"block_size": 16, "mask_token_id": 7, "num_hidden_layers": 5}


def test_a_dflash_manifest_is_the_dflash_line(tmp_path):
    path = tmp_path / "specdraft_manifest.json"
    path.write_text(
        json.dumps({"draft": DFLASH_DRAFT, "aux_layers": [1, 2, 3], "extra": {"method": "dflash"}})
    )
    with pytest.raises(CheckpointError) as raised:
        Manifest.read(path)
    assert str(raised.value).startswith(f"{path}: {LINE}")


def test_a_dflash_training_checkpoint_is_the_dflash_line(tmp_path):
    path = tmp_path / "step-00000010.pt"
    manifest = {"draft": DFLASH_DRAFT, "aux_layers": [1, 2, 3], "extra": {"method": "dflash"}}
    torch.save({"step": 10, "config": {"method": "dflash"}, "manifest": manifest}, path)
    with pytest.raises(CheckpointError) as raised:
        load_training_checkpoint(path)
    assert str(raised.value).startswith(f"{path}: {LINE}")
