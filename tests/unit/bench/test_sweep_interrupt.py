"""`specdraft bench`'s order and Ctrl-C: each level is measured on both servers, their runs
alternating, before the next level starts; stopped by Ctrl-C, the levels finished on every
compared server are written as a report marked partial (bench.json `partial`,
`interrupted_at_concurrency`, `concurrency_not_measured`; bench.md's first line), then exit 130;
with no level finished on every server nothing is written. Fake vLLM servers on loopback; the
order is recorded around `run_requests`, and the interrupt is a KeyboardInterrupt raised inside
the event loop when a chosen server starts a chosen level."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

import specdraft.bench.sweep as bench
from specdraft.bench.stats import NO_BASELINE
from specdraft.cli import app
from specdraft.serve.server import serve_in_thread
from tests.support.serve_helpers import fake_vllm_app, text_prompts, write_prompts


@pytest.fixture(scope="module")
def fake_servers():
    """A speculating vLLM-like server (2 tokens per step) and a plain one (1 token per step)."""
    with (
        serve_in_thread(fake_vllm_app(lambda active: 0.001, tokens_per_step=2, num_spec=3)) as spec,
        serve_in_thread(
            fake_vllm_app(lambda active: 0.001, tokens_per_step=1, num_spec=0)
        ) as plain,
    ):
        yield spec, plain


def record_requests(monkeypatch, servers: dict[str, str]) -> list[tuple[str, int, int]]:
    """The (server name, concurrency, number of prompts) of every `run_requests` call, in order,
    filled as bench runs; servers: url -> name."""
    real, calls = bench.run_requests, []

    async def run_requests(server, prompts, concurrency, cfg, **kwargs):
        calls.append((servers[server.url], concurrency, len(prompts)))
        return await real(server, prompts, concurrency, cfg, **kwargs)

    monkeypatch.setattr(bench, "run_requests", run_requests)
    return calls


def test_each_level_alternates_the_servers_before_the_next_level(
    fake_servers, tmp_path, monkeypatch
):
    """Warm-up on each server (1 prompt), then per level: spec run 1, baseline run 1, spec run 2,
    ...; one progress line per server once the level is done on both."""
    spec, plain = fake_servers
    calls = record_requests(monkeypatch, {spec.url: "spec", plain.url: "base"})
    prompts = write_prompts(tmp_path / "prompts.jsonl", text_prompts(2, 6, seed=41))
    said: list[str] = []
    cfg = bench.BenchConfig(
        spec.url, plain.url, str(prompts), (1, 2), max_tokens=4, num_prompts=3, repeats=3
    )
    report = bench.run_bench(cfg, progress=said.append)
    timed = [(name, level, 3) for level in (1, 2) for _ in range(3) for name in ("spec", "base")]
    assert calls == [("spec", 1, 1), ("base", 1, 1)] + timed
    assert [[lv.num_runs for lv in run.levels] for run in (report.spec, report.baseline)] == [
        [3, 3],
        [3, 3],
    ]
    assert [line.split(": ")[0] for line in said] == [
        f"{role} {server.url} (vllm) concurrency {level}"
        for level in (1, 2)
        for role, server in (("speculative", spec), ("baseline", plain))
    ]


def test_without_baseline_the_repeats_run_in_turn(fake_servers, tmp_path, monkeypatch):
    spec, _ = fake_servers
    calls = record_requests(monkeypatch, {spec.url: "spec"})
    prompts = write_prompts(tmp_path / "prompts.jsonl", text_prompts(2, 6, seed=42))
    cfg = bench.BenchConfig(
        spec.url, None, str(prompts), (2, 1), max_tokens=4, num_prompts=3, repeats=2, warmup=2
    )
    bench.run_bench(cfg)
    assert calls == [("spec", 1, 2), ("spec", 2, 3), ("spec", 2, 3), ("spec", 1, 3), ("spec", 1, 3)]


def interrupt_at(monkeypatch, url: str, concurrency: int) -> None:
    """Ctrl-C when the server at `url` starts its level `concurrency` (the runs before it go on)."""
    real = bench.run_requests

    async def run_requests(server, prompts, level, cfg, **kwargs):
        if server.url == url and level == concurrency:
            raise KeyboardInterrupt
        return await real(server, prompts, level, cfg, **kwargs)

    monkeypatch.setattr(bench, "run_requests", run_requests)


def invoke_bench(tmp_path, url: str, *extra: str):
    prompts = write_prompts(tmp_path / "prompts.jsonl", text_prompts(2, 6, seed=40))
    return CliRunner().invoke(
        app,
        [
            "bench",
            "--url",
            url,
            *extra,
            "--prompts",
            str(prompts),
            "--concurrency",
            "1,2,4",
            "--max-tokens",
            "4",
            "--num-prompts",
            "2",
            "--repeats",
            "2",
            "--warmup",
            "0",
            "--wait",
            "0",
            "--out",
            str(tmp_path / "out"),
        ],
    )


@pytest.mark.parametrize("stopped", ["spec", "baseline"])
def test_ctrl_c_in_level_2_writes_level_1_of_both_servers(
    stopped, fake_servers, tmp_path, monkeypatch
):
    """Level 1 finished on both servers, then Ctrl-C as level 2 starts on the speculative server
    or, after its first run there, on the baseline: the report holds concurrency 1 on both (the
    runs of level 2 already made are not a level)."""
    spec, plain = fake_servers
    interrupt_at(monkeypatch, spec.url if stopped == "spec" else plain.url, 2)
    result = invoke_bench(tmp_path, spec.url, "--baseline-url", plain.url)
    assert result.exit_code == 130, result.output
    out = tmp_path / "out"
    names = ", ".join(
        str(out / name)
        for name in ("bench.json", "bench.md", "throughput.png", "tpot.png", "speedup.png")
    )
    assert result.output.strip().splitlines()[-1] == (
        f"interrupted: wrote a partial report of concurrency 1 (not measured on every server: 2, 4) to {names}"
    )
    assert sorted(p.name for p in out.iterdir()) == [
        "bench.json",
        "bench.md",
        "speedup.png",
        "throughput.png",
        "tpot.png",
    ]  # no temp file left
    flat = " ".join(result.output.split())
    assert f"speculative {spec.url} (vllm) concurrency 1: " in flat
    assert f"baseline {plain.url} (vllm) concurrency 1: " in flat
    assert "concurrency 2: " not in flat and "concurrency 4: " not in flat
    data = json.loads((out / "bench.json").read_text())
    assert (
        data["partial"],
        data["interrupted_at_concurrency"],
        data["concurrency_not_measured"],
    ) == (True, 2, [2, 4])
    assert data["config"]["concurrency"] == [1, 2, 4]
    for run in (data["spec"], data["baseline"]):
        assert [lv["concurrency"] for lv in run["levels"]] == [1]
        level = run["levels"][0]
        assert (
            level["num_runs"],
            level["num_requests"],
            level["num_errors"],
            level["num_output_tokens"],
        ) == (2, 4, 0, 16)
    assert data["spec"]["levels"][0]["spec"]["accept_length"] == pytest.approx(
        2.0
    )  # 2 tokens per step
    assert data["baseline"]["levels"][0]["spec"] is None
    [point] = data["speedups"]
    spec_tps, base_tps = (
        data["spec"]["levels"][0]["tokens_per_s"],
        data["baseline"]["levels"][0]["tokens_per_s"],
    )
    assert (
        point["concurrency"] == 1
        and point["valid"]
        and point["speedup"] == pytest.approx(spec_tps / base_tps)
    )
    assert point["verdict"] in ("wins", "ties", "loses")
    text = (out / "bench.md").read_text()
    assert text.splitlines()[0] == (
        "PARTIAL: bench was interrupted; concurrency 2, 4 not measured on every "
        "server, so this report covers concurrency 1 only"
    )
    assert text.splitlines()[2] == "# specdraft bench"
    assert not any(line.startswith(("| 2 | ", "| 4 | ")) for line in text.splitlines())


def test_ctrl_c_without_baseline_writes_the_finished_levels(fake_servers, tmp_path, monkeypatch):
    spec, _ = fake_servers
    interrupt_at(monkeypatch, spec.url, 4)
    result = invoke_bench(tmp_path, spec.url)
    assert result.exit_code == 130, result.output
    out = tmp_path / "out"
    assert " ".join(result.output.split()).endswith(
        f"interrupted: wrote a partial report of concurrency 1, 2 (not measured on every server: 4) to "
        f"{out / 'bench.json'}, {out / 'bench.md'}, {out / 'throughput.png'}, {out / 'tpot.png'}"
    )
    data = json.loads((out / "bench.json").read_text())
    assert (
        data["partial"],
        data["interrupted_at_concurrency"],
        data["concurrency_not_measured"],
    ) == (True, 4, [4])
    assert [lv["concurrency"] for lv in data["spec"]["levels"]] == [1, 2]
    assert [lv["num_output_tokens"] for lv in data["spec"]["levels"]] == [16, 16]
    assert data["baseline"] is None and data["speedups"] is None
    text = (out / "bench.md").read_text()
    assert text.startswith(
        "PARTIAL: bench was interrupted; concurrency 4 not measured on every server, so this "
        "report covers concurrency 1, 2 only\n"
    )
    assert NO_BASELINE in text


def test_ctrl_c_before_a_level_finished_on_every_server_writes_nothing(
    fake_servers, tmp_path, monkeypatch
):
    """Ctrl-C at the baseline's first run of level 1 (the speculative server's first run done):
    no level finished on both servers, nothing to compare."""
    spec, plain = fake_servers
    interrupt_at(monkeypatch, plain.url, 1)
    result = invoke_bench(tmp_path, spec.url, "--baseline-url", plain.url)
    assert result.exit_code == 130, result.output
    assert result.output.strip().splitlines()[-1] == (
        f"interrupted: no concurrency level was measured on every server yet, so nothing was written to "
        f"{tmp_path / 'out'}"
    )
    assert not (tmp_path / "out").exists()
