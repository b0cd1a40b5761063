"""A DFlash drafter (its manifest, config.json or training checkpoint) given to a command that
reads EAGLE-3 drafters is the one DFlash line (`layouts.dflash_refusal`), not DraftConfig's
"unknown keys" (a fresh user's inspect / export / doctor of a `train --method dflash` run)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from specdraft.checkpoint import CheckpointError
from specdraft.checkpoint.dflash import load_dflash_draft, save_dflash_draft
from specdraft.checkpoint.manifest import Manifest
from specdraft.checkpoint.training import load_training_checkpoint
from tests.support.dflash import tiny_dflash_draft

LINE = "a DFlash drafter (DFlashDraftModel), which this reads as EAGLE-3 only; inspect, export"
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


def saved_dflash(tmp_path, **kw):
    draft = tiny_dflash_draft(**kw).float()
    manifest = Manifest(draft=draft.cfg.to_dict(), target={}, aux_layers=[1, 2, 3])
    manifest.extra["method"] = "dflash"
    return draft, save_dflash_draft(draft, tmp_path / "draft", manifest)


def test_a_saved_dflash_drafter_loads_back_exactly(tmp_path):
    draft, out = saved_dflash(tmp_path)
    loaded, manifest = load_dflash_draft(out)
    assert loaded.cfg == draft.cfg
    assert manifest.extra == {"method": "dflash"} and manifest.aux_layers == [1, 2, 3]
    mine, theirs = loaded.state_dict(), draft.state_dict()
    assert mine.keys() == theirs.keys()
    assert all(torch.equal(mine[k], theirs[k]) for k in mine)


def test_a_tensor_that_matches_nothing_and_one_missing_are_named(tmp_path):
    _, out = saved_dflash(tmp_path)
    tensors = load_file(out / "model.safetensors")
    tensors["midlayer.fc.weight"] = tensors.pop("fc.weight")
    save_file(tensors, out / "model.safetensors")
    with pytest.raises(CheckpointError) as raised:
        load_dflash_draft(out)
    message = str(raised.value)
    assert message.startswith(f"{out / 'model.safetensors'}: not the DFlash drafter")
    assert "matching no parameter: midlayer.fc.weight" in message
    assert "no tensor fills: fc.weight" in message


@pytest.mark.parametrize(
    "change, named",
    [
        (
            {"layer_types": ["full_attention", "sliding_attention"]},
            "layer_types[1] 'sliding_attention' (every layer must be full_attention)",
        ),
        ({"attention_bias": True}, "attention_bias set"),
        ({"hidden_act": "gelu"}, "hidden_act set"),
        ({"dflash_config": {"block_size": 4}}, "'dflash_config.mask_token_id'"),
        ({"num_target_layers": 2}, "target_layer_ids [0, 1, 2]: need ids of decoder layers 0..1"),
    ],
)
def test_a_network_the_drafter_does_not_compute_is_refused(tmp_path, change, named):
    _, out = saved_dflash(tmp_path)
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, **change}))
    with pytest.raises(CheckpointError) as raised:
        load_dflash_draft(out)
    assert str(raised.value).startswith(f"{out / 'config.json'}: ")
    assert named in str(raised.value)


def test_a_config_block_other_than_the_trained_one_is_refused(tmp_path):
    """config.json edited to block 16 over a drafter the manifest records as trained on block 4:
    refused naming config.json, both values and the fix (a shape that fits is checked against
    the training record)."""
    _, out = saved_dflash(tmp_path)
    config = json.loads((out / "config.json").read_text())
    config["block_size"] = 16
    config["dflash_config"]["block_size"] = 16
    (out / "config.json").write_text(json.dumps(config))
    message = refusal(out)
    assert message.startswith(f"{out / 'config.json'}: block_size 16, but the drafter was trained")
    assert "on blocks of 4 (specdraft_manifest.json)" in message
    assert "write block_size 4 (top-level and dflash_config.block_size)" in message


def test_a_config_mask_token_other_than_the_trained_one_is_refused(tmp_path):
    """config.json edited to another mask token id (still a row of the embedding, so every
    shape fits) is refused naming config.json, both ids and the fix; doctor's
    mask_token_matches_training fails the same file."""
    _, out = saved_dflash(tmp_path)
    config = json.loads((out / "config.json").read_text())
    trained = config["dflash_config"]["mask_token_id"]
    config["dflash_config"]["mask_token_id"] = trained - 1
    (out / "config.json").write_text(json.dumps(config))
    message = refusal(out)
    assert message.startswith(
        f"{out / 'config.json'}: mask_token_id {trained - 1}, but the drafter"
    )
    assert f"trained with mask token {trained} (specdraft_manifest.json)" in message
    assert f"write dflash_config.mask_token_id {trained} in config.json" in message


def refusal(out) -> str:
    """The one line load_dflash_draft refuses `out` with."""
    with pytest.raises(CheckpointError) as raised:
        load_dflash_draft(out)
    return str(raised.value)
