"""The tokenizer's length bounds the draft vocabulary, and a changed tokenizer is named, in every
command (issue #20, items 1 and 3).

The tiny target has 128 embedding rows but its tokenizer 85 tokens (rows 85..127 are padding, as
in Qwen-family configs); the manifest records the tokenizer. The seeded drafter with 64 draft ids
maps draft id i to target id 2i, so ids 43..63 land on padding rows (86..126): inspect, doctor,
generate, serve and export refuse it by the one rule (`checkpoint.vocab_map_problems`). With 40
draft ids (target ids 0..78) it is sound, and a target whose tokenizer is not the recorded one
gets the same one-line note from generate, serve and export.
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from specdraft.checkpoint import MANIFEST_FILE, CheckpointError
from specdraft.cli import app
from specdraft.data.render import tokenizer_fingerprint
from specdraft.doctor import run_doctor
from specdraft.engine.load import load_engine
from specdraft.engine.spec_config import SpecConfig
from specdraft.serve.server import build_app
from tests.support.doctor_helpers import draft_checkpoint, one_thread  # noqa: F401 (fixture)
from tests.support.tiny_tokenizer import tiny_chat_tokenizer

ENV = {"COLUMNS": "400"}
PADDING = "d2t maps 21 draft ids to target ids 86..126, past the tokenizer's 85 tokens"


def record_tokenizer(draft, tokenizer) -> None:
    """Write `tokenizer`'s fingerprint into the drafter's manifest, as capture and train do."""
    file = draft / MANIFEST_FILE
    manifest = json.loads(file.read_text())
    manifest["tokenizer"] = tokenizer_fingerprint(tokenizer)
    file.write_text(json.dumps(manifest))


def drafter(root, draft_vocab_size: int):
    """(draft dir, target dir holding the 85-token tokenizer), the manifest recording it."""
    draft, target = draft_checkpoint(root, draft_vocab_size=draft_vocab_size)
    tokenizer = tiny_chat_tokenizer()
    tokenizer.save_pretrained(target)
    record_tokenizer(draft, tokenizer)
    return draft, target


@pytest.fixture(scope="module")
def padded(tmp_path_factory):
    """A drafter mapping 21 draft ids into the embedding's padding rows."""
    return drafter(tmp_path_factory.mktemp("padded"), 64)


@pytest.fixture(scope="module")
def sound(tmp_path_factory):
    """A drafter whose 40 draft ids all map to tokens (target ids 0..78)."""
    return drafter(tmp_path_factory.mktemp("sound"), 40)


def run(*args: str):
    return CliRunner().invoke(app, [str(a) for a in args], env=ENV)


def test_inspect_fails_the_audit_of_a_map_into_padding_rows(padded, sound):
    result = run("inspect", padded[0])
    assert result.exit_code == 1, result.output
    assert f"audit: FAIL {PADDING}" in result.output
    assert "rows 85..127 of the target's embedding are padding" in result.output
    ok = run("inspect", sound[0])
    assert ok.exit_code == 0 and "audit: PASS" in ok.output, ok.output


def test_doctor_fails_the_vocab_map_check(padded, sound):
    finding = run_doctor(padded[0], target=padded[1]).finding("vocab_map_valid")
    assert finding.verdict == "fail" and PADDING in finding.evidence, finding
    finding = run_doctor(sound[0], target=sound[1]).finding("vocab_map_valid")
    assert finding.verdict == "pass", finding
    assert "increasing target ids in [0, 85, the tokenizer's length)" in finding.evidence


def test_generate_refuses_it_in_one_line(padded, sound):
    args = ("--prompt", "hello", "--max-new-tokens", "2", "--num-steps", "2")
    result = run("generate", "--target", padded[1], "--draft", padded[0], *args)
    assert result.exit_code == 1, result.output
    assert f"{padded[0]}: its vocabulary map (d2t) is wrong: {PADDING}" in result.output
    assert "Traceback" not in result.output
    ok = run("generate", "--target", sound[1], "--draft", sound[0], *args)
    assert ok.exit_code == 0, ok.output


def test_serve_and_the_engine_refuse_it(padded):
    with pytest.raises(CheckpointError, match="past the tokenizer's 85 tokens"):
        build_app(str(padded[1]), str(padded[0]), SpecConfig.chain(2))
    with pytest.raises(CheckpointError, match="past the tokenizer's 85 tokens"):
        load_engine(padded[1], padded[0], SpecConfig.chain(2))


def test_export_refuses_it(padded, sound, tmp_path):
    result = run("export", padded[0], tmp_path / "out", "--engine", "vllm")
    assert result.exit_code == 1, result.output
    assert PADDING in result.output and not (tmp_path / "out").exists()
    ok = run("export", sound[0], tmp_path / "ok", "--engine", "vllm")
    assert ok.exit_code == 0, ok.output


# ------------------------------------------------------------------------------- item 3


@pytest.fixture(scope="module")
def retokenized(tmp_path_factory, sound):
    """(draft dir, target dir): the sound drafter's target with one token more in its tokenizer."""
    import shutil

    root = tmp_path_factory.mktemp("retokenized")
    target = root / "target"
    shutil.copytree(sound[1], target)
    tokenizer = tiny_chat_tokenizer()
    tokenizer.add_tokens(["zebra"])
    tokenizer.save_pretrained(target)
    return sound[0], target


def assert_one_note(output: str, draft, target) -> None:
    lines = [line for line in output.splitlines() if "its tokenizer differs" in line]
    assert len(lines) == 1, output
    assert lines[0].startswith(
        f"note: {target}: its tokenizer differs from the one the drafter was "
        "trained with (vocab_hash "
    ), lines[0]
    assert "length 85 -> 86" in lines[0]
    assert lines[0].endswith(f"`specdraft doctor {draft} --target {target}` names the difference")


def test_generate_notes_a_tokenizer_that_differs_from_the_manifest(retokenized, sound):
    draft, target = retokenized
    result = run(
        "generate",
        "--target",
        target,
        "--draft",
        draft,
        "--prompt",
        "hello",
        "--max-new-tokens",
        "2",
    )
    assert result.exit_code == 0, result.output
    assert_one_note(result.output, draft, target)
    same = run(
        "generate",
        "--target",
        sound[1],
        "--draft",
        sound[0],
        "--prompt",
        "hello",
        "--max-new-tokens",
        "2",
    )
    assert "its tokenizer differs" not in same.output, same.output


def test_serve_notes_it(retokenized):
    draft, target = retokenized
    notes = build_app(str(target), str(draft), SpecConfig.chain(2)).state.server.engine.notes
    assert_one_note("\n".join(f"note: {n}" for n in notes), draft, target)


def test_export_notes_it(retokenized, sound, tmp_path):
    draft, target = retokenized
    result = run("export", draft, tmp_path / "out", "--engine", "vllm", "--target", target)
    assert result.exit_code == 0, result.output
    assert_one_note(result.output, draft, target)
    same = run("export", sound[0], tmp_path / "same", "--engine", "vllm", "--target", sound[1])
    assert same.exit_code == 0 and "its tokenizer differs" not in same.output, same.output
