"""specdraft.train.trainer: `train` on a GPT-OSS target with GPT-OSS's own yarn rope works out of
the box (issue #34 item 12: the drafter inherited the yarn scaling and refused it); the drafter
keeps the target's rope, and the export writes it for the engines."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from specdraft.cli import app
from tests.tiny_models import GPT_OSS_ROPE, save_tiny_model
from tests.tiny_tokenizer import CHAT, tiny_chat_tokenizer


def run(*args):
    return CliRunner().invoke(app, [str(a) for a in args], env={"COLUMNS": "400"})


def test_train_on_a_gpt_oss_target_keeps_its_yarn_rope(tmp_path):
    target = save_tiny_model(
        "gpt_oss",
        tmp_path / "target",
        num_layers=4,
        vocab_size=96,
        rope_parameters=GPT_OSS_ROPE,
        max_position_embeddings=131072,
    )
    tiny_chat_tokenizer().save_pretrained(target)
    chats = tmp_path / "chats.jsonl"
    chats.write_text("".join(json.dumps({"messages": c}) + "\n" for c in [CHAT, CHAT[:3]] * 2))
    captured = run("capture", target, chats, tmp_path / "store", "--aux-layers", "1,2,3")
    assert captured.exit_code == 0, captured.output
    trained = run(
        "train", tmp_path / "store", tmp_path / "run", "--steps", "2", "--batch-size", "2"
    )
    assert trained.exit_code == 0, trained.output
    exported = run("export", tmp_path / "run" / "draft", tmp_path / "out", "--engine", "vllm")
    assert exported.exit_code == 0, exported.output
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    scaling = {k: v for k, v in GPT_OSS_ROPE.items() if k != "rope_theta"}
    assert (config["rope_theta"], config["rope_scaling"]) == (150000.0, scaling)
