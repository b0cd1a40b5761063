"""specdraft.bench and specdraft.client: prompts, Prometheus counter deltas (specdraft and vLLM names), SGLang's
meta_info, speedups over repeated runs and the crossover rule (on injected measurements), and
end-to-end runs against specdraft servers on loopback (with and without a baseline) producing
bench.json, bench.md and the plots."""

from __future__ import annotations

import dataclasses
import json
import math
import os

import pytest
from typer.testing import CliRunner

from specdraft.bench.config import BenchConfig
from specdraft.bench.prompts import load_prompts
from specdraft.bench.report import markdown, plot_data, write_report
from specdraft.bench.stats import NO_BASELINE, NO_VERDICT, SpeedupPoint, find_crossover, verdict
from specdraft.bench.sweep import run_bench
from specdraft.cli import app
from specdraft.client import check_url, counter_delta, detect_server, scrape_counters
from specdraft.engine.spec_config import SpecConfig
from specdraft.serve.server import serve_in_thread
from tests.support.cli import cli_args
from tests.support.engine_helpers import one_thread, tiny_setup  # noqa: F401
from tests.support.serve_helpers import (
    engine,
    fake_sglang_app,
    fake_vllm_app,
    invoke_bench,
    own_target,
    running,
    servers,  # noqa: F401 (fixture)
    slow_target,
    spec_and_plain_servers,
    text_prompts,
    word_tokenizer,
    write_prompts,
)


def vllm_exposition(
    drafts: float, draft_tokens: float, accepted: float, per_pos: list[float]
) -> str:
    """vLLM's /metrics text for its spec-decode counters (labels as vLLM v1 writes them)."""
    labels = 'engine="0",model_name="m"'
    lines = [
        "# TYPE vllm:spec_decode_num_drafts counter",
        f"vllm:spec_decode_num_drafts_total{{{labels}}} {drafts}",
        f"vllm:spec_decode_num_drafts_created{{{labels}}} 1.7e9",
        f"vllm:spec_decode_num_draft_tokens_total{{{labels}}} {draft_tokens}",
        f"vllm:spec_decode_num_accepted_tokens_total{{{labels}}} {accepted}",
        f"vllm:generation_tokens_total{{{labels}}} 99.0",
    ]
    lines += [
        f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{labels},position="{k}"}} {v}'
        for k, v in enumerate(per_pos)
    ]
    return "\n".join(lines) + "\n"


def test_prompt_files_take_texts_and_chats_as_doctor_and_training_data_write_them(tmp_path):
    """{"text"} rows (the repo's own prompts.jsonl), {"prompt", "completion"} rows (the prompt) and
    chats (the messages before the last assistant turn, sent as chat completions) are prompts."""
    from tests.support.paths import REPO

    texts = load_prompts(str(REPO / "tests" / "assets" / "pycode25m_draft" / "prompts.jsonl"))
    assert len(texts) >= 2 and all(isinstance(t, str) and t for t in texts)
    chat = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "and?"},
        {"role": "assistant", "content": "bye"},
    ]
    (tmp_path / "mixed.jsonl").write_text(
        "".join(
            json.dumps(row) + "\n"
            for row in (
                {"prompt": "def f(", "completion": "x):"},
                {"messages": chat},
                {"messages": chat[:1]},
            )
        )
    )
    assert load_prompts(str(tmp_path / "mixed.jsonl")) == ["def f(", chat[:3], chat[:1]]
    (tmp_path / "bad_chat.jsonl").write_text(
        json.dumps({"messages": [{"role": "robot", "content": "x"}]}) + "\n"
    )
    with pytest.raises(ValueError, match="bad_chat.jsonl:1: "):
        load_prompts(str(tmp_path / "bad_chat.jsonl"))


