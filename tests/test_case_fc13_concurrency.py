"""Case FC-13: speculation loses at high concurrency. bench sweeps concurrency against the
no-speculation baseline and reports the crossover point, or that there is none.

A batched engine is simulated by vLLM-like fakes whose step time grows with the requests in
flight (speculation verifies 4 tokens per request per step, so its steps grow faster);
specdraft's own server runs one sequence at a time, so its sweep has no crossover."""

from __future__ import annotations

import pytest

from specdraft.bench import BenchConfig, markdown, run_bench
from specdraft.engine.spec_config import SpecConfig
from specdraft.serve import serve_in_thread
from tests.engine_helpers import one_thread, tiny_setup  # noqa: F401
from tests.serve_helpers import engine, fake_vllm_app, running, slow_target, text_prompts, word_tokenizer, write_prompts


def test_case_fc13_bench_reports_the_crossover(tmp_path):
    prompts = write_prompts(tmp_path / "prompts.jsonl", ["w1 w2 w3"])
    spec_app = fake_vllm_app(lambda active: 0.004 * (1 + active), tokens_per_step=2, num_spec=3)
    plain_app = fake_vllm_app(lambda active: 0.010 * (1 + active / 16), tokens_per_step=1, num_spec=0)
    with serve_in_thread(spec_app) as spec, serve_in_thread(plain_app) as plain:
        report = run_bench(BenchConfig(spec.url, plain.url, str(prompts), (1, 2, 8), max_tokens=12,
                                       num_prompts=8, warmup=0))
    assert report.spec.kind == "vllm"
    assert [c for c, _ in report.speedups] == [1, 2, 8]
    assert report.speedups[0][1] > 1.0 and report.speedups[1][1] > 1.0 and report.speedups[2][1] < 1.0
    assert report.crossover.concurrency == 8
    assert "speculation stops winning by more than 5% between concurrency 2" in report.crossover.text
    for level in report.spec.levels:  # tau from vLLM's raw counters, M1
        assert level.spec.accept_length == 2.0 and level.spec.acceptance_per_position == [1.0, 0.0, 0.0]
        assert level.spec.num_draft_tokens == 3 * level.spec.num_drafts
    assert all(level.spec is None for level in report.baseline.levels)
    assert report.crossover.text in markdown(report) and "(ok)" in markdown(report)


def test_case_fc13_one_sequence_server_has_no_crossover(tmp_path):
    setup = tiny_setup("llama")
    tok = word_tokenizer()
    prompts = write_prompts(tmp_path / "prompts.jsonl", text_prompts(4, 8, seed=60))
    spec_engine = engine(slow_target(setup.target, 0.01), setup.trained, SpecConfig.chain(2), tok)
    plain_engine = engine(slow_target(setup.target, 0.01), None, None, tok)
    with running(spec_engine, tok) as spec, running(plain_engine, tok) as plain:
        report = run_bench(BenchConfig(spec.url, plain.url, str(prompts), (1, 4), max_tokens=12, num_prompts=4))
    assert all(s > 1.05 for _, s in report.speedups), report.speedups
    assert report.crossover.concurrency is None
    assert report.crossover.text.startswith("no crossover: speculation wins by more than 5% at every concurrency "
                                            "measured (up to 4")
    assert report.spec.levels[0].spec.accept_length == pytest.approx(report.spec.levels[0].usage_accept_length)
