"""Records of the other mode (regenerate --no-chat's prompt/completion output read as chats, or
chats read with --no-chat) get one line saying which flag to pass, never a --skip-bad hint that
would skip every record; bad JSON and skipped-record counts read as English."""

from __future__ import annotations

import json

import pytest

from specdraft.data.records import BadRecord, DataError, read_records
from tests.support.cli import cli_args, flat, invoke
from tests.support.tiny_models import save_tiny_model
from tests.support.tiny_tokenizer import save_tiny_tokenizer

CHAT = [
    {"role": "user", "content": "hi there"},
    {"role": "assistant", "content": "hello how are you"},
]


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    path = save_tiny_model("llama", tmp_path_factory.mktemp("nochat") / "target")
    save_tiny_tokenizer(path)
    return path


def write_jsonl(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def regenerated(path, n=4):
    """What `specdraft regenerate --no-chat` writes: {"index", "source", "prompt", "completion"}."""
    return write_jsonl(
        path,
        [
            {"index": i, "source": f"in.txt:{i}", "prompt": "hello how", "completion": " are you"}
            for i in range(n)
        ],
    )


def test_prompt_completion_records_read_as_chats_get_one_line(tmp_path):
    path = regenerated(tmp_path / "regen.jsonl")
    for skip_bad in (False, True):
        with pytest.raises(DataError) as info:
            read_records(path, chat=True, skip_bad=skip_bad)
        assert not isinstance(
            info.value, BadRecord
        )  # not one bad record: commands add no --skip-bad hint
        assert (
            str(info.value) == f"{path} holds prompt/completion records, not chats: pass --no-chat"
        )
    assert len(read_records(path, chat=False).records) == 4
    texts = write_jsonl(tmp_path / "texts.jsonl", [{"text": "hello how are you"}] * 2)
    with pytest.raises(
        DataError, match=r"texts.jsonl holds text records, not chats: pass --no-chat$"
    ):
        read_records(texts, chat=True)
    chats = write_jsonl(tmp_path / "chats.jsonl", [{"messages": CHAT}] * 2)
    with pytest.raises(
        DataError, match=r"chats.jsonl holds chats, not plain text: drop --no-chat$"
    ):
        read_records(chats, chat=False)


def test_one_text_record_among_chats_stays_a_bad_record(tmp_path):
    path = write_jsonl(
        tmp_path / "mixed.jsonl", [{"messages": CHAT}, {"text": "hello"}, {"messages": CHAT}]
    )
    with pytest.raises(BadRecord, match=f"{path}:2: no 'messages' or 'conversations' field"):
        read_records(path, chat=True)
    assert read_records(path, chat=True, skip_bad=True).num_skipped == 1
    first_text = write_jsonl(tmp_path / "first.jsonl", [{"text": "hello"}, {"messages": CHAT}])
    with pytest.raises(
        BadRecord, match=f"{first_text}:1: "
    ):  # a chat follows: not all text records
        read_records(first_text, chat=True)


@pytest.mark.parametrize("command", ["capture", "regenerate", "train"])
def test_commands_say_pass_no_chat_for_regenerated_no_chat_output(target, tmp_path, command):
    path = regenerated(tmp_path / "regen.jsonl")
    out = tmp_path / "out"
    args = {
        "capture": ["capture", str(target), str(path), str(out)],
        "regenerate": ["regenerate", str(path), str(out / "r.jsonl"), "--target", str(target)],
        "train": cli_args("train", path, out, online=True, target=target),
    }[command]
    for extra in ([], ["--skip-bad"]):
        result = invoke(args + extra)
        assert result.exit_code == 1, result.output
        text = flat(result.output)
        assert f"error: {path} holds prompt/completion records, not chats: pass --no-chat" in text
        assert "--skip-bad" not in text and "chat=False" not in text and "skipped" not in text


def test_bad_json_and_skip_counts_read_as_english(target, tmp_path):
    path = write_jsonl(
        tmp_path / "d.jsonl", ['{"text": "hello\tthere"}', {"text": "hello how are you"}]
    )
    with pytest.raises(BadRecord) as info:
        read_records(path, chat=False)
    assert f"{path}:1: bad JSON (Invalid control character at column 16)" in str(info.value)
    assert "at at" not in str(info.value)
    truncated = write_jsonl(tmp_path / "t.jsonl", [{"text": "fine"}, '{"text": ["a", "b"'])
    with pytest.raises(BadRecord) as info:  # json reads on into the newline: not "line 2 column 1"
        read_records(truncated, chat=False)
    assert f"{truncated}:2: bad JSON (Expecting ',' delimiter at the end of the line)" in str(
        info.value
    )
    result = invoke(
        cli_args("capture", target, path, tmp_path / "store", no_chat=True, skip_bad=True)
    )
    assert result.exit_code == 0, result.output
    assert f"skipped 1 bad record in {path}" in flat(result.output)
