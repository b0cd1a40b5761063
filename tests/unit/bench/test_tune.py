"""specdraft.bench.tune: the cost model, and end-to-end tuning on the tiny target (timings from a
cost model of a memory-bound GPU target, where speculation can win: `tests.support.tune_helpers`; the
engine's acceptance is real, no assertion depends on this machine's speed)."""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from specdraft.bench.config import BenchInputError
from specdraft.bench.tune import tune
from specdraft.bench.tune_model import (
    Costs,
    Measured,
    TuneConfig,
    calibrate,
    predict,
    tree_tokens,
)
from specdraft.bench.tune_render import render
from specdraft.cli import app
from specdraft.engine.requests import SpecMetrics
from specdraft.engine.spec_config import SpecConfig
from specdraft.machine_load import DEFAULT_THREADS
from tests.support.cli import cli_args, cli_options
from tests.support.engine_helpers import one_thread, random_prompts, tiny_setup  # noqa: F401
from tests.support.serve_helpers import saved_pair, text_prompts, write_prompts
from tests.support.tune_helpers import modelled_bench


def test_tree_tokens_and_config_checks():
    assert [tree_tokens(n, 1, 16) for n in (1, 3, 8)] == [2, 4, 9]
    assert [tree_tokens(n, 2, 16) for n in (1, 2, 3, 4, 5)] == [
        3,
        7,
        11,
        15,
        16,
    ]  # 1 + k + (n-1) k^2, capped
    cfg = TuneConfig(probe_steps=4, topks=(2,), current=SpecConfig(6, 4, 10))
    assert cfg.depth == 6 and cfg.all_topks == [1, 2, 4]
    with pytest.raises(ValueError, match="num_measure"):
        TuneConfig(num_measure=0)


def test_predict_follows_the_round_model():
    """tokens/s = (1 + sum_{j<=n} p_j) / (n t_draft + t_verify(m) + t_round)."""
    probe = Measured(
        SpecConfig.chain(4),
        SpecMetrics(num_verify_steps=100, accepted_per_position=[60, 30, 10, 5]),
    )
    costs = Costs({3: 0.010, 5: 0.011}, t_draft={1: 0.001}, t_round={1: 0.0005})
    tau, tps = predict(SpecConfig.chain(2), probe, costs)
    assert tau == pytest.approx(1.9) and tps == pytest.approx(1.9 / (2 * 0.001 + 0.010 + 0.0005))
    tau, tps = predict(SpecConfig.chain(4), probe, costs)
    assert tau == pytest.approx(2.05) and tps == pytest.approx(2.05 / (0.004 + 0.011 + 0.0005))


def test_tune_recommends_speculation_on_a_memory_bound_target():
    """A target forward of 10 ms whatever its tokens, a draft step of 1 ms (given, not timed)."""
    setup = tiny_setup("llama")
    cfg = TuneConfig(max_new_tokens=16, probe_steps=3, topks=(1,), num_measure=2, repeats=3)
    prompts = random_prompts(3, 8, seed=30)
    bench = modelled_bench(setup.target, setup.trained, prompts, cfg, verify_s=0.01, draft_s=0.001)
    report = tune(setup.target, setup.trained, prompts, cfg, draft_path="/ckpt/draft", bench=bench)
    probe = report.probes[1].metrics
    assert probe.accept_length == pytest.approx(1 + sum(probe.acceptance_per_position))  # M1
    measured = [c for c in report.candidates if c.measured_tps is not None]
    assert len(measured) == 2 and report.plain_measured_tps > 0
    for c in measured:
        assert c.predicted_tps == pytest.approx(c.measured_tps, rel=0.3)
        assert c.measured_tau == pytest.approx(c.predicted_tau, abs=0.15)
    rec = report.recommendation
    assert rec is not None and rec.speedup > cfg.min_speedup and rec.spec.is_chain
    assert rec is report.vllm_recommendation
    assert report.launch_flags("sglang").endswith(" ".join(rec.spec.sglang_args()))
    config = json.loads(report.launch_flags("vllm").split("--speculative-config ")[1].strip("'"))
    assert config == {
        "method": "eagle3",
        "model": "/ckpt/draft",
        "num_speculative_tokens": rec.spec.num_steps,
    }
    text = render(report)
    assert f"recommendation: steps {rec.spec.num_steps}, topk 1" in text and "pred tok/s" in text
    assert (
        rec.timing["speedup_q1"] > 1.0 and "speedup (quartiles)" in text
    )  # demo's rule (test_tune_report)
    assert json.loads(json.dumps(report.to_dict()))["recommendation"]["speedup"] == rec.speedup
    assert report.prediction_error() < 1.3 and "warning: predictions" not in text
    # a measurement 3x off its prediction (a busy machine) is called out, not passed over
    measured[0].measured_tps = measured[0].predicted_tps / 3
    assert report.prediction_error() == pytest.approx(3.0)
    assert "warning: predictions are off by up to 3.0x" in render(report)


