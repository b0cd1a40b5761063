"""capture --engine vllm without vLLM, and what the vLLM path computes before vLLM starts."""

from __future__ import annotations

import builtins
import json
from pathlib import Path

import pytest
import torch

from specdraft.capture.forward import target_head_tensors, target_meta
from specdraft.capture.vllm import HeadTarget, VllmCapture, VllmOptions, request_ids
from specdraft.conventions import ConventionError
from specdraft.targets import load_target
from tests.support.capture import capture, one_line_error


@pytest.fixture
def no_vllm(monkeypatch):
    """`import vllm` fails, as where vLLM is not installed (also where it is)."""
    real_import = builtins.__import__

    def fake_import(name, *args, **kwargs):
        if name == "vllm" or name.startswith("vllm."):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake_import)


def test_engine_vllm_without_vllm_is_one_line_naming_the_package(
    chat_target_dir, tmp_path, no_vllm
):
    data = tmp_path / "chats.jsonl"
    data.write_text(
        json.dumps(
            {
                "messages": [
                    {"role": "user", "content": "hi"},
                    {"role": "assistant", "content": "yo"},
                ]
            }
        )
        + "\n"
    )
    result = capture(chat_target_dir, data, tmp_path / "store", "--engine", "vllm")
    one_line_error(result, "vLLM is not installed", "pip install vllm", "--engine transformers")
    assert not (tmp_path / "store").exists()


def test_head_target_records_what_the_loaded_target_records(chat_target_dir):
    """The store's target record and head weights without building the network."""
    head, target = HeadTarget(chat_target_dir), load_target(chat_target_dir)
    assert target_meta(head, "x") == target_meta(target, "x")
    ours, theirs = target_head_tensors(head), target_head_tensors(target)
    assert ours.keys() == theirs.keys()
    for name in ours:
        assert torch.equal(ours[name], theirs[name]), name


def test_request_ids_add_the_last_layer_once():
    assert request_ids([2, 4, 5], 8, "llama") == ([2, 4, 5, 8], [0, 1, 2], 3)
    assert request_ids([0, 4, 8], 8, "llama") == ([0, 4, 8], [0, 1, 2], 2)
    assert request_ids([1, 2, 3], 4, "deepseek") == ([1, 2, 3, 4], [0, 1, 2], 3)
    with pytest.raises(ConventionError, match="embeddings"):
        request_ids([0, 2, 3], 4, "deepseek")


def test_vllm_options_with_the_transformers_engine_are_one_line(chat_target_dir, tmp_path):
    """--tensor-parallel-size / --data-parallel-size / ... run nothing without --engine vllm."""
    data = tmp_path / "texts.jsonl"
    data.write_text(json.dumps({"text": "hello there"}) + "\n")
    result = capture(
        chat_target_dir,
        data,
        tmp_path / "store",
        "--tensor-parallel-size",
        2,
        "--data-parallel-size",
        2,
        "--enforce-eager",
    )
    line = one_line_error(
        result,
        "--tensor-parallel-size, --data-parallel-size, --enforce-eager: vLLM engine "
        "options; capture with --engine vllm, or leave them out with --engine transformers",
    )
    assert "--max-model-len" not in line and not (tmp_path / "store").exists()
    result = capture(chat_target_dir, data, tmp_path / "store", "--max-model-len", 64)
    one_line_error(
        result, "--max-model-len: a vLLM engine option; capture with --engine vllm, or leave it out"
    )
    result = capture(chat_target_dir, data, tmp_path / "store", "--attention-backend", "CPU_MLA")
    one_line_error(result, "--attention-backend: a vLLM engine option; capture with --engine vllm")


def test_engine_arguments_name_the_attention_backend_only_when_given(chat_target_dir):
    """--attention-backend reaches vllm.LLM under vLLM's EngineArgs name; absent, vLLM chooses."""
    head = HeadTarget(chat_target_dir)
    chosen = VllmCapture(
        chat_target_dir,
        head,
        (1, 2, 3),
        torch.float32,
        VllmOptions(attention_backend="CPU_MLA"),
        max_length=32,
    ).engine_kwargs(Path("files"))
    assert chosen["attention_backend"] == "CPU_MLA"
    default = VllmCapture(
        chat_target_dir, head, (1, 2, 3), torch.float32, VllmOptions(), max_length=32
    )
    assert "attention_backend" not in default.engine_kwargs(Path("files"))
