"""Case S5: a drafter with low acceptance at 15 chain steps is slower than no speculation.
bench reports speedup < 1.0 against the same engine without speculation; tune reports the
current setting's predicted and measured tokens/s below plain decoding and recommends fewer
steps or no speculation."""

from __future__ import annotations

from specdraft.bench.config import BenchConfig
from specdraft.bench.report import markdown
from specdraft.bench.sweep import run_bench
from specdraft.bench.tune import tune
from specdraft.bench.tune_model import TuneConfig
from specdraft.bench.tune_render import render
from specdraft.engine.spec_config import SpecConfig
from tests.support.engine_helpers import one_thread, random_prompts, tiny_setup  # noqa: F401
from tests.support.serve_helpers import (
    VirtualClock,
    engine,
    modelled_engine,
    own_target,
    running,
    text_prompts,
    word_tokenizer,
    write_prompts,
)
from tests.support.tune_helpers import modelled_bench

DEEP = SpecConfig.chain(15)


def test_case_s5_bench_reports_speedup_below_one(tmp_path):
    """Both engines decode for real; their seconds are modelled on a virtual clock that bench
    times with (a target forward 10 ms, a draft step 1 ms: a memory-bound target), so the
    speedup is that of the engines' tokens, not of this machine's load."""
    setup = tiny_setup("llama")
    tok = word_tokenizer()
    prompts = write_prompts(tmp_path / "prompts.jsonl", text_prompts(4, 8, seed=50))
    clock = VirtualClock()
    spec_engine = modelled_engine(
        engine(own_target(setup), setup.untrained, DEEP, tok), clock, 0.01, 0.001
    )
    plain_engine = modelled_engine(engine(own_target(setup), None, None, tok), clock, 0.01, 0.001)
    with running(spec_engine, tok) as spec, running(plain_engine, tok) as plain:
        cfg = BenchConfig(spec.url, plain.url, str(prompts), (1, 2), max_tokens=24, num_prompts=4)
        report = run_bench(cfg, clock=clock)
    assert all(level.spec.accept_length < 1.2 for level in report.spec.levels)  # low acceptance
    assert all(p.speedup < 1.0 for p in report.speedups), report.speedups
    text = markdown(report)
    assert "loses at every concurrency measured" in text
    assert (
        f"| 1 | {report.speedups[0].speedup:.2f}x | {report.speedups[0].speedup_std:.2f} | loses |"
        in text
    )


def check_report(report, current_speedup_below: float = 1.0) -> str:
    current = report.current
    assert current.spec == DEEP and current.speedup < current_speedup_below
    assert current.predicted_tps < report.plain_predicted_tps  # the model saw it coming
    rec = report.recommendation
    assert rec is None or rec.spec.num_steps < DEEP.num_steps
    text = render(report)
    line = next(x for x in text.splitlines() if x.startswith("current: steps 15"))
    assert f"{current.predicted_tps:.1f}" in line and f"{current.measured_tps:.1f}" in line
    return text


def test_case_s5_tune_recommends_no_speculation_when_drafting_costs_like_the_target():
    """As on the CPU, the tiny drafter's step costs about half a target step (given, not timed:
    `tests.support.tune_helpers`): nothing wins."""
    setup = tiny_setup("llama")
    cfg = TuneConfig(max_new_tokens=24, probe_steps=4, topks=(1,), num_measure=2, current=DEEP)
    prompts = random_prompts(3, 8, seed=51)
    bench = modelled_bench(
        setup.target, setup.untrained, prompts, cfg, verify_s=0.01, draft_s=0.005
    )
    report = tune(setup.target, setup.untrained, prompts, cfg, bench=bench)
    text = check_report(report, current_speedup_below=0.5)
    assert report.recommendation is None and report.vllm_recommendation is None
    assert (
        "recommendation: no speculation" in text and "launch without --speculative-* flags" in text
    )


def test_case_s5_tune_on_a_memory_bound_target_recommends_fewer_steps_or_none():
    """A target forward of 10 ms whatever its tokens (a large model on a GPU) and 1 ms draft steps,
    given, not timed: 15 cheap drafts still lose."""
    setup = tiny_setup("llama")
    cfg = TuneConfig(
        max_new_tokens=16, probe_steps=3, topks=(1,), num_measure=2, current=DEEP, repeats=2
    )
    prompts = random_prompts(3, 8, seed=52)
    bench = modelled_bench(
        setup.target, setup.untrained, prompts, cfg, verify_s=0.01, draft_s=0.001
    )
    report = tune(setup.target, setup.untrained, prompts, cfg, bench=bench)
    check_report(report)
