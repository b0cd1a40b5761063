"""`doctor --skip-bad` counts what it skipped: "skipped N of M records (first: file:line reason)"
in Report.notes, printed after the table and in --json, for token-id rows, chats skipped on
reading, and chats the template cannot render."""

from __future__ import annotations

import json

import pytest

from specdraft.doctor import run_doctor
from tests.support.cli import cli_args, flat, invoke
from tests.support.doctor_helpers import draft_checkpoint, one_thread  # noqa: F401
from tests.support.serve_helpers import word_tokenizer

# Renders a user turn holding "w9" differently once later turns exist (not prefix-stable), so a
# chat that starts with one cannot be rendered with its assistant span (a render-time BadRecord).
TEMPLATE = (
    "{% for m in messages %}{% if 'w9' in m['content'] and not loop.last %}w8 {% endif %}"
    "{% if m['role'] == 'assistant' %}w3 {% endif %}{{ m['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}w3 {% endif %}"
)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """(draft dir, target dir with a word tokenizer and TEMPLATE)."""
    draft, target = draft_checkpoint(tmp_path_factory.mktemp("skip"), num_layers=5)
    tok = word_tokenizer()
    tok.chat_template = TEMPLATE
    tok.save_pretrained(target)
    return draft, target


def write_lines(path, lines):
    path.write_text("".join(line + "\n" for line in lines))
    return path


def chat(user: str, assistant: str | None = "w2 w6 w7 w11") -> str:
    messages = [{"role": "user", "content": user}]
    if assistant is not None:
        messages.append({"role": "assistant", "content": assistant})
    return json.dumps({"messages": messages})


def notes(world, samples, skip_bad=True):
    draft, target = world
    return run_doctor(draft, target=target, samples=samples, skip_bad=skip_bad).notes


def test_token_rows_skipped_are_counted_with_the_first(world, tmp_path):
    good = '{"input_ids": [1, 2, 3, 4, 5]}'
    path = write_lines(tmp_path / "ids.jsonl", [good, "{", good, '{"input_ids": "x"}', good])
    assert notes(world, path) == [
        f"--samples {path}: skipped 2 of 5 records (first: {path}:2: bad JSON "
        "(Expecting property name enclosed in double quotes at the end of the line))"
    ]
    clean = write_lines(tmp_path / "clean.jsonl", [good, good])
    assert notes(world, clean) == [f"--samples {clean}: skipped 0 of 2 records"]
    assert notes(world, clean, skip_bad=False) == []


def test_chats_skipped_on_reading_and_rendering_are_counted(world, tmp_path):
    path = write_lines(
        tmp_path / "chats.jsonl", [chat("w4 w1"), chat("w5 w1", None), chat("w9 w1"), chat("w4 w5")]
    )
    assert notes(world, path) == [
        f"--samples {path}: skipped 2 of 4 records (first: {path}:2: no assistant "
        "turn (nothing to learn))"
    ]
    render_only = write_lines(
        tmp_path / "render.jsonl", [chat("w4 w1"), chat("w9 w1"), chat("w4 w5")]
    )
    assert notes(world, render_only) == [
        f"--samples {render_only}: skipped 1 of 3 records (first: {render_only}:2: the chat template renders "
        "assistant message 1 differently from the prompt it serves it with (not prefix-stable), so the turn "
        "cannot be located exactly; check --template-kwargs / --reasoning)"
    ]


def test_cli_prints_the_count_and_json_carries_it(world, tmp_path):
    draft, target = world
    good = '{"input_ids": [1, 2, 3, 4, 5]}'
    path = write_lines(
        tmp_path / "ids.jsonl", [good, '{"input_ids": [1, 2], "loss_mask": [1]}', good]
    )
    args = cli_args("doctor", draft, target=target, samples=path, skip_bad=True)
    table = invoke(args)
    assert table.exit_code == 0, table.output
    assert (
        f"note: --samples {path}: skipped 1 of 3 records (first: {path}:2: loss_mask must be 2 zeros"
        in flat(table.output)
    )
    report = json.loads(invoke(args + ["--json"]).stdout)
    assert report["notes"] == [
        f"--samples {path}: skipped 1 of 3 records (first: {path}:2: loss_mask must be "
        "2 zeros and ones, one per input id)"
    ]
