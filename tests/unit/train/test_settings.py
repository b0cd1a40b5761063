"""train.settings: a flag of one method refused for a run of another (the run would ignore it)."""

from __future__ import annotations

import pytest

from specdraft.errors import UnusableInput
from specdraft.train.config import run_config


@pytest.mark.parametrize(
    ("method", "given", "words"),
    [
        ("dflash", {"ttt_steps": 4}, "--ttt-steps 4: a setting of --method eagle3 / eagle3.1"),
        ("eagle3", {"block_size": 4}, "--block-size 4: a setting of --method dflash"),
        ("eagle3.1", {"block_size": 8}, "this run trains --method eagle3.1, which ignores it"),
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
