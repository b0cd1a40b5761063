"""Bad input to training is a SpecdraftError (printed as one line), still the builtin it was."""

from __future__ import annotations

import pytest

from specdraft.errors import SpecdraftError
from specdraft.train.config import TrainConfig
from specdraft.train.dist import Ranks, resolve_device
from specdraft.train.errors import BadTrainSetting, RunDirInUse
from specdraft.train.run_dir import check_run_dir
from specdraft.train.trainer import micro_batch_size


def test_a_batch_that_ranks_and_micro_batches_cannot_share_is_a_bad_setting():
    ranks = Ranks(0, 2, resolve_device("cpu"), False)
    with pytest.raises(
        BadTrainSetting,
        match=r"--batch-size 6 does not split .* multiple of 4 or --grad-accum-steps 1",
    ):
        micro_batch_size(TrainConfig(batch_size=6, grad_accum_steps=2), ranks)
    assert issubclass(BadTrainSetting, SpecdraftError) and issubclass(BadTrainSetting, ValueError)
    assert micro_batch_size(TrainConfig(batch_size=8, grad_accum_steps=2), ranks) == 2


def test_an_out_that_is_a_file_is_a_run_dir_in_use(tmp_path):
    out = tmp_path / "run.txt"
    out.write_text("x")
    with pytest.raises(RunDirInUse, match="is a file") as caught:
        check_run_dir(out)
    assert isinstance(caught.value, SpecdraftError) and isinstance(caught.value, FileExistsError)
