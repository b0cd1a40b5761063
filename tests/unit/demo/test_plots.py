"""specdraft.demo.plots, through the data given to matplotlib (`plot_data`): the speedup panel
draws what the verdict uses (median same-round ratios, quartile bars), not median tokens/s, and
marks the tree and the recommended setting; the acceptance plot shows the recommended setting."""

from __future__ import annotations

import pytest

from specdraft.bench.speedup import timing_summary
from specdraft.demo.plots import plot_data, write_plots
from specdraft.demo.report import DemoReport


def row(steps, topk, tokens, tokens_per_s, plain, acceptance):
    return {
        "num_steps": steps,
        "topk": topk,
        "num_draft_tokens": tokens,
        "accept_length": 1 + sum(acceptance),
        "acceptance": acceptance,
        **timing_summary(tokens_per_s, plain),
    }


def demo_report(chosen: bool) -> DemoReport:
    """Plain decoding slowed in rounds 3-4 (1000, 1000, 200, 200): steps 5 has the highest median
    tokens/s (820, the old plot's peak) but steps 3 the highest median same-round ratio (1.4x)."""
    plain = [1000.0, 1000.0, 200.0, 200.0]
    sweep = [
        row(1, 1, 2, [1100.0, 1100.0, 220.0, 220.0], plain, [0.6]),
        row(3, 1, 4, [1300.0, 1300.0, 300.0, 300.0], plain, [0.7, 0.5, 0.3]),
        row(5, 1, 6, [1400.0, 1400.0, 240.0, 240.0], plain, [0.7, 0.5, 0.3, 0.2, 0.1]),
    ]
    return DemoReport(
        target="t",
        aux_layers=[1, 2, 3],
        baseline={"accept_length": 1.0, "acceptance": [], **timing_summary(plain, plain)},
        sweep=sweep,
        tree=row(4, 2, 8, [1200.0, 1200.0, 250.0, 250.0], plain, [0.8, 0.6, 0.4, 0.2]),
        chosen=sweep[1] if chosen else {},
    )


def test_the_speedup_panel_plots_the_verdicts_quantity_with_quartiles_and_marks():
    report = demo_report(chosen=True)
    data = plot_data(report)
    assert data.steps == [1, 3, 5]
    assert data.speedup == [r["speedup"] for r in report.sweep]
    assert max(r["tokens_per_s"] for r in report.sweep) == report.sweep[2]["tokens_per_s"]
    assert max(data.speedup) == data.speedup[1] == pytest.approx(1.4)  # steps 3 is the peak
    low, high = data.bars
    assert low[2] == pytest.approx(report.sweep[2]["speedup"] - report.sweep[2]["speedup_q1"])
    assert high[2] == pytest.approx(report.sweep[2]["speedup_q3"] - report.sweep[2]["speedup"])
    assert (data.tree.num_steps, data.tree.speedup) == (4, report.tree["speedup"])
    assert data.tree.label == "tree (topk 2, 8 draft tokens)"
    assert (data.recommended.num_steps, data.recommended.speedup) == (3, data.speedup[1])
    assert data.recommended.label == "recommended: num_steps 3, topk 1, num_draft_tokens 4"
    assert data.acceptance == [0.7, 0.5, 0.3]  # the recommended setting's, not the deepest chain's
    assert data.acceptance_of == "recommended: num_steps 3, topk 1, num_draft_tokens 4"


def test_without_a_recommendation_the_fastest_setting_is_shown_and_nothing_is_marked(tmp_path):
    report = demo_report(chosen=False)
    data = plot_data(report)
    assert data.recommended is None
    assert (
        data.acceptance_of == "fastest; none recommended: num_steps 3, topk 1, num_draft_tokens 4"
    )
    assert write_plots(report, tmp_path) == ["acceptance.png", "throughput.png"]
    assert all(
        (tmp_path / name).stat().st_size > 0 for name in ("acceptance.png", "throughput.png")
    )
