"""Evaluation suites: the bundled MT-bench, HumanEval and GSM8K sets, Spec-Bench / HumanEval files, and
`bench --suite` against specdraft's own servers (per-category tau, p_k and speedup, multi-turn
questions asked turn by turn with the server's own answers fed back)."""

from __future__ import annotations

import gzip
import json
import os
from importlib import resources

import pytest
from typer.testing import CliRunner

from specdraft.bench import suite_run
from specdraft.bench.config import BenchConfig
from specdraft.bench.suite_run import run_suite, write_suite_report
from specdraft.bench.suites import (
    MT_BENCH_CATEGORIES,
    Question,
    Suite,
    SuiteError,
    load_suite,
    read_suite_file,
)
from specdraft.cli import app
from tests.support.cli import cli_args
from tests.support.engine_helpers import one_thread  # noqa: F401
from tests.support.serve_helpers import (
    bench_args,
    servers,  # noqa: F401
)


def test_bundled_suites_and_unknown_names():
    mt = load_suite("mt-bench")
    assert len(mt.questions) == 80 and mt.categories == list(MT_BENCH_CATEGORIES)
    assert all(len(mt.in_category(c)) == 10 for c in mt.categories)
    assert all(len(q.turns) == 2 for q in mt.questions)
    assert (
        mt.questions[0].turns[1]
        == "Rewrite your previous response. Start every sentence with the letter A."
    )
    gsm = load_suite("gsm8k")
    assert len(gsm.questions) == 25 and gsm.categories == ["gsm8k"]
    with pytest.raises(
        SuiteError,
        match=r"no suite 'spec-bench': the suites are gsm8k, humaneval, mt-bench; .*--format",
    ):
        load_suite("spec-bench")


def test_humaneval_prompts_are_bundled():
    # openai/human-eval's 164 prompts, one user turn each, in task order.
    he = load_suite("humaneval")
    assert len(he.questions) == 164 and he.categories == ["humaneval"]
    assert all(len(q.turns) == 1 and q.turns[0].strip() for q in he.questions)
    assert (
        he.questions[0].turns[0].startswith("from typing import List\n\n\ndef has_close_elements(")
    )
    assert "def sort_numbers(numbers: str) -> str:" in he.questions[19].turns[0]  # HumanEval/19
    assert "def generate_integers(a, b):" in he.questions[163].turns[0]  # HumanEval/163
    rows = (
        resources.files("specdraft.assets") / "suites" / "humaneval" / "question.jsonl"
    ).read_text("utf-8")
    assert [json.loads(r)["task_id"] for r in rows.splitlines()] == [
        f"HumanEval/{i}" for i in range(164)
    ]
    for name in ("LICENSE", "SOURCE.md"):
        assert (resources.files("specdraft.assets") / "suites" / "humaneval" / name).is_file()
    listed = CliRunner().invoke(
        app, cli_args("bench", url="http://127.0.0.1:9", suite="nope", wait=0)
    )
    assert listed.exit_code == 1 and "the suites are gsm8k, humaneval, mt-bench" in listed.output


def test_spec_bench_groups_the_mt_bench_categories_and_humaneval_reads_gzip(tmp_path):
    rows = [
        {"question_id": 1, "category": "writing", "turns": ["a", "b"]},
        {"question_id": 2, "category": "coding", "turns": ["c", "d"]},
        {"question_id": 3, "category": "translation", "turns": ["e"]},
    ]
    path = tmp_path / "question.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    spec_bench = read_suite_file(path, "spec-bench")
    assert spec_bench.categories == ["multi-turn", "translation"]
    assert spec_bench.in_category("multi-turn")[1] == Question("multi-turn", ("c", "d"))
    assert read_suite_file(path, "mt-bench").categories == ["writing", "coding", "translation"]
    gz = tmp_path / "HumanEval.jsonl.gz"
    with gzip.open(gz, "wt") as f:
        f.write(json.dumps({"task_id": "HumanEval/0", "prompt": "def f():\n"}) + "\n")
    assert read_suite_file(gz, "humaneval").questions == (Question("humaneval", ("def f():\n",)),)
    path.write_text('{"category": "writing", "turns": []}\n')
    with pytest.raises(SuiteError, match=rf"{path}:1: expected .*turns"):
        read_suite_file(path, "spec-bench")


SUITE = Suite(
    "tiny",
    (
        Question("chat", ("w5 w6 w7", "w8 w9")),
        Question("chat", ("w10 w11", "w12")),
        Question("single", ("w13 w14 w15",)),
    ),
)


def test_a_suite_run_counts_its_categories_with_a_time_left(servers, capsys):  # noqa: F811
    """#35 item 4: a suite (minutes on a CPU) shows a count and an ETA per category on stderr,
    beside the category lines it tells `progress`; silent without progress."""
    spec, plain = servers
    cfg = BenchConfig(spec.url, plain.url, concurrency=(2,), max_tokens=2, repeats=1, warmup=0)
    run_suite(cfg, SUITE, progress=lambda line: None)
    counts = [
        line.split("  ETA ")[0]
        for line in capsys.readouterr().err.splitlines()
        if line.startswith("bench suite (categories)")
    ]
    assert counts == ["bench suite (categories) 1/2", "bench suite (categories) 2/2"]
    run_suite(cfg, SUITE)
    assert "bench suite" not in capsys.readouterr().err