def test_load_prompts_builtin_and_files(tmp_path):
    builtin = load_prompts("builtin")
    assert len(builtin) >= 8 and any(p.startswith("def ") for p in builtin)
    assert load_prompts(str(write_prompts(tmp_path / "p.jsonl", ["a b", "c"]))) == ["a b", "c"]
    (tmp_path / "rows.txt").write_text('{"prompt": "one"}\n\n"two"\n')  # JSONL whatever the name
    assert load_prompts(str(tmp_path / "rows.txt")) == ["one", "two"]
    (tmp_path / "bad.jsonl").write_text('{"prompt": "ok"}\n{"text": 1}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: expected"):
        load_prompts(str(tmp_path / "bad.jsonl"))
    with pytest.raises(ValueError, match="not found"):
        load_prompts(str(tmp_path / "missing.jsonl"))


def test_vllm_counter_delta_gives_tau_and_pk():
    before = scrape_counters(vllm_exposition(10.0, 30.0, 12.0, [7.0, 4.0, 1.0]), "vllm:")
    now = scrape_counters(vllm_exposition(30.0, 90.0, 40.0, [22.0, 13.0, 5.0]), "vllm:")
    assert before["num_drafts"] == 10 and before["per_pos"] == {0: 7, 1: 4, 2: 1}
    spec = counter_delta(before, now, "vllm /metrics")
    assert (spec.num_drafts, spec.num_draft_tokens, spec.num_accepted_tokens) == (20, 60, 28)
    assert spec.accepted_per_pos == [15, 9, 4]
    assert spec.accept_length == pytest.approx(2.4)
    assert spec.acceptance_per_position == pytest.approx([0.75, 0.45, 0.2])
    assert spec.tau_from_positions == pytest.approx(spec.accept_length)  # M1
    assert counter_delta(now, now, "vllm /metrics") is None  # no verification step: no tau


def single(*points: tuple[int, float]) -> list[SpeedupPoint]:
    """Speedup points of single runs (no spread)."""
    return [SpeedupPoint(c, s) for c, s in points]


def test_crossover_rule():
    assert find_crossover([]).text == NO_BASELINE
    assert "pass --baseline-url URL" in NO_BASELINE
    help_text = CliRunner().invoke(app, ["bench", "--help"], env={"COLUMNS": "200"}).output
    assert "--baseline-url" in help_text  # the option the sentence names is bench's
    wins = find_crossover(single((1, 1.8), (4, 1.3), (16, 1.1)))
    assert wins.concurrency is None and "wins at every concurrency" in wins.text
    loses = find_crossover(single((4, 0.9), (1, 0.5)))
    assert (
        loses.concurrency is None
        and "loses at every concurrency" in loses.text
        and "0.90x at concurrency 4" in loses.text
    )
    cross = find_crossover(single((16, 0.8), (1, 1.9), (4, 1.2), (8, 0.95)))
    assert (
        cross.concurrency == 8
        and "between concurrency 4 (speedup 1.20x) and 8 (speedup 0.95x)" in cross.text
    )
    # within the tie band (noise) nothing wins or loses
    noise = single((1, 0.93), (4, 1.02), (16, 0.98))
    assert find_crossover(noise).concurrency == 16
    tie = find_crossover(noise, tie_band=0.05)
    assert tie.concurrency is None and "does not win by more than 5% at any concurrency" in tie.text
    late = find_crossover(single((1, 1.5), (4, 1.03), (16, 0.7)), tie_band=0.05)
    assert (
        late.concurrency == 4 and "stops winning by more than 5% between concurrency 1" in late.text
    )
    # a loss followed by a win (CPU noise at low concurrency) is no crossover, and no crash
    rising = find_crossover(single((1, 0.97), (2, 1.2)))
    assert rising.concurrency is None and rising.text.startswith(
        "speculation wins from concurrency 2 on (speedup 1.20x there); below concurrency 2 it does not win;"
    )
    assert "the highest measured" in rising.text
    # levels left out (failed requests): "every valid concurrency", naming them
    valid = find_crossover(single((1, 1.8)), invalid=[16, 4])
    assert valid.text == (
        "no crossover: speculation wins at every valid concurrency (up to 1, speedup 1.80x there) "
        "(left out, failed requests: concurrency 4, 16)"
    )
    assert "loses at every valid concurrency" in find_crossover(single((1, 0.5)), invalid=[4]).text
    assert (
        "the highest valid (left out"
        in find_crossover(single((1, 0.97), (2, 1.2)), invalid=[4]).text
    )


def test_speedup_of_repeated_runs_is_the_ratio_of_means_with_propagated_deviation():
    point = SpeedupPoint.of(4, [300.0, 500.0], [200.0, 200.0])
    assert point.speedup == pytest.approx(2.0)
    assert point.speedup_std == pytest.approx(
        2.0 * math.sqrt(2 * 100.0**2) / 400.0
    )  # sample sd 141.4 / 400
    both = SpeedupPoint.of(1, [90.0, 110.0], [45.0, 55.0])  # relative deviations add in quadrature
    assert both.speedup == pytest.approx(2.0) and both.speedup_std == pytest.approx(0.4)
    assert SpeedupPoint.of(1, [300.0], [200.0]) == SpeedupPoint(1, 1.5, 0.0)  # one run: no spread
    assert point.text() == "2.00x ± 0.71" and SpeedupPoint(1, 1.5).text() == "1.50x"


def test_verdict_needs_the_mean_beyond_the_noise():
    assert verdict(SpeedupPoint(1, 1.2, 0.05), tie_band=0.05) == "wins"
    assert verdict(SpeedupPoint(1, 1.2, 0.3), tie_band=0.05) == "ties"  # within its own deviation
    assert verdict(SpeedupPoint(1, 0.8, 0.3), tie_band=0.05) == "ties"  # a slow run is not a loss
    assert verdict(SpeedupPoint(1, 0.8, 0.1), tie_band=0.05) == "loses"
    assert verdict(SpeedupPoint(1, 0.97, 0.0), tie_band=0.05) == "ties"
    assert verdict(SpeedupPoint(1, 0.97, 0.0)) == "loses"  # no band, no spread


@pytest.fixture(scope="module")
def other_servers():
    """A second speculative and a second plain server, like `servers` (bench refuses one server
    given as both --url and --baseline-url)."""
    with spec_and_plain_servers() as pair:
        yield pair


def test_bench_against_specdraft_servers_with_baseline(servers, tmp_path, capsys):
    spec, plain = servers
    prompts = write_prompts(tmp_path / "prompts.jsonl", text_prompts(6, 8, seed=20))
    cfg = BenchConfig(
        spec.url, plain.url, str(prompts), (1, 3), max_tokens=12, num_prompts=6, repeats=2
    )
    report = run_bench(cfg)
    # 2 levels x 2 runs x 2 servers, counted with the time left (off a terminal: a line a quarter)
    lines = capsys.readouterr().err.splitlines()
    assert [line.split("  ETA ")[0] for line in lines if line.startswith("bench runs")] == [
        f"bench runs (all levels) {i}/8" for i in (2, 4, 6, 8)
    ]
    assert (report.spec.kind, report.baseline.kind) == ("specdraft", "specdraft")
    for level in report.spec.levels + report.baseline.levels:
        assert (
            level.num_runs == 2
            and level.num_requests == 2 * 6
            and level.num_output_tokens == 2 * 6 * 12
        )
        assert len(level.tokens_per_s_runs) == 2 and min(level.tokens_per_s_runs) > 0
        assert level.tokens_per_s == pytest.approx(sum(level.tokens_per_s_runs) / 2)
        assert level.tokens_per_s_std == pytest.approx(
            abs(level.tokens_per_s_runs[0] - level.tokens_per_s_runs[1]) / math.sqrt(2)
        )
    for level in report.spec.levels:
        assert level.num_errors == 0
        assert level.ttft_s.p50 > 0 and level.tpot_s.p99 >= level.tpot_s.p50 > 0
        s = level.spec
        assert s.source == "specdraft /metrics" and s.num_draft_tokens == 3 * s.num_drafts
        assert s.accept_length == pytest.approx(level.usage_accept_length)  # counters = usage (M1)
        assert s.accept_length == pytest.approx(s.tau_from_positions)
    assert all(level.spec is None for level in report.baseline.levels)
    assert [p.concurrency for p in report.speedups] == [1, 3]
    assert report.speedups[0].speedup == pytest.approx(
        report.spec.levels[0].tokens_per_s / report.baseline.levels[0].tokens_per_s
    )
    assert report.speedups[1] == SpeedupPoint.of(
        3, report.spec.levels[1].tokens_per_s_runs, report.baseline.levels[1].tokens_per_s_runs
    )
    assert report.crossover == find_crossover(report.speedups, cfg.tie_band)
    paths = write_report(report, tmp_path / "out")
    assert sorted(p.name for p in paths) == [
        "bench.json",
        "bench.md",
        "speedup.png",
        "throughput.png",
        "tpot.png",
    ]
    data = json.loads((tmp_path / "out" / "bench.json").read_text())
    assert (
        data["speedups"][1]["concurrency"] == 3
        and data["crossover"]["text"] == report.crossover.text
    )
    assert (
        data["partial"],
        data["interrupted_at_concurrency"],
        data["concurrency_not_measured"],
    ) == (False, None, [])
    assert data["speedups"][1]["speedup"] == report.speedups[1].speedup  # the single-run keys stay
    assert data["speedups"][1]["speedup_std"] == report.speedups[1].speedup_std
    assert data["speedups"][1]["verdict"] == verdict(report.speedups[1], cfg.tie_band)
    assert report.baseline_warning is None and data["baseline_warning"] is None  # a plain baseline
    assert data["spec"]["levels"][0]["tokens_per_s"] == report.spec.levels[0].tokens_per_s
    assert data["spec"]["levels"][0]["tokens_per_s_runs"] == report.spec.levels[0].tokens_per_s_runs
    assert (
        data["spec"]["levels"][0]["spec"]["accept_length"]
        == report.spec.levels[0].spec.accept_length
    )
    text = (tmp_path / "out" / "bench.md").read_text()
    assert (
        "| 1 | " in text
        and "(1 + sum of p_k = " in text
        and ": counters agree)" in text
        and NO_BASELINE not in text
    )
    assert "2 runs of 6 requests per level (after 1 warm-up request per server)" in text
    one = dataclasses.replace(report, config=dataclasses.replace(cfg, repeats=1, num_prompts=1))
    assert "1 run of 1 request per level" in markdown(one)
    assert (
        f"| 3 | {report.speedups[1].speedup:.2f}x | {report.speedups[1].speedup_std:.2f} | " in text
    )


def test_bench_without_baseline_never_reports_a_speedup(servers, tmp_path):
    spec, _ = servers
    prompts = write_prompts(tmp_path / "prompts.jsonl", text_prompts(2, 8, seed=21))
    report = run_bench(
        BenchConfig(spec.url, None, str(prompts), (2,), max_tokens=8, num_prompts=2, repeats=1)
    )
    assert report.speedups is None and report.crossover.text == NO_BASELINE
    text = markdown(report)
    assert (
        text.count(NO_BASELINE) == 1 and "x |" not in text
    )  # said once, not again as the crossover
    paths = write_report(report, tmp_path / "out")
    assert "speedup.png" not in [p.name for p in paths]


def test_bench_cli(servers, tmp_path, monkeypatch):
    spec, plain = servers
    prompts = write_prompts(tmp_path / "prompts.jsonl", text_prompts(2, 8, seed=22))
    common = dict(prompts=prompts, concurrency="1,2", max_tokens=6, num_prompts=2, repeats=2)
    monkeypatch.setattr(
        os, "getloadavg", lambda: (64.0, 0.0, 0.0)
    )  # the servers run on this busy machine
    result = invoke_bench(spec.url, tmp_path / "a", **common)
    assert result.exit_code == 0, result.output
    assert "machine was busy" in result.output and "(serve's default --threads 1)" in result.output
    monkeypatch.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    assert NO_BASELINE in result.output and (tmp_path / "a" / "bench.md").is_file()
    assert (
        json.loads((tmp_path / "a" / "bench.json").read_text())["spec"]["levels"][0]["num_runs"]
        == 2
    )
    result = invoke_bench(spec.url, tmp_path / "b", **common, baseline_url=plain.url, warmup=3)
    assert result.exit_code == 0 and "speedup" in result.output and "x |" in result.output
    assert "(after 3 warm-up requests per server)" in result.output
    assert json.loads((tmp_path / "b" / "bench.json").read_text())["config"]["warmup"] == 3
    bad = CliRunner().invoke(app, ["bench", "--url", "localhost:1", "--out", str(tmp_path / "c")])
    assert bad.exit_code == 1 and "must start with http://" in bad.output
    bad = CliRunner().invoke(app, cli_args("bench", url=spec.url, repeats=0, out=tmp_path / "d"))
    assert bad.exit_code == 2 and "Invalid value for '--repeats'" in bad.output


def test_bench_reads_sglang_meta_info(tmp_path):
    prompts = write_prompts(tmp_path / "prompts.jsonl", ["w1 w2"])
    with serve_in_thread(fake_sglang_app(tokens_per_verify=2)) as server:
        report = run_bench(
            BenchConfig(server.url, None, str(prompts), (1, 2), max_tokens=8, num_prompts=3)
        )
    level = report.spec.levels[0]
    assert (
        report.spec.kind == "sglang"
        and level.num_runs == 3
        and level.num_output_tokens == 3 * 3 * 8
    )
    assert level.spec.accept_length == 2.0 and level.spec.acceptance_per_position is None
    assert "not exposed" in markdown(report)


@pytest.mark.parametrize(
    "given, base",
    [
        ("http://127.0.0.1:9/v1", "http://127.0.0.1:9"),
        ("http://127.0.0.1:9/v1/", "http://127.0.0.1:9"),
        ("https://gpu-box/proxy/v1//", "https://gpu-box/proxy"),
        ("http://h:1//v1", "http://h:1"),
        ("http://v1", "http://v1"),
        ("http://v1:8000/", "http://v1:8000"),  # a host named v1 stays
        ("http://h:1/v1/v1", "http://h:1/v1"),  # one /v1 only, as regenerate --endpoint takes it
    ],
)
def test_a_url_ending_in_v1_is_the_base_url(given, base):
    """vLLM / SGLang / OpenAI clients are given http://host:8000/v1: bench and doctor take it as
    the server http://host:8000 (they add the OpenAI paths themselves), as regenerate does."""
    assert check_url(given) == base
    cfg = BenchConfig(given, given + "/")
    assert (cfg.url, cfg.baseline_url) == (base, base)


@pytest.mark.parametrize(
    "given, endpoint, base",
    [
        ("http://127.0.0.1:8000/v1/completions", "/v1/completions", "http://127.0.0.1:8000"),
        (
            "http://127.0.0.1:8000/v1/chat/completions/",
            "/v1/chat/completions",
            "http://127.0.0.1:8000",
        ),
        ("https://gpu-box/proxy/v1/models", "/v1/models", "https://gpu-box/proxy"),
        (
            "http://127.0.0.1:30000/generate",
            "/generate",
            "http://127.0.0.1:30000",
        ),  # SGLang's native endpoint
    ],
)
def test_a_url_ending_in_an_endpoint_is_refused_naming_the_base_url(
    given, endpoint, base, tmp_path
):
    """bench appends /v1/models itself: --url .../v1/completions once failed with "no
    OpenAI-compatible /v1/models (... '.../v1/completions/v1/models' ...)"."""
    message = (
        f"--url {given!r} ends in the endpoint {endpoint} (bench and doctor add the paths they need); "
        f"give the server's base URL {base}"
    )
    with pytest.raises(ValueError) as error:
        check_url(given, "--url")
    assert str(error.value) == message
    result = CliRunner().invoke(app, cli_args("bench", url=given, wait=0, out=tmp_path / "o"))
    assert result.exit_code == 1 and " ".join(result.output.split()) == (
        "error: " + message.replace("--url", "url", 1)
    ), result.output
    assert (
        check_url("http://generate:8000/") == "http://generate:8000"
    )  # a host of that name is no endpoint


def test_urls_without_scheme_or_host_are_still_refused():
    with pytest.raises(
        ValueError,
        match=r"^--url 'localhost:8000/v1': must start with http:// or https:// "
        r"\(e\.g\. http://localhost:8000/v1\)$",
    ):
        check_url("localhost:8000/v1", "--url")
    for url in ("http://", "http:///v1/"):
        with pytest.raises(ValueError, match=rf"^--url '{url}': no host; give the server's URL"):
            check_url(url, "--url")
    with pytest.raises(RuntimeError, match="no host"):
        detect_server("http:///v1")


def test_bench_cli_takes_a_url_ending_in_v1(tmp_path):
    """bench --url http://host:port/v1 measures the server at http://host:port (it used to refuse it)."""
    prompts = write_prompts(tmp_path / "prompts.jsonl", text_prompts(2, 6, seed=28))
    with serve_in_thread(fake_vllm_app(lambda active: 0.001, 2, 3)) as server:
        assert detect_server(server.url + "/v1/").url == server.url
        result = invoke_bench(server.url + "/v1", tmp_path / "out", prompts=prompts)
    assert result.exit_code == 0, result.output
    data = json.loads((tmp_path / "out" / "bench.json").read_text())
    assert data["config"]["url"] == data["spec"]["url"] == server.url
    assert (
        data["spec"]["kind"] == "vllm" and data["spec"]["levels"][0]["num_output_tokens"] == 2 * 4
    )
    assert data["spec"]["levels"][0]["spec"]["accept_length"] == pytest.approx(2.0)


def test_one_run_per_level_gives_speedups_but_no_verdict(servers, tmp_path):
    """--repeats 1: no spread, so no win / tie / loss and no crossover, only the numbers and
    what a verdict needs."""
    spec, plain = servers
    prompts = write_prompts(tmp_path / "prompts.jsonl", text_prompts(2, 8, seed=23))
    options = dict(baseline_url=plain.url, prompts=prompts, concurrency="1,2", max_tokens=6)
    result = invoke_bench(spec.url, tmp_path / "out", **options)
    assert result.exit_code == 0, result.output
    data = json.loads((tmp_path / "out" / "bench.json").read_text())
    assert [p["concurrency"] for p in data["speedups"]] == [1, 2] and all(
        p["speedup"] > 0 for p in data["speedups"]
    )
    assert [p["verdict"] for p in data["speedups"]] == [None, None]
    assert data["crossover"] == {"concurrency": None, "text": NO_VERDICT}
    assert "a verdict needs --repeats 2 or more" in NO_VERDICT and NO_VERDICT in result.output
    for p in data["speedups"]:  # the number, no sd, no verdict
        assert f"| {p['concurrency']} | {p['speedup']:.2f}x | - | - |" in result.output
    assert not any(f"| {v} |" in result.output for v in ("wins", "ties", "loses"))
    assert "crossover" not in result.output and "WARNING" not in result.output


def test_bench_cli_warns_when_the_baseline_speculates(servers, other_servers, tmp_path):
    """A speculative server given as the baseline: one WARNING line, in bench.md and last in the
    output; verdicts stay (2 runs)."""
    spec, _ = servers
    spec_baseline, _ = other_servers
    prompts = write_prompts(tmp_path / "prompts.jsonl", text_prompts(2, 8, seed=24))
    options = dict(baseline_url=spec_baseline.url, prompts=prompts, max_tokens=6, repeats=2)
    result = invoke_bench(spec.url, tmp_path / "out", **options)
    assert result.exit_code == 1, (
        result.output
    )  # the comparison is invalid; the report is still written
    warnings = [line for line in result.output.splitlines() if "WARNING" in line]
    assert (
        len(warnings) == 2 and warnings[0] == warnings[1] == result.output.strip().splitlines()[-1]
    )
    assert warnings[0].startswith(
        f"WARNING: the baseline {spec_baseline.url} speculates too (accept length "
    )
    assert (
        "from specdraft /metrics at concurrency 1" in warnings[0]
        and "speculation with speculation" in warnings[0]
    )
    assert warnings[0] in (tmp_path / "out" / "bench.md").read_text()
    data = json.loads((tmp_path / "out" / "bench.json").read_text())
    assert data["baseline_warning"] == warnings[0] and data["speedups"][0]["verdict"] in (
        "wins",
        "ties",
        "loses",
    )


def test_baseline_speculation_is_read_from_vllm_and_sglang_signals(tmp_path):
    """vLLM's spec counters and SGLang's spec_verify_ct flag a speculating baseline; a server
    without them (vLLM with no spec counters) gets no warning."""
    prompts = str(write_prompts(tmp_path / "prompts.jsonl", ["w1 w2"]))
    with (
        serve_in_thread(fake_vllm_app(lambda active: 0.001, 2, 2)) as spec,
        serve_in_thread(fake_vllm_app(lambda active: 0.001, 1, 0)) as plain_vllm,
        serve_in_thread(fake_sglang_app(tokens_per_verify=2)) as spec_sglang,
    ):

        def warning(baseline):
            cfg = BenchConfig(
                spec.url, baseline.url, prompts, (1,), max_tokens=4, num_prompts=2, repeats=2
            )
            return run_bench(cfg).baseline_warning

        assert warning(plain_vllm) is None
        assert "speculates too (accept length 2.00 from vllm /metrics at concurrency 1)" in warning(
            spec
        )
        assert "(accept length 2.00 from sglang meta_info" in warning(spec_sglang)


def test_a_plain_text_or_wrong_shaped_prompts_file_is_refused_naming_file_and_line(tmp_path):
    """--prompts takes JSONL only: plain text (any file name) or a row of another shape is one
    line naming file:line and the expected row, before any server is asked."""
    (tmp_path / "small.txt").write_text("Once upon a time\nthere was\n")
    (tmp_path / "shape.txt").write_text('{"prompt": "ok"}\n{"question": "no"}\n')
    rows = r'\{"prompt": "<text>"\}, \{"text": "<text>"\}, a chat \{"messages": \[...\]\} or a JSON string per line'
    with pytest.raises(ValueError, match=r"small.txt:1: bad JSON .*one " + rows):
        load_prompts(str(tmp_path / "small.txt"))
    with pytest.raises(ValueError, match=r"shape.txt:2: expected " + rows):
        load_prompts(str(tmp_path / "shape.txt"))
    result = CliRunner().invoke(
        app,
        cli_args(
            "bench", url="http://127.0.0.1:1", prompts=tmp_path / "small.txt", out=tmp_path / "out"
        ),
    )
    assert result.exit_code == 1 and len(result.output.strip().splitlines()) == 1, result.output
    assert result.output.startswith(f"error: {tmp_path / 'small.txt'}:1: bad JSON")


def test_bench_cli_warns_when_the_measured_server_does_not_speculate(
    servers, other_servers, tmp_path
):
    """A plain specdraft server (serve --no-spec) given as --url: one WARNING line (still
    counters, usage without drafted tokens), last in the output and in bench.md / bench.json;
    the speculative server and a foreign server without signals get none."""
    spec, plain = servers
    _, plain_baseline = other_servers
    prompts = write_prompts(tmp_path / "prompts.jsonl", text_prompts(2, 8, seed=25))
    common = dict(prompts=prompts, concurrency=1, max_tokens=6, num_prompts=2, repeats=2)
    result = invoke_bench(plain.url, tmp_path / "out", baseline_url=plain_baseline.url, **common)
    assert result.exit_code == 1, result.output  # no speculation measured: scripts must notice
    warnings = [line for line in result.output.splitlines() if "WARNING" in line]
    assert (
        len(warnings) == 2 and warnings[0] == warnings[1] == result.output.strip().splitlines()[-1]
    )
    assert warnings[0].startswith(
        f"WARNING: the speculative server {plain.url} shows no speculation: "
    )
    assert "at concurrency 1" in warnings[0] and "no gain from speculation" in warnings[0]
    assert warnings[0] in (tmp_path / "out" / "bench.md").read_text()
    data = json.loads((tmp_path / "out" / "bench.json").read_text())
    assert data["speculation_warning"] == warnings[0] and data["baseline_warning"] is None
    assert data["spec"]["levels"][0]["no_spec_signal"] is not None
    ok = invoke_bench(spec.url, tmp_path / "ok", baseline_url=plain.url, **common)
    assert ok.exit_code == 0 and "WARNING" not in ok.output, ok.output
    with serve_in_thread(
        fake_vllm_app(lambda active: 0.001, 1, 0)
    ) as foreign:  # no spec counters at all
        cfg = BenchConfig(
            foreign.url, None, str(prompts), (1,), max_tokens=4, num_prompts=2, repeats=1
        )
        assert run_bench(cfg).speculation_warning is None


def test_a_level_with_failed_requests_reports_no_speedup_and_exits_1(
    servers, tmp_path, monkeypatch
):
    """A speculative server with a one-request queue refuses (HTTP 429) some of 4 requests in
    flight: that level's speedup is "invalid: N errors" (tokens/s count the successful requests
    only), it sets no verdict, one WARNING names it, and bench exits 1 after writing the report.
    Nowhere does that level show as a number: bench.json's speedup is null with "valid": false,
    its tokens/s cell reads "invalid (N of 8 failed)", throughput.png and tpot.png leave it out,
    and the crossover speaks of "every valid concurrency", naming 4 as left out."""
    import specdraft.bench.report as bench

    plotted = []
    monkeypatch.setattr(
        bench, "plot_data", lambda report: plotted.append(plot_data(report)) or plotted[-1]
    )
    _, plain = servers
    setup = tiny_setup("llama")
    tok = word_tokenizer()
    slow = engine(slow_target(own_target(setup), 0.02), setup.trained, SpecConfig.chain(3), tok)
    prompts = write_prompts(tmp_path / "prompts.jsonl", text_prompts(4, 8, seed=26))
    with running(slow, tok, max_queue=1) as queued:
        options = dict(prompts=prompts, concurrency="1,4", max_tokens=6, num_prompts=4, repeats=2)
        result = invoke_bench(queued.url, tmp_path / "out", baseline_url=plain.url, **options)
    assert result.exit_code == 1, result.output
    data = json.loads((tmp_path / "out" / "bench.json").read_text())
    errors = data["spec"]["levels"][1]["num_errors"] + data["baseline"]["levels"][1]["num_errors"]
    assert data["spec"]["levels"][0]["num_errors"] == 0 and errors > 0
    assert [p["num_errors"] for p in data["speedups"]] == [0, errors]
    assert data["speedups"][1]["verdict"] == f"invalid: {errors} errors"
    assert data["speedups"][0]["verdict"] in ("wins", "ties", "loses")
    assert f"| 4 | invalid: {errors} errors | - | - | - |" in result.output
    assert not any(
        line.startswith("| 4 | ") and "x |" in line for line in result.output.splitlines()
    )
    warning = result.output.strip().splitlines()[-1]
    assert (
        warning == data["failed_requests_warning"]
        and warning in (tmp_path / "out" / "bench.md").read_text()
    )
    assert warning.startswith(
        f"WARNING: failed requests (concurrency 4: {data['spec']['levels'][1]['num_errors']} "
        f"of 8 requests failed on {queued.url}"
    )
    assert "HTTP 429" in warning and "--max-queue" in warning and "--timeout" in warning
    assert "concurrency 1:" not in warning
    spec_errors = data["spec"]["levels"][1]["num_errors"]
    flat = " ".join(result.output.split())  # the console wraps progress lines
    assert (
        f"{queued.url} (specdraft) concurrency 4: invalid: {spec_errors} of 8 requests FAILED"
        in flat
    )
    # bench.json: no speedup number beside the invalid verdict, and a flag on every entry
    assert [p["valid"] for p in data["speedups"]] == [True, False]
    assert data["speedups"][1]["speedup"] is None and data["speedups"][1]["speedup_std"] is None
    assert data["speedups"][1]["noise"] is None and data["speedups"][0]["speedup"] > 0
    # the tokens/s tables (bench.md, console): the failed level's cell says so, not a number
    text = (tmp_path / "out" / "bench.md").read_text()
    for shown in (text, result.output):
        assert f"| 4 | invalid ({spec_errors} of 8 failed) | " in shown
    assert (
        sum(line.startswith("| 1 | ") and " ± " in line for line in text.splitlines()) == 2
    )  # valid: numbers
    # the crossover: judged on the valid level alone, and says so
    crossover = data["crossover"]["text"]
    assert "concurrency measured" not in crossover and "the highest measured" not in crossover
    assert "valid concurrency" in crossover and crossover.endswith(
        "(left out, failed requests: concurrency 4)"
    )
    assert crossover in text
    # throughput.png and tpot.png: the failed level is not drawn (its TPOT ran under less load);
    # the baseline's valid level is
    throughput, tpot = plotted[0]["throughput.png"].lines, plotted[0]["tpot.png"].lines
    assert throughput["speculative"][0] == tpot["speculative"][0] == [1]
    tpot_ms = data["spec"]["levels"][0]["tpot_s"]["p50"] * 1e3
    assert tpot["speculative"][1:] == ([pytest.approx(tpot_ms)], None)  # a p50: no error bars
    base_levels = [1] if data["baseline"]["levels"][1]["num_errors"] else [1, 4]
    assert throughput["baseline"][0] == tpot["baseline"][0] == base_levels


def test_bench_cli_takes_urls_with_a_trailing_slash(servers, tmp_path):
    """http://host:port/ is the server at http://host:port (not requests to //metrics)."""
    spec, plain = servers
    prompts = write_prompts(tmp_path / "prompts.jsonl", text_prompts(2, 8, seed=27))
    result = invoke_bench(
        spec.url + "/", tmp_path / "out", baseline_url=plain.url + "//", prompts=prompts
    )
    assert result.exit_code == 0, result.output
    data = json.loads((tmp_path / "out" / "bench.json").read_text())
    assert (data["spec"]["url"], data["baseline"]["url"]) == (spec.url, plain.url)
    assert data["spec"]["levels"][0]["spec"]["accept_length"] > 1


def test_bench_config_keeps_urls_without_trailing_slashes():
    """From Python as from the CLI: paths such as /metrics are appended to the URLs."""
    cfg = BenchConfig("http://127.0.0.1:9/", "http://127.0.0.1:10//")
    assert (cfg.url, cfg.baseline_url) == ("http://127.0.0.1:9", "http://127.0.0.1:10")


@pytest.mark.parametrize("host", ["localhost", "[::1]", "0.0.0.0", "LOCALHOST"])
def test_one_server_by_two_loopback_names_is_the_same_server(host, tmp_path):
    from specdraft.cli.benchmark import _same_server

    assert _same_server("http://127.0.0.1:8400", f"http://{host}:8400/")
    assert not _same_server("http://127.0.0.1:8400", f"http://{host}:8401")
    assert not _same_server("http://gpu-box:8400", f"http://{host}:8400")
    result = CliRunner().invoke(
        app,
        cli_args(
            "bench",
            url="http://127.0.0.1:8400",
            baseline_url=f"http://{host}:8400",
            wait=0,
            out=tmp_path / "o",
        ),
    )
    assert result.exit_code == 2 and "are the same server" in " ".join(result.output.split()), (
        result.output
    )
    assert not (tmp_path / "o").exists()


def test_ctrl_c_before_any_level_says_nothing_was_written(tmp_path, monkeypatch):
    import specdraft.bench.sweep

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(specdraft.bench.sweep, "run_bench", interrupted)
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["bench", "--url", "http://127.0.0.1:1", "--out", str(out)])
    assert result.exit_code == 130, result.output
    assert " ".join(result.output.split()) == (
        f"interrupted: no concurrency level was measured on every server yet, so nothing was written to {out}"
    )
    assert not out.exists()


