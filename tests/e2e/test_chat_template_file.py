"""A base-model target (its tokenizer has no chat template), chats and a --chat-template file:
capture -> train -> serve -> doctor. Doctor passes the chat check when serving uses the file
training rendered with, and fails naming both hashes when it uses another."""

from __future__ import annotations

import json
import random
import urllib.request

import pytest
from typer.testing import CliRunner

from specdraft.cli import app
from specdraft.data.template import template_fingerprint
from specdraft.serve.server import build_app, serve_in_thread
from tests.support.tiny_models import save_tiny_model
from tests.support.tiny_tokenizer import TEMPLATE, WORDS, tiny_chat_tokenizer

OTHER_TEMPLATE = TEMPLATE.replace("<|end|> ", "</s> ")  # another template, same tokens


def run(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """(base target dir, chats file, training template file, other template file)."""
    root = tmp_path_factory.mktemp("chat_template")
    target = save_tiny_model("llama", root / "target", num_layers=4, vocab_size=85)
    tiny_chat_tokenizer(template=None).save_pretrained(target)  # a base model
    rng = random.Random(0)
    words = lambda n: " ".join(rng.choice(WORDS) for _ in range(n))  # noqa: E731
    chat = lambda: [  # noqa: E731
        {"role": "user", "content": words(4)},
        {"role": "assistant", "content": words(10)},
    ]
    chats = root / "chats.jsonl"
    chats.write_text("".join(json.dumps({"messages": chat()}) + "\n" for _ in range(12)))
    template, other = root / "chat.jinja", root / "other.jinja"
    template.write_text(TEMPLATE + "\n")
    other.write_text(OTHER_TEMPLATE + "\n")
    return target, chats, template, other


@pytest.fixture(scope="module")
def drafter(world, tmp_path_factory):
    """The drafter trained on a store captured with the template file."""
    target, chats, template, _ = world
    root = tmp_path_factory.mktemp("pipeline")
    circle = run("capture", target, chats, root / "refused")
    assert circle.exit_code == 1 and "give one with --chat-template FILE" in circle.output, (
        circle.output
    )
    store = root / "store"
    captured = run("capture", target, chats, store, "--chat-template", template, "--max-length", 48)
    assert captured.exit_code == 0, captured.output
    index = json.loads((store / "index.json").read_text())
    assert index["chat_template"]["hash"] == template_fingerprint(template.read_text())
    trained = run(
        "train", store, root / "run", "--chat-template", template, "--steps", 2,
        "--batch-size", 4, "--ttt-steps", 2, "--draft-vocab-size", 64,
    )  # fmt: skip
    assert trained.exit_code == 0, trained.output
    return root / "run" / "draft"


def test_served_with_the_training_template_doctor_passes(world, drafter):
    target, chats, template, _ = world
    manifest = json.loads((drafter / "specdraft_manifest.json").read_text())
    assert manifest["chat_template"]["hash"] == template_fingerprint(template.read_text())
    app_ = build_app(str(target), str(drafter), None, max_seq_len=128, chat_template=str(template))
    with serve_in_thread(app_) as server:
        body = {"model": "target", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
        request = urllib.request.Request(
            server.url + "/v1/chat/completions",
            json.dumps(body).encode(),
            {"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request) as response:
            assert response.status == 200  # the base model serves chats through the file
    result = run(
        "doctor", drafter, "--target", target, "--engine", "vllm",
        "--chat-template", template, "--samples", chats, "--json",
    )  # fmt: skip
    findings = {f["check"]: f for f in json.loads(result.stdout)["findings"]}
    chat = findings["chat_template_matches_manifest"]
    assert chat["verdict"] == "pass", chat
    assert "chats render identically" in chat["evidence"]
    launch = f"vllm serve {target} --chat-template {template}"
    by_launch = run("doctor", drafter, "--target", target, "--engine-args", launch, "--json")
    verdicts = {f["check"]: f["verdict"] for f in json.loads(by_launch.output)["findings"]}
    assert verdicts["chat_template_matches_manifest"] == "pass"


def test_served_with_another_template_doctor_fails_naming_both_hashes(world, drafter):
    target, chats, template, other = world
    result = run(
        "doctor", drafter, "--target", target, "--engine", "vllm",
        "--chat-template", other, "--samples", chats, "--json",
    )  # fmt: skip
    assert result.exit_code == 1, result.output
    findings = {f["check"]: f for f in json.loads(result.stdout)["findings"]}
    chat = findings["chat_template_matches_manifest"]
    served = template_fingerprint(other.read_text())[:12]
    trained = template_fingerprint(template.read_text())[:12]
    assert chat["verdict"] == "fail"
    assert (
        chat["evidence"]
        == f"chat template hash {served} (serving: {other}) vs {trained} (training)"
    )
    plain = run("doctor", drafter, "--target", target, "--engine", "vllm", "--json")
    chat = {f["check"]: f for f in json.loads(plain.output)["findings"]}[
        "chat_template_matches_manifest"
    ]
    assert chat["verdict"] == "fail"
    assert chat["evidence"].startswith(
        "chat template hash none (serving: the target's tokenizer has none) vs "
    )
