"""`specdraft demo --method eagle3.1`: the method reaches the trainer, another method redoes the
train stage (a record written before --method existed reads as eagle3), and a method the demo
cannot run through its stages is refused (the report's line: test_cache.py)."""

from __future__ import annotations

import json

import pytest

from specdraft.demo import cache, stages
from specdraft.demo.cache import reconcile_cache
from specdraft.demo.config import DemoConfig
from specdraft.errors import UnusableInput


def test_the_method_reaches_the_trainer(tmp_path, stopped_train):
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / "index.json").write_text(json.dumps({"num_samples": 40}))
    with pytest.raises(RuntimeError, match="stop here"):
        stages.stage_train(DemoConfig(out=tmp_path, method="eagle3.1"), tmp_path / "store")
    assert stopped_train["config"].method == "eagle3.1"


def test_another_method_redoes_training(tmp_path):
    cfg = DemoConfig(out=tmp_path)
    reconcile_cache(cfg, print)
    (tmp_path / "train" / "draft").mkdir(parents=True)
    said = []
    reconcile_cache(DemoConfig(out=tmp_path, method="eagle3.1"), said.append)
    assert len(said) == 1 and "--method eagle3 -> eagle3.1" in said[0], said
    assert "redoing the train stage" in said[0] and not (tmp_path / "train").exists()


def test_a_record_from_before_the_method_reads_as_eagle3(tmp_path):
    record = cache.stage_settings(DemoConfig(out=tmp_path))
    del record["train"]["method"]
    (tmp_path / cache.SETTINGS_FILE).write_text(json.dumps({"stages": record}))
    reconcile_cache(DemoConfig(out=tmp_path), lambda line: pytest.fail(f"unchanged: {line}"))


def test_an_unknown_method_is_refused_naming_the_methods_the_demo_runs():
    with pytest.raises(
        UnusableInput, match="--method 'medusa': the demo trains eagle3 or eagle3.1"
    ):
        DemoConfig(method="medusa")


def test_dflash_beside_eagle3_keeps_the_eagle3_drafters_cache(tmp_path):
    """demo --method dflash trains its EAGLE-3 drafter as the default demo does (`eagle_method`):
    the same train-stage record, so a default demo's drafter is reused."""
    eagle3 = cache.stage_settings(DemoConfig(out=tmp_path))
    dflash = cache.stage_settings(DemoConfig(out=tmp_path, method="dflash"))
    assert dflash["train"] == eagle3["train"] and eagle3["train"]["method"] == "eagle3"
