"""The demo's recommended setting: medians over rounds taken in turns with plain decoding, a
setting recommended only when it beats plain decoding beyond the noise (fixed numbers, no model)."""

from __future__ import annotations

import pytest

from specdraft.bench.speedup import pick_setting, timed_passes, timing_summary
from specdraft.demo.config import DemoConfig
from specdraft.demo.report import DemoReport, report_markdown
from specdraft.demo.verdict import verdict_text
from tests.support.demo import plain_baseline, sweep_report


def row(steps: int, speedups: list[float], topk: int = 1, tokens: int | None = None) -> dict:
    plain = [1000.0] * len(speedups)
    return {
        "num_steps": steps,
        "topk": topk,
        "num_draft_tokens": tokens or steps + 1,
        "accept_length": 1.0 + steps / 2,
        "acceptance": [0.5] * steps,
        **timing_summary([1000.0 * s for s in speedups], plain),
    }


def test_timing_summary_is_median_quartiles_and_range_of_same_round_ratios():
    summary = timing_summary(
        [1100.0, 1500.0, 900.0, 1200.0, 500.0], [1000.0, 1000.0, 600.0, 1000.0, 1000.0]
    )
    assert summary["tokens_per_s"] == 1100.0
    assert summary["speedup"] == pytest.approx(1.2)  # ratios 1.1, 1.5, 1.5, 1.2, 0.5
    assert (summary["speedup_q1"], summary["speedup_q3"]) == (
        pytest.approx(1.1),
        pytest.approx(1.5),
    )
    assert (summary["speedup_low"], summary["speedup_high"]) == (
        pytest.approx(0.5),
        pytest.approx(1.5),
    )


def test_settings_take_turns_with_plain_decoding():
    order = []
    runs = timed_passes(
        {"plain": 0, "a": 0, "b": 0}, 3, lambda name: order.append(name) or {"name": name}
    )
    assert order == ["plain", "a", "b", "a", "b", "plain", "b", "plain", "a"]  # rotated each round
    assert {name: len(r) for name, r in runs.items()} == {"plain": 3, "a": 3, "b": 3}


def test_one_lucky_or_unlucky_pass_does_not_decide():
    steady = row(3, [1.30, 1.28, 1.32, 1.29, 1.31])
    lucky = row(
        4, [1.05, 1.90, 1.02, 1.04, 1.06]
    )  # one fast pass: max() over single passes would pick it
    assert pick_setting([steady, lucky], 1.05) is steady
    spiked = row(
        5, [1.60, 1.62, 0.60, 1.61, 1.63]
    )  # one round hit by load: still clearly the fastest
    assert pick_setting([steady, lucky, spiked], 1.05) is spiked


def test_ties_within_noise_pick_the_fewest_draft_tokens():
    chain3 = row(3, [1.22, 1.30, 1.38, 1.30, 1.26])
    chain4 = row(
        4, [1.22, 1.31, 1.40, 1.36, 1.27]
    )  # fastest median, but within its own noise of chain 3
    chain1 = row(1, [1.12, 1.15, 1.18, 1.14, 1.16])
    assert pick_setting([chain4, chain1, chain3], 1.05) is chain3
    assert pick_setting([chain4, chain1], 1.05) is chain4
    text = verdict_text([chain4, chain1, chain3], chain3, 5, 1.05)
    assert text.startswith("Recommended setting: num_steps 3, topk 1, num_draft_tokens 4")
    assert "Within the noise of it: num_steps 4" in text and "1.30x (1.26-1.30x)" in text


def test_the_verdict_names_a_faster_median_that_the_lower_quartile_excluded():
    steady = row(3, [1.30, 1.32, 1.28, 1.31, 1.29])
    jumpy = row(5, [1.70, 1.75, 0.80, 0.90, 1.72])  # fastest median, slower than plain in 2 of 5
    text = verdict_text([steady, jumpy], pick_setting([steady, jumpy], 1.05), 5, 1.05)
    assert text.startswith("Recommended setting: num_steps 3")
    assert "The fastest median, num_steps 5, topk 1, num_draft_tokens 6 at 1.70x" in text
    assert "its lower quartile 0.90x is not above 1x" in text
    assert "fastest median" not in verdict_text([steady], steady, 5, 1.05)


