"""specdraft.demo.report: what the demo's numbers are against tune's and bench's (one sentence),
and the tune line that times the demo's own prompts and setting again."""

from __future__ import annotations

from pathlib import Path

from specdraft.bench.speedup import timing_summary
from specdraft.demo.report import DemoReport, summary


def row(steps, topk, tokens, speedups):
    return {
        "num_steps": steps,
        "topk": topk,
        "num_draft_tokens": tokens,
        "accept_length": 2.0,
        "acceptance": [0.5] * steps,
        **timing_summary([1000.0 * s for s in speedups], [1000.0] * len(speedups)),
    }


def demo_report(chosen: bool) -> DemoReport:
    sweep = [row(1, 1, 2, [1.2] * 3), row(3, 1, 4, [1.8] * 3)]
    return DemoReport(
        target="demo/target",
        aux_layers=[2, 3, 4],
        baseline={"accept_length": 1.0, "acceptance": [], **timing_summary([1e3] * 3, [1e3] * 3)},
        sweep=sweep,
        tree=row(4, 2, 8, [1.9] * 3),
        verdict="v",
        chosen=sweep[1] if chosen else {},
        drafter={"dir": "demo/train/draft"},
        prompts_file="demo/data/heldout-prompts.jsonl",
        max_new_tokens=96,
    )


def test_the_report_names_the_tune_line_of_its_prompts_and_setting(tmp_path):
    """The demo recommended 3 steps while tune, on other prompts, never timed them: the report now
    gives the tune command with the demo's prompts, tokens and recommended setting."""
    lines = summary(demo_report(chosen=True), tmp_path).splitlines()
    assert (
        "check: specdraft tune --target demo/target --draft demo/train/draft --prompts "
        "demo/data/heldout-prompts.jsonl --max-tokens 96 --num-steps 3 --topk 1 "
        "--num-draft-tokens 4 --threads 1"
    ) in lines
    (why,) = [line for line in lines if line.startswith("These numbers are")]
    assert "`specdraft tune` on the same prompts and setting" in why
    assert "`specdraft bench` times a server over HTTP" in why and why.count(". ") == 0
    fastest = summary(demo_report(chosen=False), tmp_path)  # none recommended: the fastest one
    assert "--num-steps 4 --topk 2 --num-draft-tokens 8 --threads 1" in fastest


def test_demo_and_tune_word_each_speed_as_it_is_measured():
    """One wording for each measurement (#35: the demo said "counting the prefill", tune "after
    the prefill", both unexplained): the demo divides every new token by the wall time, tune the
    tokens after each request's first by the time after its prefill, and each names the other's."""
    from specdraft.bench.speedup import DECODE_TOKENS_PER_S, WALL_TOKENS_PER_S
    from specdraft.bench.tune_model import decode_tokens_per_s
    from specdraft.bench.tune_render import OTHER_NUMBERS
    from specdraft.engine.requests import SpecMetrics

    (why,) = [
        line
        for line in summary(demo_report(chosen=True), Path("demo")).splitlines()
        if line.startswith("These numbers are")
    ]
    assert f"96 new tokens each; {WALL_TOKENS_PER_S}" in why and DECODE_TOKENS_PER_S in why
    assert "counting the prefill" not in why
    assert DECODE_TOKENS_PER_S in OTHER_NUMBERS and WALL_TOKENS_PER_S in OTHER_NUMBERS
    metrics = SpecMetrics(
        num_requests=2, num_output_tokens=22, time_prefill_s=1.0, time_verify_s=2.0
    )
    assert decode_tokens_per_s(metrics) == 10.0  # (22 - 2) tokens / (3 - 1) s
