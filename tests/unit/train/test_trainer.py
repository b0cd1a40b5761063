"""specdraft.train.trainer: `train` on a GPT-OSS target with GPT-OSS's own yarn rope works out of
the box (issue #34 item 12: the drafter inherited the yarn scaling and refused it); the drafter
keeps the target's rope, and the export writes it for the engines. A batch with no supervised
position names its cause: no label, or a draft vocabulary too small (item 16)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from specdraft.cli import app
from specdraft.train.config import TrainConfig
from specdraft.train.errors import TrainingError
from specdraft.train.loop import train
from specdraft.train.store_data import StoreData
from tests.support.tiny_models import GPT_OSS_ROPE, save_tiny_model
from tests.support.tiny_tokenizer import CHAT, tiny_chat_tokenizer


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


def test_no_supervised_position_names_the_draft_vocabulary_when_it_is_the_cause(
    store, tmp_path, monkeypatch
):
    """The target's argmax made token 127 everywhere: never in a draft vocabulary of the store's
    40 most frequent labels (its answers repeat tokens 1..39)."""
    store_batch = StoreData.batch

    def argmax_outside(self, sample_ids, max_length, device):
        batch = store_batch(self, sample_ids, max_length, device)
        batch.target_logits.zero_()[..., 127] = 1.0
        return batch

    monkeypatch.setattr(StoreData, "batch", argmax_outside)
    config = TrainConfig(batch_size=4, total_steps=1, val_fraction=0.0, draft_vocab_size=40)
    with pytest.raises(TrainingError) as e:
        train(config, store, tmp_path / "run", progress=False)
    message = str(e.value)
    assert "labelled positions the target's argmax is outside the draft vocabulary" in message
    assert (
        "(--draft-vocab-size 40, the most frequent labels); pass a larger --draft-vocab-size"
        in (message)
    )
    assert "chat template" not in message
