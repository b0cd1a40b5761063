"""capture / regenerate: arguments refused before anything is written, one-line errors, Ctrl-C."""

from __future__ import annotations

import json

import pytest

import specdraft.capture.write as capture_write
import specdraft.regenerate.run as regenerate_run
from specdraft.capture.store import FORMAT, INDEX, CaptureError, CaptureStore
from specdraft.conventions import ConventionError, check_aux_layers, to_engine_ids
from tests.support.capture import capture, one_line_error, run
from tests.support.tiny_models import save_tiny_model
from tests.support.tiny_tokenizer import CHAT, tiny_chat_tokenizer


@pytest.fixture(scope="module")
def base_model_dir(tmp_path_factory):
    """A target whose tokenizer has no chat template (a base model)."""
    path = save_tiny_model(
        "llama", tmp_path_factory.mktemp("base") / "tiny", num_layers=4, vocab_size=85
    )
    tok = tiny_chat_tokenizer()
    tok.chat_template = None
    tok.save_pretrained(path)
    return path


@pytest.fixture
def chats(tmp_path):
    path = tmp_path / "chats.jsonl"
    path.write_text("".join(json.dumps({"messages": c}) + "\n" for c in [CHAT, CHAT[:3], CHAT]))
    return path


def test_check_aux_layers_is_the_rule_to_engine_ids_applies():
    assert check_aux_layers([2, 3, 4], 5) == [2, 3, 4]
    for bad in ([4, 3, 2], [2], [2, 3, 9]):
        with pytest.raises(ConventionError) as rule:
            check_aux_layers(bad, 5)
        with pytest.raises(ConventionError) as engine:
            to_engine_ids(bad, "vllm", 5)
        assert str(rule.value) == str(engine.value)


@pytest.mark.parametrize(
    "layers, reason",
    [
        ("3,2,1", "must increase strictly within 0..4"),
        (
            "2",
            "SGLang and vLLM both read exactly 3 aux states (fc input = 3 "
            "x target hidden size): a drafter trained on 1 serves on neither",
        ),
        ("1,2,9", "must increase strictly within 0..4"),
    ],
)
def test_bad_aux_layers_are_refused_before_anything_is_written(
    chat_target_dir, chats, tmp_path, layers, reason
):
    out = tmp_path / "store"
    one_line_error(
        capture(chat_target_dir, chats, out, "--aux-layers", layers),
        f"--aux-layers {layers}:",
        reason,
    )
    assert not out.exists()
    ok = capture(chat_target_dir, chats, out, "--aux-layers", "1,2,3")  # the corrected re-run
    assert ok.exit_code == 0, ok.output
    assert "capture store at " in ok.output and "store store" not in ok.output


def test_failure_before_the_first_shard_leaves_no_store(
    chat_target_dir, chats, tmp_path, monkeypatch
):
    out = tmp_path / "store"

    def fail(*args, **kwargs):
        raise CaptureError("boom")  # a user error: printed as one line (any other is a bug)

    with monkeypatch.context() as m:
        m.setattr(capture_write, "capture_shard", fail)
        failed = capture(chat_target_dir, chats, out, "--aux-layers", "1,2,3")
    assert failed.exit_code == 1 and failed.output.strip().splitlines()[-1] == "error: boom"
    assert not out.exists()
    out.mkdir()  # a leftover store without a shard (left by an older version) does not block a re-run
    (out / INDEX).write_text(
        json.dumps({"format": FORMAT, "aux_layers": [9], "shards": [], "complete": False})
    )
    result = capture(chat_target_dir, chats, out, "--aux-layers", "1,2,3")
    assert result.exit_code == 0, result.output


def test_output_that_is_a_file_or_a_foreign_directory_is_refused(chat_target_dir, chats, tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("keep me")
    one_line_error(capture(chat_target_dir, chats, afile), "is a file; pass a directory")
    assert afile.read_text() == "keep me"
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "important.txt").write_text("x")
    one_line_error(
        capture(chat_target_dir, chats, mine),
        "holds files that are not a capture store",
        "give a new or empty directory",
    )
    assert sorted(p.name for p in mine.iterdir()) == ["important.txt"]


