"""capture --engine vllm without vLLM, and what the vLLM path computes before vLLM starts."""

from __future__ import annotations

import builtins
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from specdraft.capture import vllm as vllm_capture
from specdraft.capture.forward import target_head_tensors, target_meta
from specdraft.capture.store import CaptureError, CaptureStore
from specdraft.capture.vllm import (
    HeadTarget,
    VllmCapture,
    VllmOptions,
    capture_lengths,
    request_ids,
)
from specdraft.conventions import ConventionError
from specdraft.targets import load_target
from tests.support.capture import capture, one_line_error, run
from tests.support.fake_vllm import FakeVllmCapture


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


@pytest.mark.parametrize(
    "max_length,given,positions,expected",
    [
        (2048, None, 2048, (2047, 2048)),  # pycode-25m with the defaults
        (2048, None, 4096, (2048, 2049)),
        (2048, None, None, (2048, 2049)),  # positions unknown: no clamp
        (2048, 100, 2048, (2048, 100)),  # given: kept (too long samples are refused by name)
        (30, 2048, 2048, (30, 2048)),
    ],
)
def test_capture_lengths_default_within_the_targets_positions(
    max_length, given, positions, expected
):
    assert capture_lengths(max_length, given, positions) == expected


def test_a_max_model_len_past_the_targets_positions_names_both_options(chat_target_dir):
    head = HeadTarget(chat_target_dir)  # 256 positions
    default = VllmCapture(chat_target_dir, head, (1, 2, 3), torch.float32, VllmOptions(), 2048)
    assert (default.max_length, default.engine_kwargs(Path("f"))["max_model_len"]) == (255, 256)
    with pytest.raises(CaptureError, match="--max-model-len 300 is past the target's 256") as e:
        VllmCapture(
            chat_target_dir, head, (1, 2, 3), torch.float32, VllmOptions(max_model_len=300), 2048
        )
    assert "--max-length" in str(e.value)


def test_vllms_length_refusal_names_the_options_not_the_fallback(
    chat_target_dir, tmp_path, monkeypatch
):
    """vLLM's own refusal of the request length (after its start-up) points at the two options,
    not at --engine transformers."""

    class RefusingLLM:
        def __init__(self, **kwargs):
            raise ValueError(
                "User-specified max_model_len (2049) is greater than the derived max_model_len "
                "(max_position_embeddings=2048 or model_max_length=None in model's config.json)."
            )

    monkeypatch.setattr(vllm_capture, "import_vllm", lambda: SimpleNamespace(LLM=RefusingLLM))
    engine = VllmCapture(
        chat_target_dir, HeadTarget(chat_target_dir), (1, 2, 3), torch.float32, VllmOptions(), 32
    )
    with pytest.raises(CaptureError) as e:
        engine.start(tmp_path / "store")
    assert str(e.value).endswith(vllm_capture.LENGTH_FIX) and "--engine transformers" not in str(
        e.value
    )


def test_capture_with_the_default_lengths_runs_on_a_target_of_fewer_positions(
    chat_target_dir, tmp_path, monkeypatch
):
    """capture --engine vllm with no length option on a 256-position target (default --max-length
    2048): samples cut to 255 tokens, the store records it, a note says so (vLLM stood in for)."""
    fake = FakeVllmCapture(hidden_size=32)
    monkeypatch.setattr(vllm_capture, "import_vllm", lambda: None)
    monkeypatch.setattr(VllmCapture, "start", lambda self, work_dir: self)
    monkeypatch.setattr(VllmCapture, "close", lambda self: None)
    monkeypatch.setattr(
        VllmCapture, "capture_shard", lambda self, *a, **k: fake.capture_shard(*a, **k)
    )
    data = tmp_path / "docs.txt"
    data.write_text(" ".join(["hello how are you"] * 100) + "\n")
    result = run(
        "capture", chat_target_dir, data, tmp_path / "store", "--engine", "vllm", "--no-chat"
    )
    assert result.exit_code == 0, result.output
    assert "--max-model-len 256, samples truncated to 255 tokens" in result.output
    store = CaptureStore(tmp_path / "store")
    assert store.meta["max_length"] == 255 and len(store[0]["input_ids"]) == 255