def test_chat_rows_to_a_server_without_a_chat_template_stop_before_the_sweep(tmp_path):
    """A server that refuses the first chat (no chat template) would refuse every chat row of the
    file, each request failing: bench stops after that one request, in one line (it measured the
    text rows and counted every chat row as a failed request)."""
    from specdraft.bench.config import BenchError

    setup = tiny_setup("llama")
    tok = word_tokenizer()
    tok.chat_template = None  # a base model's tokenizer (stories260K, pycode-25m)
    rows = [{"prompt": p} for p in text_prompts(2, 6, seed=3)] + [
        {"messages": [{"role": "user", "content": "w1"}]}
    ]
    (tmp_path / "mixed.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with running(engine(own_target(setup), None, None, tok), tok) as plain:
        cfg = BenchConfig(
            plain.url,
            prompts=str(tmp_path / "mixed.jsonl"),
            concurrency=(1,),
            max_tokens=4,
            num_prompts=3,
            repeats=1,
            warmup=0,
        )
        said = []
        with pytest.raises(BenchError) as refused:
            run_bench(cfg, progress=said.append)
        result = CliRunner().invoke(
            app,
            cli_args(
                "bench",
                url=plain.url,
                prompts=tmp_path / "mixed.jsonl",
                concurrency=1,
                repeats=1,
                out=tmp_path / "o",
            ),
        )
    assert str(refused.value) == (
        f"{plain.url}: refused a chat row (HTTP 400: this model's tokenizer has no chat "
        "template: use /v1/completions), so every chat row would fail: serve the model "
        'with a chat template, or give text rows ({"prompt": ...})'
    )
    assert said == []  # no level measured
    assert result.exit_code == 1 and result.output.strip() == f"error: {refused.value}", (
        result.output
    )