def test_suite_runs_turn_by_turn_and_reports_per_category(servers, tmp_path, monkeypatch):  # noqa: F811
    spec, plain = servers
    sent = []
    real = suite_run.run_requests

    async def recording(server, batch, concurrency, cfg, clock):
        sent.append((server.url, batch))
        return await real(server, batch, concurrency, cfg, clock=clock)

    monkeypatch.setattr(suite_run, "run_requests", recording)
    cfg = BenchConfig(spec.url, plain.url, concurrency=(2,), max_tokens=6, repeats=2, warmup=0)
    report = run_suite(cfg, SUITE)
    chat, single = report.categories
    assert (chat.category, chat.num_questions, chat.num_turns) == ("chat", 2, 2)
    assert chat.spec.num_requests == 2 * (2 + 2) and single.spec.num_requests == 2
    assert chat.spec.num_output_tokens == 2 * 4 * 6
    for c in report.categories:
        assert c.spec.spec.accept_length == pytest.approx(
            c.spec.usage_accept_length
        )  # tau per category
        assert c.spec.spec.accept_length == pytest.approx(c.spec.spec.tau_from_positions)
        assert c.baseline.spec is None
        assert c.speedup.speedup == pytest.approx(c.spec.tokens_per_s / c.baseline.tokens_per_s)
    # Turn 2 carries turn 1 and the speculative server's own answer, the same on both servers.
    turn2 = [batch for url, batch in sent if len(batch[0]) == 3]
    assert len(turn2) == 2 * 2 and all(b == turn2[0] for b in turn2)
    first, answer, second = turn2[0][0]
    assert (first, second) == (
        {"role": "user", "content": "w5 w6 w7"},
        {"role": "user", "content": "w8 w9"},
    )
    assert answer["role"] == "assistant" and len(answer["content"].split()) == 6
    paths = write_suite_report(report, tmp_path / "out")
    assert sorted(p.name for p in paths) == ["suite.json", "suite.md", "suite.png"]
    data = json.loads((tmp_path / "out" / "suite.json").read_text())
    assert [c["category"] for c in data["categories"]] == ["chat", "single"]
    assert data["categories"][0]["spec"]["spec"]["accept_length"] == chat.spec.spec.accept_length
    assert "| chat | 2 | 2 | " in (tmp_path / "out" / "suite.md").read_text()


def test_bench_cli_suite_file_and_unknown_suite(servers, tmp_path, monkeypatch):  # noqa: F811
    spec, plain = servers
    unknown = CliRunner().invoke(
        app, cli_args("bench", url=spec.url, suite="nope", out=tmp_path / "o")
    )
    assert unknown.exit_code == 1 and "the suites are gsm8k, humaneval, mt-bench" in unknown.output
    path = tmp_path / "question.jsonl"
    path.write_text(
        json.dumps({"category": "math", "turns": ["w20 w21", "w22"]})
        + "\n"
        + json.dumps({"category": "rag", "turns": ["w23 w24"]})
        + "\n"
    )
    ok = CliRunner().invoke(
        app,
        cli_args(
            "bench",
            url=spec.url,
            baseline_url=plain.url,
            prompts=path,
            format="spec-bench",
            concurrency=1,
            max_tokens=4,
            repeats=1,
            out=tmp_path / "o",
        ),
    )
    assert ok.exit_code == 0, ok.output
    assert "| multi-turn | 1 | 2 | " in ok.output and "| rag | 1 | 1 | " in ok.output
    assert (tmp_path / "o" / "suite.png").is_file()
    assert "machine was busy" not in ok.output
    monkeypatch.setattr(
        os, "getloadavg", lambda: (64.0, 0.0, 0.0)
    )  # the servers run on this busy machine
    busy = CliRunner().invoke(
        app,
        bench_args(
            spec.url,
            tmp_path / "b",
            baseline_url=plain.url,
            suite="gsm8k",
            num_prompts=1,
            max_tokens=2,
        ),
    )
    assert busy.exit_code == 0, busy.output
    last = busy.output.strip().splitlines()[-1]  # after the report, where the sweep's note is
    assert (
        last.startswith("note: the machine was busy when this started (load 64.0")
        and "the tokens/s of servers on this machine" in last
    ), busy.output


def test_a_suite_against_a_server_without_a_chat_template_says_what_it_needs():
    """The server's one-line reason (not its JSON body) and what a suite needs of it."""
    from specdraft.bench.config import BenchError
    from specdraft.engine.spec_config import SpecConfig
    from tests.support.engine_helpers import tiny_setup
    from tests.support.serve_helpers import engine, own_target, running, word_tokenizer

    setup = tiny_setup("llama")
    tok = word_tokenizer()
    tok.chat_template = None  # a base model's tokenizer (stories260K, pycode-25m)
    with running(engine(own_target(setup), setup.trained, SpecConfig.chain(3), tok), tok) as spec:
        cfg = BenchConfig(spec.url, concurrency=(1,), max_tokens=4, repeats=1, warmup=0)
        with pytest.raises(BenchError) as refused:
            run_suite(cfg, SUITE)
    message = str(refused.value)
    assert "HTTP 400: this model's tokenizer has no chat template: use /v1/completions" in message
    assert (
        '{"error"' not in message
        and "sends chat completions, rendered by the server's chat template" in message
    )
