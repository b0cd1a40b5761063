"""`specdraft train --method eagle3.1` (train/config.py `draft_config`, train/settings.py): the
drafter gets the norm flags EAGLE-3.1 is defined by (`draft_config.EAGLE3_METHODS`) and no other,
its files carry them, draft_overrides may not change them, and a resume may not change the
method. On the tiny store the EAGLE-3 training tests use (conftest's `store`)."""

from __future__ import annotations

import json

import pytest
from safetensors.torch import load_file
from typer.testing import CliRunner

from specdraft.checkpoint import load_draft
from specdraft.cli import app
from specdraft.draft_config import NORM_FLAGS, method_of
from specdraft.errors import SettingsMismatch, UnusableInput
from specdraft.train.loop import train
from tests.support.train_world import one_thread, small_config  # noqa: F401 (autouse fixture)

EAGLE31 = {
    "norm_before_residual": False,
    "norm_before_fc": False,
    "fc_norm": True,
    "norm_output": True,
}


def test_an_eagle31_drafter_is_trained_with_fc_norm_and_norm_output(store, tmp_path):
    result = train(
        small_config(method="eagle3.1", total_steps=12), store, tmp_path / "run", progress=False
    )
    draft = result.draft_dir
    manifest = json.loads((draft / "specdraft_manifest.json").read_text())
    assert {k: manifest["draft"][k] for k in NORM_FLAGS} == EAGLE31
    assert manifest["training"]["config"]["method"] == "eagle3.1"
    config = json.loads((draft / "config.json").read_text())
    assert {k: bool(config.get(k)) for k in NORM_FLAGS} == EAGLE31  # what the engines read
    tensors = load_file(str(draft / "model.safetensors"))
    assert [tuple(tensors[f"fc_norm.{i}.weight"].shape) for i in range(3)] == [(32,)] * 3
    assert not any(name.startswith("input_norm") for name in tensors)
    assert any(not bool((tensors[f"fc_norm.{i}.weight"] == 1).all()) for i in range(3))  # trained
    assert method_of(load_draft(draft).model.cfg) == "eagle3.1"


def test_plain_eagle3_sets_no_norm_flag(store, tmp_path):
    result = train(
        small_config(total_steps=2, val_fraction=0.0), store, tmp_path / "run", progress=False
    )
    cfg = load_draft(result.draft_dir).model.cfg
    assert method_of(cfg) == "eagle3" and not any(getattr(cfg, k) for k in NORM_FLAGS)


@pytest.mark.parametrize(
    "overrides", [{"fc_norm": False}, {"norm_before_fc": True}, {"norm_before_residual": True}]
)
def test_draft_overrides_may_not_change_eagle31s_flags(overrides):
    with pytest.raises(UnusableInput, match="--method eagle3.1 sets fc_norm, norm_output and no"):
        small_config(method="eagle3.1", draft_overrides=overrides)
    assert small_config(method="eagle3.1", draft_overrides={"fc_norm": True}).method == "eagle3.1"
    assert small_config(draft_overrides=overrides).draft_overrides == overrides  # plain: any


def test_a_resume_may_not_change_the_method(store, tmp_path):
    run = tmp_path / "run"
    train(small_config(total_steps=10, save_every=5, val_fraction=0.0), store, run, progress=False)
    more = dict(total_steps=20, save_every=5, val_fraction=0.0)
    with pytest.raises(SettingsMismatch, match="--method 'eagle3' -> 'eagle3.1'"):
        train(small_config(method="eagle3.1", **more), store, run, resume=True, progress=False)
    refused = CliRunner().invoke(
        app, ["train", str(store), str(run), "--resume", "--method", "eagle3.1", "--steps", "20"]
    )
    assert refused.exit_code == 1 and "Traceback" not in refused.output, refused.output
    errors = [line for line in refused.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "--method 'eagle3' -> 'eagle3.1'" in errors[0], refused.output