def test_tune_cli(tmp_path):
    setup = tiny_setup("llama")
    target, draft = saved_pair(setup, tmp_path, trained=False)
    prompts = write_prompts(tmp_path / "prompts.jsonl", text_prompts(2, 8, seed=31))
    result = CliRunner().invoke(
        app,
        cli_args(
            "tune",
            target=target,
            draft=draft,
            prompts=prompts,
            max_tokens=8,
            probe_steps=2,
            topks="1,2",
            num_measure=1,
            num_steps=3,
            json_out=tmp_path / "tune.json",
        ),
    )
    assert result.exit_code == 0, result.output
    assert (
        "current: steps 3, topk 1, draft tokens 4" in result.output and "SGLang:" in result.output
    )
    assert f"drafter {draft}: eagle3 (no norm flag)" in result.output  # the drafter's method
    data = json.loads((tmp_path / "tune.json").read_text())
    assert data["current"]["num_steps"] == 3 and set(data["probes"]) == {"1", "2"}
    bad = CliRunner().invoke(
        app,
        cli_args("tune", target=target, draft=draft, num_steps=3, num_draft_tokens=9),
    )
    assert bad.exit_code == 1 and "num_draft_tokens must be num_steps + 1" in bad.output


def test_tune_cli_refuses_topk_or_draft_tokens_without_num_steps(tmp_path, monkeypatch):
    """--topk / --num-draft-tokens without --num-steps were dropped from the comparison in
    silence; SGLang refuses --speculative-eagle-topk / --speculative-num-draft-tokens without
    --speculative-num-steps, and so does tune: one line naming --num-steps, before any loading."""
    import specdraft.bench.tune

    target, draft = tmp_path / "target", tmp_path / "draft"
    target.mkdir()
    (target / "config.json").write_text("{}")  # refused before anything is loaded
    draft.mkdir()
    seen = []

    def fake_tune_paths(pair, prompts, cfg, *args, **kwargs):
        seen.append(cfg.current)
        raise BenchInputError("stop after the config")  # a user error: one line

    monkeypatch.setattr(specdraft.bench.tune, "tune_paths", fake_tune_paths)
    base = ["tune", "--target", str(target), "--draft", str(draft)]
    for flags, given in (
        ("--topk 4", "--topk 4"),
        ("--topk 1", "--topk 1"),
        ("--num-draft-tokens 8", "--num-draft-tokens 8"),
        ("--topk 2 --num-draft-tokens 5", "--topk 2 --num-draft-tokens 5"),
        ("--num-steps 0 --topk 2", "--topk 2"),
    ):
        result = CliRunner().invoke(app, base + flags.split())
        assert result.exit_code == 1, flags
        lines = result.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"error: {given} without --num-steps: "), (
            result.output
        )
        assert "add --num-steps N" in lines[0]
    assert seen == []  # nothing ran
    # with --num-steps the setting is complete; --topk defaults to 1 (a chain) only then
    for flags in (
        cli_options(num_steps=2, topk=2, num_draft_tokens=5),
        ["--num-steps", "3"],
    ):
        result = CliRunner().invoke(app, base + flags)
        assert result.exit_code == 1 and "error: stop after the config" in result.output
    assert seen == [SpecConfig(2, 2, 5), SpecConfig(3, 1, 4)]


def test_tune_threads_are_set_before_loading(tmp_path, monkeypatch):
    """--threads as generate / serve have it: torch.set_num_threads before tune loads anything,
    a range error (exit 2) for 0, the shared help."""
    import torch

    import specdraft.bench.tune

    target, draft = tmp_path / "target", tmp_path / "draft"
    target.mkdir()
    (target / "config.json").write_text("{}")
    draft.mkdir()
    seen = []

    def fake_tune_paths(*args, **kwargs):
        seen.append(torch.get_num_threads())
        raise BenchInputError("stop here")  # a user error: one line

    monkeypatch.setattr(specdraft.bench.tune, "tune_paths", fake_tune_paths)
    base = ["tune", "--target", str(target), "--draft", str(draft)]
    result = CliRunner().invoke(app, base + ["--threads", "3"])
    assert result.exit_code == 1 and "error: stop here" in result.output, result.output
    assert seen == [3]  # one_thread restores the setting afterwards
    refused = CliRunner().invoke(app, base + ["--threads", "0"])
    assert refused.exit_code == 2 and "Invalid value for '--threads'" in refused.output, (
        refused.output
    )
    assert seen == [3]
    torch.set_num_threads(2)
    left_out = CliRunner().invoke(app, base)
    assert left_out.exit_code == 1 and seen == [3, DEFAULT_THREADS]  # left out: the one default
    assert "torch.set_num_threads" in CliRunner().invoke(app, ["tune", "--help"]).output