def test_a_run_stopped_before_its_index_is_continued(chat_target_dir, chats, tmp_path):
    """A directory holding only what a run stopped before its index.json leaves (the target head,
    temporary files of either naming) is captured into, and the temporary files are removed."""
    out = tmp_path / "store"
    out.mkdir()
    for name in ("target_head.safetensors", ".index.json.tmp-4242", "shard-00000.safetensors.tmp"):
        (out / name).write_bytes(b"partial")
    result = capture(chat_target_dir, chats, out)
    assert result.exit_code == 0, result.output
    assert not [p.name for p in out.iterdir() if ".tmp" in p.name]
    CaptureStore(out).verify()


def interrupt_second_call(real):
    """`real`, except that its second call raises KeyboardInterrupt (Ctrl-C mid-run)."""
    calls = []

    def wrapped(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    return wrapped


def test_capture_interrupted_says_what_was_kept(chat_target_dir, chats, tmp_path, monkeypatch):
    out = tmp_path / "store"
    with monkeypatch.context() as m:
        m.setattr(
            capture_write, "capture_shard", interrupt_second_call(capture_write.capture_shard)
        )
        result = capture(chat_target_dir, chats, out)
    assert result.exit_code == 130
    total = json.loads((out / INDEX).read_text())["num_shards"]
    assert (
        f"interrupted; 1 of {total} shards kept in {out}: re-run the same command" in result.output
    )
    again = capture(chat_target_dir, chats, out)
    assert (
        again.exit_code == 0
        and f"{total} shards (1 of {total} kept from an earlier run)" in again.output
    ), again.output
    one = capture(chat_target_dir, chats, tmp_path / "one", "--shard-tokens", 1000)
    assert one.exit_code == 0 and "tokens, 1 shard\n" in one.output and "1 shard;" in one.output, (
        one.output
    )


def test_regenerate_without_chat_template_leaves_nothing(base_model_dir, chats, tmp_path):
    out = tmp_path / "rr.jsonl"
    line = one_line_error(
        run("regenerate", chats, out, "--target", base_model_dir), "pass --no-chat"
    )
    assert "huggingface.co" not in line
    assert list(tmp_path.iterdir()) == [chats]
    texts = tmp_path / "texts.jsonl"
    texts.write_text(json.dumps({"text": "once upon a time there was a dog"}) + "\n")
    ok = run(
        "regenerate", texts, out, "--target", base_model_dir, "--no-chat", "--max-new-tokens", 3
    )
    assert ok.exit_code == 0, ok.output


def test_a_base_model_renders_chats_with_a_template_file(base_model_dir, chats, tmp_path):
    """--chat-template FILE gets chats past a tokenizer without a template (no more circle
    between "pass --no-chat" and "drop --no-chat"); with --no-chat it is refused."""
    from specdraft.data.template import template_fingerprint
    from tests.support.tiny_tokenizer import TEMPLATE

    template = tmp_path / "chat.jinja"
    template.write_text(TEMPLATE)
    line = one_line_error(
        run("regenerate", chats, tmp_path / "r.jsonl", "--target", base_model_dir)
    )
    assert "give one with --chat-template FILE" in line and "--no-chat" in line
    out = tmp_path / "regen.jsonl"
    regen = run(
        "regenerate", chats, out, "--target", base_model_dir, "--chat-template", template,
        "--max-new-tokens", 2,
    )  # fmt: skip
    assert regen.exit_code == 0, regen.output
    assert len(out.read_text().splitlines()) == 3
    captured = capture(base_model_dir, chats, tmp_path / "store", "--chat-template", template)
    assert captured.exit_code == 0, captured.output
    index = json.loads((tmp_path / "store" / INDEX).read_text())
    assert index["chat_template"]["hash"] == template_fingerprint(TEMPLATE)
    one_line_error(
        capture(
            base_model_dir, chats, tmp_path / "plain", "--no-chat", "--chat-template", template
        ),
        f"--chat-template {template} with --no-chat",
    )


def test_an_endpoint_s_chat_api_cannot_take_a_template_file(chats, tmp_path):
    from specdraft.regenerate.run import RegenConfig, RegenerationSettingError

    with pytest.raises(RegenerationSettingError, match="needs --api completions --tokenizer DIR"):
        RegenConfig(
            str(chats), str(tmp_path / "o.jsonl"), endpoint="http://h:1", model="m",
            chat_template="chat.jinja",
        )  # fmt: skip


def test_regenerate_into_a_directory_is_refused(chat_target_dir, chats, tmp_path):
    mydir = tmp_path / "mydir"
    mydir.mkdir()
    one_line_error(
        run("regenerate", chats, mydir, "--target", chat_target_dir),
        "is a directory",
        "must be a JSONL file path",
    )
    assert list(mydir.iterdir()) == []


def test_regenerate_reports_skipped_records(chat_target_dir, chats, tmp_path):
    broken = tmp_path / "broken.jsonl"
    broken.write_text(chats.read_text() + "{not json\n")
    result = run(
        "regenerate",
        broken,
        tmp_path / "out.jsonl",
        "--target",
        chat_target_dir,
        "--skip-bad",
        "--max-new-tokens",
        2,
    )
    assert result.exit_code == 0, result.output
    assert f"skipped 1 bad record in {broken}" in result.output.replace("\n", "")


def test_regenerate_interrupted_says_what_was_kept(chat_target_dir, chats, tmp_path, monkeypatch):
    out = tmp_path / "out.jsonl"
    with monkeypatch.context() as m:
        m.setattr(
            regenerate_run,
            "regenerate_chats",
            interrupt_second_call(regenerate_run.regenerate_chats),
        )
        result = run(
            "regenerate",
            chats,
            out,
            "--target",
            chat_target_dir,
            "--batch-size",
            1,
            "--max-new-tokens",
            2,
        )
    assert result.exit_code == 130
    assert (
        f"interrupted; 1 of 3 records kept in {out}: re-run the same command to continue"
        in result.output.replace("\n", "")
    )


def test_a_damaged_store_index_is_named(chat_target_dir, chats, tmp_path):
    """A store whose index.json is not JSON: one line naming the file and the fix, for the store's
    readers (train) and a capture resuming into it."""
    store = tmp_path / "store"
    assert capture(chat_target_dir, chats, store).exit_code == 0
    (store / INDEX).write_text("{")
    with pytest.raises(CaptureError, match=r"index.json: not valid JSON \(.*capture into a new"):
        CaptureStore(store)
    one_line_error(
        capture(chat_target_dir, chats, store), "index.json: not valid JSON", "capture into a new"
    )


def test_capture_says_its_aux_layers_and_each_engines_ids_first(chat_target_dir, chats, tmp_path):
    """One line before the work (as the demo says it): the default on a 4-layer target, where the
    engines' no-ids default collapses, with the ids vLLM and SGLang are given for it."""
    result = capture(chat_target_dir, chats, tmp_path / "store")
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[0] == (
        "aux layers [1, 2, 3] (specdraft indices, the default on this 4-layer target; the engines' no-ids "
        "default [2, L//2, L-3] collapses below 7 layers): vllm/speculators ids [1, 2, 3], sglang ids [0, 1, 2]"
    )
    given = capture(chat_target_dir, chats, tmp_path / "given", "--aux-layers", "0,2,4")
    assert given.output.splitlines()[0].startswith(
        "aux layers [0, 2, 4] (specdraft indices, given, on this "
        "4-layer target): vllm/speculators ids [0, 2, 4]"
    ), given.output
