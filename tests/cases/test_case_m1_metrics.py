"""Case M1: accept length comes from raw counts (emitted tokens / verification steps) and
tau = 1 + sum_k p_k holds to rounding in every report, per request and cumulative."""

from __future__ import annotations

import pytest
from rich.console import Console

from specdraft.engine.metrics import metrics_table
from specdraft.engine.requests import SpecMetrics
from specdraft.engine.spec_config import SpecConfig
from tests.support.engine_helpers import one_thread, random_prompts, tiny_setup  # noqa: F401


def test_case_m1_tau_from_raw_counts_equals_one_plus_sum_pk():
    setup = tiny_setup("llama")
    engine = setup.engine(setup.trained, SpecConfig(4, 4, 16))
    results = [engine.generate(p, 30) for p in random_prompts(6, 8, seed=40)]
    for m in [r.metrics for r in results] + [engine.total]:
        assert m.accept_length == m.num_emitted_tokens / m.num_verify_steps
        assert abs(m.accept_length - (1 + sum(m.acceptance_per_position))) < 1e-12
        assert m.acceptance_per_position == [
            a / m.num_verify_steps for a in m.accepted_per_position
        ]
        assert all(a >= b for a, b in zip(m.accepted_per_position, m.accepted_per_position[1:]))
        assert len(m.accepted_per_position) == 4 and m.num_drafted_tokens == 15 * m.num_verify_steps
        m.check()
    total = engine.total
    assert total.num_requests == 6
    assert total.num_verify_steps == sum(r.metrics.num_verify_steps for r in results)
    assert total.num_output_tokens == sum(len(r.token_ids) for r in results) == 180
    assert total.accept_length > 1.0
    assert total.time_draft_s > 0 and total.time_verify_s > 0 and total.tokens_per_s > 0
    # emitted counts verification outcomes (the prefill token is in no step; truncation ignored)
    assert all(r.metrics.num_emitted_tokens >= len(r.token_ids) - 1 for r in results)


def test_case_m1_inconsistent_counts_fail_the_check():
    m = SpecMetrics(
        num_verify_steps=4,
        num_accepted_tokens=3,
        num_emitted_tokens=7,
        accepted_per_position=[2, 0],
    )
    with pytest.raises(AssertionError, match=r"do not sum to 3"):
        m.check()
    m = SpecMetrics(
        num_verify_steps=4,
        num_accepted_tokens=3,
        num_emitted_tokens=8,
        accepted_per_position=[2, 1],
    )
    with pytest.raises(AssertionError, match="emitted 8 != accepted 3"):
        m.check()


def test_case_m1_record_merge_and_table():
    a, b = SpecMetrics(), SpecMetrics()
    for depth in (0, 2, 3):
        a.record_step(3, depth)
    b.record_step(5, 5)
    merged = a.merge(b)
    assert merged.accepted_per_position == [3, 3, 2, 1, 1]
    assert merged.accept_length == (1 + 3 + 4 + 6) / 4 == 1 + sum(merged.acceptance_per_position)
    console = Console(width=120, record=True)
    console.print(metrics_table(merged))
    text = console.export_text()
    assert "accept length tau" in text and "3.500" in text and "0.75 0.75 0.50 0.25 0.25" in text
    assert merged.to_dict()["accept_length"] == 3.5
