"""train.settings: a flag or --config key of one method refused for a run of another (the run would
ignore it); the repository's own configs and saved ones of every field pass."""

from __future__ import annotations

import json

import pytest

from specdraft.errors import UnusableInput
from specdraft.train.config import run_config
from specdraft.train.settings import TrainConfig
from tests.support.paths import REPO

ASSETS = REPO / "tests" / "assets" / "pycode25m_draft"


@pytest.mark.parametrize(
    ("method", "given", "words"),
    [
        ("dflash", {"ttt_steps": 4}, "--ttt-steps 4: a setting of --method eagle3 / eagle3.1"),
        ("eagle3", {"block_size": 4}, "--block-size 4: a setting of --method dflash"),
        ("eagle3.1", {"block_size": 8}, "this run trains --method eagle3.1, which ignores it"),
        ("dflash", {"draft_vocab_size": 32}, "--draft-vocab-size 32: a setting of --method eagle3"),
    ],
)
def test_a_flag_of_another_method_is_refused(tmp_path, method, given, words):
    with pytest.raises(UnusableInput, match=words):
        run_config(None, tmp_path / "run", False, method=method, **given)


def test_each_methods_own_flags_and_unset_ones_pass(tmp_path):
    dflash = run_config(
        None, tmp_path / "run", False, method="dflash", block_size=4, ttt_steps=None
    )
    assert (dflash.method, dflash.block_size) == ("dflash", 4)
    eagle = run_config(None, tmp_path / "run", False, method="eagle3", ttt_steps=4, block_size=None)
    assert eagle.ttt_steps == 4


def write_config(tmp_path, values: dict):
    path = tmp_path / "c.json"
    path.write_text(json.dumps(values))
    return path


@pytest.mark.parametrize(
    ("method", "values", "words"),
    [
        ("eagle3", {"num_anchors": 16}, "key num_anchors is a setting of --method dflash"),
        ("eagle3.1", {"block_size": 8}, "key block_size is a setting of --method dflash"),
        (
            "eagle3",
            {"loss_decay_gamma": 7.0},
            "key loss_decay_gamma is a setting of --method dflash",
        ),
        ("dflash", {"ttt_steps": 4}, "key ttt_steps is a setting of --method eagle3 / eagle3.1"),
        (
            "dflash",
            {"draft_vocab_size": 32},
            "key draft_vocab_size is a setting of --method eagle3",
        ),
        ("dflash", {"step_weight": 0.5}, "key step_weight is a setting of --method eagle3"),
    ],
)
def test_a_config_key_of_another_method_is_refused(tmp_path, method, values, words):
    """A --config key the run's method ignores (it trained silently without it) is one line naming
    the file, the key, the method it belongs to and the fix, as a flag of another method is."""
    config = write_config(tmp_path, values)
    with pytest.raises(UnusableInput) as caught:
        run_config(config, tmp_path / "run", False, method=method)
    message = str(caught.value)
    assert message.startswith(f"--config {config}: {words}"), message
    key = next(iter(values))
    owner = "--method dflash" if "dflash" in words else "--method eagle3 / eagle3.1"
    assert message.endswith(
        f"this run trains --method {method}, which ignores it: drop {key} from {config}, or "
        f"train {owner}"
    ), message


def test_the_method_a_config_file_names_decides(tmp_path):
    """The file's "method" is the run's unless --method says otherwise (the method given wins)."""
    config = write_config(tmp_path, {"method": "dflash", "num_anchors": 16})
    assert run_config(config, tmp_path / "run", False).num_anchors == 16
    with pytest.raises(UnusableInput, match="trains --method eagle3, which ignores it"):
        run_config(config, tmp_path / "run", False, method="eagle3")


@pytest.mark.parametrize("method", ["eagle3", "dflash"])
def test_a_saved_config_of_every_field_at_its_defaults_passes(tmp_path, method):
    """TrainConfig.to_dict() holds both methods' fields at their defaults (tests' and users' saved
    configs): keys that change nothing are no setting of another method."""
    config = write_config(tmp_path, TrainConfig(method=method, total_steps=3).to_dict())
    assert run_config(config, tmp_path / "run", False).method == method


@pytest.mark.parametrize("name", sorted(p.name for p in ASSETS.glob("train_config*.json")))
def test_the_repositorys_train_configs_stay_valid(tmp_path, name):
    cfg = run_config(ASSETS / name, tmp_path / "run", False)
    assert cfg.method == ("dflash" if "dflash" in name else "eagle3")
