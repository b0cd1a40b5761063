"""`tune --suite`: the suite's chats rendered turn by turn with the target's own answers, tune on
them, then tau, p_k and speedup per category."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from specdraft.bench.suites import Question, Suite
from specdraft.bench.tune_suite import suite_prompt_ids
from specdraft.cli import app
from tests.support.cli import cli_args
from tests.support.engine_helpers import one_thread, tiny_setup  # noqa: F401
from tests.support.serve_helpers import saved_pair, word_tokenizer


def test_turns_carry_the_targets_own_answers():
    tok = word_tokenizer()
    asked = []

    def answer(ids):
        asked.append(ids)
        return "w7 w8"

    suite = Suite("s", (Question("a", ("w1 w2", "w3")), Question("b", ("w4",))))
    prompts = suite_prompt_ids(tok, suite, answer)
    render = lambda chat: tok(  # noqa: E731
        tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True),
        add_special_tokens=False,
    )["input_ids"]
    first = [{"role": "user", "content": "w1 w2"}]
    assert prompts["a"] == [
        render(first),
        render(
            [*first, {"role": "assistant", "content": "w7 w8"}, {"role": "user", "content": "w3"}]
        ),
    ]
    assert prompts["b"] == [render([{"role": "user", "content": "w4"}])]
    assert asked == [render(first)]  # only a question with a next turn is answered


def test_tune_cli_suite_reports_per_category(tmp_path):
    setup = tiny_setup("llama")
    target, draft = saved_pair(setup, tmp_path)
    base = cli_args(
        "tune",
        target=target,
        draft=draft,
        max_tokens=4,
        probe_steps=2,
        topks=1,
        num_measure=1,
        repeats=1,
    )
    unknown = CliRunner().invoke(app, [*base, "--suite", "nope"])
    assert unknown.exit_code == 1 and "the suites are gsm8k, humaneval, mt-bench" in unknown.output
    result = CliRunner().invoke(
        app, [*base, "--suite", "gsm8k", "--json-out", str(tmp_path / "t.json")]
    )
    assert result.exit_code == 0, result.output
    assert "per category of gsm8k" in result.output and "25 prompts" in result.output
    assert " 1 round" in result.output and " 1 rounds" not in result.output
    (row,) = json.loads((tmp_path / "t.json").read_text())["categories"]
    assert row["category"] == "gsm8k" and row["num_prompts"] == 25
    # at most the probe depth, raised to 3 by the default 3-step chain tune always measures
    assert row["accept_length"] >= 1 and len(row["acceptance_per_position"]) <= 3
    assert row["speedup"] == row["tokens_per_s"] / row["plain_tokens_per_s"]


def test_the_categories_run_the_recommendation_else_the_fastest_measured_setting():
    """Not the probe depth: with no speculation recommended the rows run the fastest measured
    candidate and say so; with nothing measured there are no rows."""
    from types import SimpleNamespace

    from specdraft.bench.tune_suite import CategoryTune, category_setting, render_categories
    from specdraft.engine.spec_config import SpecConfig

    fast, slow = SpecConfig.chain(1), SpecConfig(3, 2, 6)
    candidates = [
        SimpleNamespace(spec=slow, measured_tps=10.0),
        SimpleNamespace(spec=fast, measured_tps=12.0),
        SimpleNamespace(spec=SpecConfig.chain(8), measured_tps=None),
    ]
    assert (
        category_setting(
            SimpleNamespace(recommendation=SimpleNamespace(spec=slow), candidates=candidates)
        )
        == slow
    )
    assert category_setting(SimpleNamespace(recommendation=None, candidates=candidates)) == fast
    assert category_setting(SimpleNamespace(recommendation=None, candidates=candidates[2:])) is None
    row = CategoryTune("math", 2, fast, 1.5, [0.5], 9.0, 12.0)
    suite = SimpleNamespace(name="gsm8k")
    assert ": the fastest measured; no speculation is recommended;" in render_categories(
        suite, [row], False
    )
    assert ": the recommendation;" in render_categories(suite, [row])
