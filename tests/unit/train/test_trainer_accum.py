"""Gradient accumulation: a step's micro-batches add up to the gradient of one batch.

Each micro-batch's loss is normalised by the supervised positions of the whole step, so
batch 8 run as 1, 2 or 4 micro-batches ends with the same weights up to float rounding
(measured: max |w_2 - w_1| 3.7e-7, |w_4 - w_1| 6.4e-7 after 5 steps, weights up to 1.0;
normalising each micro-batch by its own counts instead is off by 3.4e-3).
"""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from specdraft.train.loop import TrainConfig, train
from specdraft.train.sources import OnlineData
from tests.support.train_world import (
    AUX,
    make_samples,
    make_target,
    read_metrics,
    small_config,
)


class Recording:
    """A TrainData that records the size of every batch it serves."""

    def __init__(self, inner) -> None:
        self.inner, self.info, self.sizes = inner, inner.info, []

    def __len__(self) -> int:
        return len(self.inner)

    def token_counts(self, sample_ids):
        return self.inner.token_counts(sample_ids)

    def batch(self, sample_ids, max_length, device):
        self.sizes.append(len(sample_ids))
        return self.inner.batch(sample_ids, max_length, device)


@pytest.fixture(scope="module")
def online(tmp_path_factory):
    target = make_target(tmp_path_factory.mktemp("accum") / "target")
    return OnlineData(target, make_samples(48), AUX)


def test_micro_batches_give_the_weights_of_one_batch(online, tmp_path):
    weights, records = {}, {}
    for accum in (1, 2, 4):
        data = Recording(online)
        cfg = small_config(total_steps=5, grad_accum_steps=accum, val_fraction=0.0, save_every=5)
        result = train(cfg, data, tmp_path / f"accum{accum}", progress=False)
        assert data.sizes == [8 // accum] * accum * 5  # really split: accum forwards per step
        weights[accum] = load_file(str(result.draft_dir / "model.safetensors"))
        records[accum] = read_metrics(tmp_path / f"accum{accum}")
    for accum in (2, 4):
        assert weights[accum].keys() == weights[1].keys()
        for key, w in weights[1].items():
            torch.testing.assert_close(weights[accum][key], w, rtol=0, atol=2e-6, msg=key)
        for a, b in zip(records[1], records[accum], strict=True):
            assert b["total"] == a["total"] and b["cond_total"] == a["cond_total"]
            assert b["loss"] == pytest.approx(a["loss"], rel=1e-6)
            assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-5)


def test_a_batch_that_does_not_split_into_micro_batches_is_refused(online, tmp_path):
    with pytest.raises(
        ValueError,
        match=r"^--batch-size 8 does not split into 1 rank\(s\) x --grad-accum-steps 3 "
        r"micro-batches: use a multiple of 3 or --grad-accum-steps 2$",
    ):
        train(small_config(grad_accum_steps=3), online, tmp_path / "run", progress=False)
    with pytest.raises(ValueError, match="^--grad-accum-steps 0: must be positive$"):
        TrainConfig(grad_accum_steps=0)
