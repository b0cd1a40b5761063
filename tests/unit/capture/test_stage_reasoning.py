"""`capture --reasoning` / `train --online --reasoning`: records whose reasoning the target's
template cannot render are one line naming the record and --reasoning drop; with drop they are
captured without it, and the store / manifest records the mode."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from specdraft.capture.store import CaptureStore
from specdraft.cli import app
from tests.support.cli import cli_args, train_online

CHATS = [
    [
        {"role": "user", "content": "hello , how are you ?"},
        {"role": "assistant", "content": "i am fine .", "reasoning_content": "be good ."},
    ],
    [
        {"role": "user", "content": "what is the capital of france ?"},
        {"role": "assistant", "content": "<think> it is paris . </think> paris ."},
    ],
]


def test_cli_reasoning_the_template_cannot_render_then_drop(chat_target_dir, tmp_path):
    data = tmp_path / "r.jsonl"
    data.write_text("".join(json.dumps({"messages": c}) + "\n" for c in CHATS))
    keep = CliRunner().invoke(
        app, ["capture", str(chat_target_dir), str(data), str(tmp_path / "a")]
    )
    assert keep.exit_code == 1
    assert len(keep.output.strip().splitlines()) == 1, keep.output
    assert f"{data}:1: the chat template does not render the reasoning of message 1" in keep.output
    assert "--reasoning drop" in keep.output
    drop = CliRunner().invoke(
        app,
        cli_args("capture", chat_target_dir, data, tmp_path / "b", reasoning="drop", dtype="fp32"),
    )
    assert drop.exit_code == 0, drop.output
    store = CaptureStore(tmp_path / "b")
    assert store.meta["chat_template"]["reasoning"] == "drop" and len(store) == 2
    offline = CliRunner().invoke(
        app, ["train", str(tmp_path / "b"), str(tmp_path / "run"), "--reasoning", "drop"]
    )
    assert (
        offline.exit_code == 2 and "--reasoning apply with --online only" in offline.output
    )  # a usage error


def test_cli_train_online_reasoning_drop_is_recorded(chat_target_dir, tmp_path):
    data = tmp_path / "r.jsonl"
    data.write_text("".join(json.dumps({"messages": c}) + "\n" for c in CHATS * 4))
    sizes = dict(steps=1, batch_size=2, ttt_steps=2, draft_vocab_size=32)
    keep = train_online(data, tmp_path, chat_target_dir, **sizes)
    assert keep.exit_code == 1 and "--reasoning drop" in keep.output and f"{data}:1:" in keep.output
    drop = train_online(data, tmp_path, chat_target_dir, **sizes, reasoning="drop")
    assert drop.exit_code == 0, drop.output
    manifest = json.loads((tmp_path / "run" / "draft" / "specdraft_manifest.json").read_text())
    assert manifest["chat_template"]["reasoning"] == "drop"