def test_calibrate_puts_a_rounds_fixed_drafting_cost_in_the_round_overhead():
    """Synthetic timings: a round drafts for F + n s (a fixed first-step cost F, s per step),
    verifies in t_verify(n + 1) and spends o on the rest. Fitted on the deep probe alone, F was
    spread over its 8 steps, so a 3-step chain came out (5/8) F too fast (tune predicted 35-40 %
    above its measurements) and the round overhead below plain decoding's; the line through a
    1-step and an 8-step probe gives s and F + o exactly."""
    fixed, step, other, rounds = 0.004, 0.001, 0.0003, 50
    t_verify = {n + 1: 0.010 + 0.0002 * n for n in range(1, 9)}

    def probe(n: int) -> Measured:
        draft = rounds * (fixed + n * step)
        return Measured(
            SpecConfig.chain(n),
            SpecMetrics(
                num_verify_steps=rounds,
                accepted_per_position=[25] + [0] * (n - 1),
                time_prefill_s=0.5,
                time_draft_s=draft,
                time_verify_s=rounds * t_verify[n + 1],
                time_other_s=rounds * other,
            ),
        )

    costs = Costs(dict(t_verify))
    calibrate(costs, probe(8), probe(1))
    assert costs.t_draft[1] == pytest.approx(step) and costs.t_round[1] == pytest.approx(
        fixed + other
    )
    _, tps = predict(SpecConfig.chain(3), probe(8), costs)
    assert tps == pytest.approx(1.5 / (fixed + 3 * step + t_verify[4] + other))
    alone = Costs(dict(t_verify))
    calibrate(alone, probe(8))  # one probe: drafting per step, as before
    assert alone.t_draft[1] == pytest.approx(fixed / 8 + step)
    slow = probe(1)  # a load spike on the 1-step probe: the line would fall with the steps
    slow.metrics.time_other_s += rounds * 0.05
    noisy = Costs(dict(t_verify))
    calibrate(noisy, probe(8), slow)
    assert noisy.t_draft[1] == pytest.approx(fixed / 8 + step)  # never 0 (free drafting)


def test_tune_measures_the_default_setting_names_its_prompts_and_says_the_machine_was_busy(
    tmp_path, monkeypatch
):
    """Without --num-steps tune still measures the 3-step chain generate and serve run (the demo
    recommended it while tune never timed it); the report names its prompt set, says in one
    sentence why bench and the demo differ, and notes a busy machine as bench and demo do."""
    import os

    monkeypatch.setattr(os, "getloadavg", lambda: (7.0, 0.0, 0.0))
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    setup = tiny_setup("llama")
    target, draft = saved_pair(setup, tmp_path, trained=False)
    prompts = write_prompts(tmp_path / "prompts.jsonl", text_prompts(2, 8, seed=31))
    args = ["tune", "--target", str(target), "--draft", str(draft), "--prompts", str(prompts)]
    args += ["--max-tokens", "8", "--probe-steps", "2", "--topks", "1", "--num-measure", "1"]
    args += ["--repeats", "1", "--json-out", str(tmp_path / "tune.json")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    data = json.loads((tmp_path / "tune.json").read_text())
    assert data["current"]["num_steps"] == 3 and data["current"]["speedup"] is not None
    assert "current: steps 3, topk 1, draft tokens 4" in result.output
    assert f"2 prompts ({prompts}) x 8 new tokens" in result.output
    assert "why these numbers differ from bench's and the demo's:" in result.output
    assert "note: the machine was busy when this started (load 7.0 on 2 cores)" in result.output
    assert data["prompt_set"] == str(prompts) and data["busy"].startswith("note: the machine")
    # its long stages show the runs done and the time left (plain lines off a terminal)
    assert "tune probe runs 2/2  ETA " in result.output  # the deep probe and the 1-step one
    assert re.search(r"tune forward timings (\d+)/\1  ETA ", result.output)  # was silent
    assert re.search(r"tune timing runs (\d+)/\1  ETA \d+:\d\d:\d\d", result.output)
