"""benchmarks/batch_speed.py: its plain-stack reference computes the target's forward (batched,
each row at its own length, the query heads of a KV head stacked), and the bound's costs
between measured token counts (float32, CPU)."""

import pytest
import torch

from specdraft.engine.batch_target import batch_causal_mask
from specdraft.engine.fast_load import load_fast_target
from tests.support.benchmarks import load_benchmark
from tests.support.engine_helpers import TARGET_KW
from tests.support.tiny_models import tiny_model


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("batch_speed")


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    path = tmp_path_factory.mktemp("batch-speed") / "target"
    tiny_model("llama", seed=0, **TARGET_KW).save_pretrained(path)
    model = load_fast_target(path)  # 4 heads over 2 KV heads: stacked groups of 2
    model.setup_cache(3, 64)
    return model


def test_plain_stack_equals_the_targets_batched_forward(bench, target):
    torch.manual_seed(0)
    target.kv_stack.normal_()  # a cached prefix that the attention weighs
    starts, t, aux = [5, 9, 14], 3, (1, 3)
    inputs = bench.stack_inputs(target, starts, t)
    assert inputs.bias.shape == (3, 1, 2 * t, 24)  # 14 + 3 slots rounded up to 8
    ref_logits, ref_aux = bench.plain_stack(target, inputs, aux)
    cached = target.kv_stack.clone()
    mask = batch_causal_mask(torch.tensor(starts), t, inputs.bias.shape[-1])
    with torch.no_grad():
        out = target(inputs.ids, inputs.positions, inputs.slots, mask, aux)
    torch.testing.assert_close(ref_logits, out.logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ref_aux, out.aux_hidden, rtol=1e-5, atol=1e-5)
    # both wrote the same K/V at each row's own slots (the engine's forward rewrote them)
    torch.testing.assert_close(target.kv_stack, cached)
    assert not torch.equal(cached[:, :, 0, :, 5:8], torch.zeros_like(cached[:, :, 0, :, 5:8]))


def test_costs_between_measured_token_counts_are_interpolated(bench):
    costs = {
        (4, 1): {"engine": 2.0, "reference": 1.0},
        (4, 3): {"engine": 4.0, "reference": 5.0},
    }
    assert bench.interpolated(costs, 4, 2, "engine") == pytest.approx(3.0)
    assert bench.interpolated(costs, 4, 2, "best") == pytest.approx(2.5)  # of 1.0 and 4.0
    assert bench.interpolated(costs, 4, 4, "engine") is None  # past the last measured T
    # tau 2.5 with K = 2: 2.5 x forward(4, 1) / forward(4, 3)
    assert bench.bound(costs, 4, 2, 2.5, "engine") == pytest.approx(2.5 * 2.0 / 4.0)
    assert bench.bound(costs, 4, 2, 2.5, "best") == pytest.approx(2.5 * 1.0 / 4.0)
    assert bench.bound(costs, 8, 1, 2.0, "engine") is None
