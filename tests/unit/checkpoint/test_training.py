"""The training checkpoints a run writes (`checkpoint.training`): a `--method dflash` run's
step-N.pt reads back as its DFlash drafter (`load_dflash_training_checkpoint`, through
`load_dflash_draft` and `is_dflash_drafter`, what inspect, export, generate, serve and tune
dispatch on), an EAGLE-3 run's does not, and `training_method` tells them apart."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from specdraft.checkpoint import CheckpointError, checkpoint_paths
from specdraft.checkpoint.dflash import is_dflash_drafter, load_dflash_draft
from specdraft.checkpoint.training import (
    load_dflash_training_checkpoint,
    load_training_checkpoint,
    training_method,
)
from specdraft.train.loop import train
from tests.support.train_world import VOCAB, make_world, one_thread, small_config  # noqa: F401

DFLASH = dict(method="dflash", block_size=4, num_anchors=4)
DRAFT = {"mask_token_id": VOCAB - 1, "num_hidden_layers": 1}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """(the DFlash run, the EAGLE-3 run) of 10 steps each on the trainer's tiny store, a
    checkpoint every 5 steps."""
    root = tmp_path_factory.mktemp("runs")
    store = make_world(root)[2]
    steps = dict(total_steps=10, save_every=5, val_fraction=0.0, warmup_steps=2)
    dflash = small_config(**DFLASH, draft_overrides=DRAFT, **steps)
    train(dflash, store, root / "dflash", progress=False)
    train(small_config(**steps), store, root / "eagle3", progress=False)
    return root / "dflash", root / "eagle3"


def test_a_dflash_checkpoint_reads_back_as_its_drafter(runs):
    dflash, _ = runs
    first, last = checkpoint_paths(dflash)
    assert (first.name, last.name) == ("step-00000005.pt", "step-00000010.pt")
    draft, manifest = load_dflash_training_checkpoint(last)
    final = load_file(str(dflash / "draft" / "model.safetensors"))
    state = draft.state_dict()
    assert state.keys() == final.keys()
    for key, value in final.items():  # the last checkpoint is the run's drafter
        assert torch.equal(state[key], value), key
    assert draft.cfg.block_size == 4 and draft.cfg.mask_token_id == VOCAB - 1
    assert manifest.training["steps"] == 10 and manifest.training["checkpoint"] == str(last)
    assert manifest.extra == {"method": "dflash"}
    earlier = load_dflash_draft(first, dtype=torch.float64)[0]  # the loader the commands use
    assert earlier.fc.weight.dtype == torch.float64
    assert not torch.equal(earlier.fc.weight.float(), draft.fc.weight)  # five steps earlier


def test_the_method_tells_the_readers_apart(runs, tmp_path):
    dflash, eagle3 = runs
    dflash_step, eagle3_step = checkpoint_paths(dflash)[-1], checkpoint_paths(eagle3)[-1]
    assert training_method(dflash_step) == "dflash" and training_method(eagle3_step) == "eagle3"
    assert training_method(dflash / "draft") is None
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    assert training_method(tmp_path / "junk.pt") is None
    assert is_dflash_drafter(dflash_step) and is_dflash_drafter(dflash / "draft")
    assert not is_dflash_drafter(eagle3_step) and not is_dflash_drafter(eagle3 / "draft")
    with pytest.raises(CheckpointError, match="an EAGLE-3 run's training checkpoint"):
        load_dflash_training_checkpoint(eagle3_step)
    with pytest.raises(CheckpointError, match="a DFlash drafter"):  # the EAGLE-3 reader's line
        load_training_checkpoint(dflash_step)
    assert load_training_checkpoint(eagle3_step).manifest.training["steps"] == 10


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_a_sharded_dflash_checkpoint_reads_back(tmp_path):
    """The step-N directory several ranks write (torch.distributed.checkpoint shards and
    trainer.pt), here by one process: the same reader, the trainer's tensors."""
    from specdraft.train.run_dir import write_sharded_checkpoint
    from specdraft.train.store_data import StoreData
    from specdraft.train.trainer import Trainer

    store = make_world(tmp_path)[2]
    config = small_config(**DFLASH, draft_overrides=DRAFT, total_steps=3, val_fraction=0.0)
    trainer = Trainer(config, StoreData(store))
    trainer.train_step(list(range(8)))
    path = write_sharded_checkpoint(trainer, tmp_path / "run")
    assert path.is_dir() and training_method(path) == "dflash" and is_dflash_drafter(path)
    draft, manifest = load_dflash_draft(path)
    want = trainer.model.draft.state_dict()
    assert all(torch.equal(draft.state_dict()[k], want[k]) for k in want)
    assert manifest.training["steps"] == 1
