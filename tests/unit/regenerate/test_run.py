"""specdraft.regenerate: endpoint backend against a local HTTP server (retries, resume), the local
transformers backend (left-padded batches), the settings sidecar, and the CLI command."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from specdraft.cli import app
from specdraft.data.records import read_records
from specdraft.data.render import load_dataset
from specdraft.regenerate.backends import (
    LocalBackend,
    Prompt,
    RegenerationError,
    Sampling,
)
from specdraft.regenerate.output import settings_path
from specdraft.regenerate.run import regenerate
from tests.support.cli import cli_args
from tests.support.regenerate import (
    CHATS,
    backend,
    chat_records,
    read_out,
    server,  # noqa: F401 (fixture)
)
from tests.support.tiny_models import save_tiny_model
from tests.support.tiny_tokenizer import save_tiny_tokenizer, tiny_chat_tokenizer


def test_endpoint_chat_regenerates_every_turn_with_retry(server, tmp_path):
    server.failures = {"two": [500], "three": [503, 429]}
    sampling = Sampling(temperature=0.7, top_p=0.9, max_new_tokens=16, seed=5)
    out = tmp_path / "out.jsonl"
    result = regenerate(
        chat_records(tmp_path),
        out,
        backend(server),
        sampling,
        template_kwargs={"enable_thinking": False},
    )
    assert (result.num_done, result.num_kept, result.num_empty) == (5, 0, 0)
    rows = read_out(out)
    assert [r["index"] for r in rows] == [0, 1, 2, 3, 4]
    assert rows[0]["messages"][-1] == {"role": "assistant", "content": "re hello"}
    assert [m["content"] for m in rows[1]["messages"]] == ["one", "re one", "two", "re two"]
    assert rows[2]["messages"][0]["role"] == "system" and rows[2]["source"].endswith(":3")
    assert len(server.requests) == 6 + 3  # 6 turns, 3 retried
    second_turn = [b for _, b in server.requests if b["messages"][-1]["content"] == "two"][0]
    assert second_turn["messages"][1]["content"] == "re one"  # earlier turn already replaced
    body = server.requests[0][1]
    assert (body["temperature"], body["top_p"], body["max_tokens"]) == (0.7, 0.9, 16)
    assert body["chat_template_kwargs"] == {"enable_thinking": False} and body["model"] == "tiny"
    assert {b["seed"] for _, b in server.requests} == {5, 6, 7, 8, 9}
    sidecar = json.loads(settings_path(out).read_text())
    assert sidecar["sampling"] == {
        "temperature": 0.7,
        "top_p": 0.9,
        "max_new_tokens": 16,
        "seed": 5,
    }
    assert sidecar["backend"]["url"] == server.url + "/v1/chat/completions"
    data = load_dataset(out, tiny_chat_tokenizer())  # the output is training data
    assert len(data.samples) == 5


def test_endpoint_resume_after_interruption(server, tmp_path):
    records = chat_records(tmp_path)
    out = tmp_path / "out.jsonl"
    server.failures = {"five": [500] * 3}  # more than max_retries: the run stops
    with pytest.raises(RegenerationError, match="HTTP 500 after 3 attempts.*re-run"):
        regenerate(records, out, backend(server, batch_size=2), Sampling())
    first = out.read_text()
    assert [r["index"] for r in read_out(out)] == [0, 1, 2, 3]
    with open(out, "a") as f:
        f.write('{"index": 4, "source": "x", "mess')  # crash in the middle of a line
    server.requests.clear()
    result = regenerate(records, out, backend(server, batch_size=2), Sampling())
    assert (result.num_done, result.num_kept) == (1, 4)
    assert [b["messages"][-1]["content"] for _, b in server.requests] == ["five"]
    assert out.read_text().startswith(first)
    assert [r["index"] for r in read_out(out)] == [0, 1, 2, 3, 4]
    result = regenerate(records, out, backend(server, batch_size=2), Sampling())
    assert (result.num_done, result.num_kept) == (0, 5)


def test_other_settings_and_client_errors_are_refused(server, tmp_path):
    records = chat_records(tmp_path, CHATS[:1])
    out = tmp_path / "out.jsonl"
    regenerate(records, out, backend(server), Sampling(temperature=0.0))
    with pytest.raises(RegenerationError, match=r"other settings \(sampling differs; see"):
        regenerate(records, out, backend(server), Sampling(temperature=1.0))
    server.failures = {"hello": [400]}
    with pytest.raises(RegenerationError, match="HTTP 400 after 1 attempts.*boom") as failed:
        regenerate(records, tmp_path / "other.jsonl", backend(server), Sampling())
    # the first batch failed: no file is left, so none is named as holding finished records
    assert (
        "finished records are kept" not in str(failed.value)
        and not (tmp_path / "other.jsonl").exists()
    )


def test_endpoint_completions_no_chat_sends_prompt_token_ids(server, tmp_path):
    tok = tiny_chat_tokenizer()
    path = tmp_path / "docs.txt"
    path.write_text("once upon a time there was a little girl\n\nthe cat sat\n")
    records = read_records(path, chat=False)
    out = tmp_path / "out.jsonl"
    regenerate(
        records, out, backend(server, api="completions"), Sampling(), tokenizer=tok, prompt_tokens=4
    )
    prompts = [b["prompt"] for _, b in server.requests]
    # Requests run concurrently, so the server may see them in either order.
    assert sorted(prompts) == sorted(
        [tok("once upon a")["input_ids"], tok("the cat sat")["input_ids"]]
    )
    rows = read_out(out)
    assert rows[0]["prompt"] == "once upon a" and rows[0]["completion"] == " 4 tokens"
    again = read_records(out, chat=False)
    assert [r.text for r in again.records] == [" 4 tokens", " 4 tokens"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = save_tiny_model("llama", tmp_path_factory.mktemp("t") / "tiny", vocab_size=85)
    save_tiny_tokenizer(path)
    return path


def test_local_backend_batched_equals_one_by_one(model_dir, tmp_path):
    records = chat_records(tmp_path)
    sampling = Sampling(max_new_tokens=6)
    regenerate(records, tmp_path / "a.jsonl", LocalBackend(model_dir, batch_size=3), sampling)
    regenerate(records, tmp_path / "b.jsonl", LocalBackend(model_dir, batch_size=1), sampling)
    a, b = read_out(tmp_path / "a.jsonl"), read_out(tmp_path / "b.jsonl")
    assert a == b and len(a) == 5
    assert all(m["content"] != "old" for r in a for m in r["messages"] if m["role"] == "assistant")
    sampled = Sampling(temperature=1.0, top_p=0.9, max_new_tokens=6, seed=1)
    regenerate(records, tmp_path / "c.jsonl", LocalBackend(model_dir, batch_size=3), sampled)
    regenerate(records, tmp_path / "d.jsonl", LocalBackend(model_dir, batch_size=3), sampled)
    assert read_out(tmp_path / "c.jsonl") == read_out(tmp_path / "d.jsonl")
    assert json.loads(settings_path(tmp_path / "c.jsonl").read_text())["sampling"]["seed"] == 1


def test_local_backend_without_end_or_pad_ids_generates_to_the_limit(model_dir, tmp_path):
    """A target that names no end id and no pad id (none in its tokenizer or configs) pads its
    batches with id 0 (masked) and generates max_new_tokens (was an IndexError)."""
    import shutil

    bare = shutil.copytree(model_dir, tmp_path / "bare")
    for file in bare.glob("*.json"):
        config = json.loads(file.read_text())
        if isinstance(config, dict):
            for key in ("eos_token_id", "pad_token_id", "eos_token", "pad_token"):
                config.pop(key, None)
            file.write_text(json.dumps(config))
    backend = LocalBackend(bare, batch_size=2)
    assert backend.eos_ids == [] and backend.pad_id == 0
    assert backend._generation_config(Sampling(max_new_tokens=5)).eos_token_id is None
    out = backend.complete(
        [Prompt(ids=[3, 4, 5], index=0), Prompt(ids=[6, 7], index=1)], Sampling(max_new_tokens=5)
    )
    assert len(out) == 2 and all(c.content for c in out)


def test_local_backend_no_chat_continues_the_first_tokens(model_dir, tmp_path):
    path = tmp_path / "docs.txt"
    path.write_text("once upon a time there was a girl\n\nthe dog sat on the mat\n")
    out = tmp_path / "out.jsonl"
    records = read_records(path, chat=False)
    regenerate(records, out, LocalBackend(model_dir), Sampling(max_new_tokens=5), prompt_tokens=3)
    rows = read_out(out)
    assert [r["prompt"] for r in rows] == ["once upon", "the dog"]  # BOS + 2 words
    assert all(isinstance(r["completion"], str) for r in rows)


def test_cli_regenerate(server, tmp_path):
    data = tmp_path / "chats.jsonl"
    data.write_text("".join(json.dumps({"messages": c}) + "\n" for c in CHATS[:2]))
    out = tmp_path / "out.jsonl"
    sampling = dict(model="tiny", temperature="0.5", seed=3, concurrency=2)
    thinking = '{"enable_thinking": true}'
    args = cli_args(
        "regenerate", data, out, endpoint=server.url, **sampling, template_kwargs=thinking
    )
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "2 records" in result.output
    assert [r["messages"][-1]["content"] for r in read_out(out)] == ["re hello", "re two"]
    assert json.loads(settings_path(out).read_text())["sampling"]["temperature"] == 0.5
    bad = CliRunner().invoke(app, ["regenerate", str(data), str(out), "--model", "tiny"])
    assert bad.exit_code != 0 and "exactly one of" in bad.output


def test_cli_no_chat_with_an_endpoint_and_no_tokenizer_names_the_option(server, tmp_path):
    """--no-chat against an endpoint cuts each text into a prompt with the target's tokenizer:
    without one, the error names --tokenizer (and --target), not only what is missing."""
    data = tmp_path / "texts.jsonl"
    data.write_text(json.dumps({"text": "a b c d e f g h"}) + "\n")
    args = ["regenerate", str(data), str(tmp_path / "out.jsonl"), "--endpoint", server.url]
    result = CliRunner().invoke(
        app, [*args, "--model", "tiny", "--no-chat", "--api", "completions"]
    )
    assert result.exit_code == 1, result.output
    assert "--no-chat with --endpoint needs --tokenizer DIR" in result.output
    assert "or pass --target DIR" in result.output