@pytest.mark.parametrize(
    "speedups",
    [
        [0.95, 0.97, 0.93, 0.96, 0.98],  # slower than plain decoding
        [1.02, 1.03, 1.01, 1.04, 1.02],  # faster, but by less than min_speedup
        [
            1.20,
            1.25,
            0.90,
            0.95,
            1.30,
        ],  # slower than plain in two rounds of five: not beyond the noise
    ],
)
def test_no_recommendation_unless_faster_beyond_the_noise(speedups):
    rows = [row(2, speedups)]
    assert pick_setting(rows, 1.05) is None
    assert verdict_text(rows, None, 5, 1.05).startswith(
        "No setting is recommended: none was faster than plain"
    )


def test_report_says_when_nothing_is_recommended_and_when_the_machine_was_busy(tmp_path):
    sweep = [row(1, [0.9, 0.95, 0.92]), row(2, [1.0, 1.1, 0.97])]
    tree = row(2, [0.8, 0.85, 0.82], topk=2, tokens=4)
    baseline = plain_baseline([1000.0, 1300.0, 1100.0], [1.0] * 3)
    report = sweep_report(
        sweep,
        tree,
        baseline,
        verdict=verdict_text([*sweep, tree], None, 3, 1.05),
        launch_commands={"sglang": "python -m sglang.launch_server ..."},
    )
    text = report_markdown(report, DemoConfig(out=tmp_path))
    assert "No setting is recommended" in text and "Recommended setting" not in text
    assert "Not a recommendation" in text  # the launch commands are labelled as such
    assert "Warning: plain decoding itself varied 30% between rounds" in text
    assert (
        "Slower than plain decoding (median speedup below 1x): num_steps 1, topk 1, num_draft_tokens 2; "
        "num_steps 2, topk 2, num_draft_tokens 4." in text
    )
    assert "| 2 | 1 | 3 | 2.00 | 1000 | 1.00x (0.98-1.05x) |" in text


def test_the_doctor_table_shows_a_check_alike_on_both_sample_sets_once():
    """Most checks do not read the samples: one row for both sets; a check whose verdict or
    evidence differs between them keeps a row per set."""
    from specdraft.demo.report import doctor_rows

    same = {"check": "keys_match_engine", "verdict": "pass", "evidence": "every key read"}
    findings = [
        {**same, "samples": "train"},
        {"check": "acceptance", "verdict": "pass", "evidence": "0.41", "samples": "train"},
        {**same, "samples": "held-out"},
        {"check": "acceptance", "verdict": "warn", "evidence": "0.20", "samples": "held-out"},
    ]
    assert doctor_rows(findings) == [
        "| train and held-out | keys_match_engine | pass | every key read |",
        "| train | acceptance | pass | 0.41 |",
        "| held-out | acceptance | warn | 0.20 |",
    ]


def test_the_serve_line_carries_the_recommended_setting_as_the_readme_says(tmp_path):
    """The summary's serve line names the recommended setting, not the fastest one, and the
    README's serve section says so (it said the line carries the setting "measured best")."""
    from pathlib import Path

    from specdraft.demo.report import summary

    fastest, tied = row(3, [1.52, 1.50, 1.51]), row(1, [1.50, 1.49, 1.50])
    baseline = {"accept_length": 1.0, "acceptance": [], **timing_summary([1000.0] * 3, [1.0] * 3)}
    report = DemoReport(
        target="t",
        aux_layers=[2, 3, 4],
        baseline=baseline,
        sweep=[tied, fastest],
        tree=row(2, [0.9, 0.9, 0.9], topk=2, tokens=4),
        chosen=tied,
        drafter={"dir": "d"},
    )
    serve = next(
        line for line in summary(report, tmp_path).splitlines() if line.startswith("serve:")
    )
    assert "--num-steps 1 --topk 1 --num-draft-tokens 2" in serve, serve
    readme = " ".join((Path(__file__).parents[3] / "README.md").read_text().split())
    section = readme[readme.index("## Serve, check and benchmark") :][:1200]
    assert "measured best" not in readme
    assert "the same first line (`serve: ...`) with its recommended setting" in section


def test_report_gives_a_doctor_command_that_runs_from_its_folder(tmp_path):
    """A fresh user looked for a doctor line to copy in report.md and found only the table."""
    sweep = [row(1, [1.2, 1.3, 1.25])]
    report = sweep_report(
        sweep,
        row(2, [0.8, 0.85, 0.82], topk=2, tokens=4),
        plain_baseline([1000.0] * 3, [1.0] * 3),
        verdict=verdict_text(sweep, None, 3, 1.05),
        launch_commands={"sglang": "python -m sglang.launch_server ..."},
    )
    text = report_markdown(report, DemoConfig(out=tmp_path))
    assert (
        "`specdraft doctor ./export/sglang --target ./target --samples ./store-heldout "
        "--engine-args '<a launch line below>'`" in text
    )
