"""specdraft.capture: the sharded store against a direct target forward, resume, checksums, CLI."""

from __future__ import annotations

import io
import json
import shutil

import pytest
import torch
from rich.console import Console
from typer.testing import CliRunner

from specdraft.capture.forward import shard_plan
from specdraft.capture.stage import CaptureConfig, capture_dataset
from specdraft.capture.store import CaptureError, CaptureStore, StoreSettings, estimate_disk
from specdraft.capture.write import write_store
from specdraft.cli import app
from specdraft.data.render import (
    Sample,
    data_hash,
    load_dataset,
    template_hash,
    tokenizer_fingerprint,
)
from specdraft.targets import load_target
from tests.support.cli import cli_args
from tests.support.tiny_models import save_tiny_model
from tests.support.tiny_tokenizer import CHAT, save_tiny_tokenizer, tiny_chat_tokenizer

CHATS = [
    CHAT,
    CHAT[:3],
    CHAT[1:3],
    [CHAT[1], {"role": "assistant", "content": "no ."}],
    CHAT[3:],
    CHAT,
]


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "chats.jsonl"
    path.write_text("".join(json.dumps({"messages": c}) + "\n" for c in CHATS))
    return path


def config(chat_target_dir, data_file, out_dir, **kw) -> CaptureConfig:
    kw = {"shard_tokens": 50, "batch_tokens": 48, "max_length": 30, **kw}
    return CaptureConfig(str(chat_target_dir), str(data_file), str(out_dir), **kw)


def store_files(path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.iterdir())}


def test_store_round_trip_matches_direct_forward(chat_target_dir, data_file, tmp_path):
    result = capture_dataset(config(chat_target_dir, data_file, tmp_path / "store"))
    store = CaptureStore(tmp_path / "store")
    target = load_target(chat_target_dir)
    samples = [s.truncated(30) for s in load_dataset(data_file, tiny_chat_tokenizer()).samples]
    lengths = [len(s.input_ids) for s in samples]
    assert len(store) == len(CHATS) == result.num_samples and max(lengths) == 30
    assert result.num_shards == len(shard_plan(lengths, 50)) == 4 and store.lengths() == lengths
    assert shard_plan(lengths, 50) == [(0, 1), (1, 3), (3, 5), (5, 6)]
    assert shard_plan(lengths, 1000, shard_samples=4) == [(0, 4), (4, 6)]
    assert shard_plan([5, 100, 5], 10) == [(0, 1), (1, 2), (2, 3)]
    for i, s in enumerate(samples):
        item = store[i]
        ref = target.forward(torch.tensor([s.input_ids]), aux_layers=[1, 2, 3], return_logits=False)
        assert item["input_ids"].tolist() == s.input_ids and item["input_ids"].dtype == torch.long
        assert item["loss_mask"].tolist() == [bool(m) for m in s.loss_mask]
        assert item["aux_hidden"].dtype == torch.bfloat16 and item["aux_hidden"].shape == (
            len(s.input_ids),
            3 * 32,
        )
        for name in ("aux_hidden", "last_hidden"):  # equal up to one bf16 rounding
            torch.testing.assert_close(
                item[name].float(), getattr(ref, name)[0].float(), rtol=2**-7, atol=1e-6
            )
    head = store.target_head()
    assert torch.equal(head["lm_head.weight"], target.lm_head.weight)
    assert torch.equal(head["norm.weight"], target.final_norm.weight)
    assert torch.equal(head["embed_tokens.weight"], target.embed_tokens.weight)
    meta = store.meta
    assert meta["aux_layers"] == [1, 2, 3] and meta["data_hash"] == data_hash(samples)
    assert meta["tokenizer"] == tokenizer_fingerprint(tiny_chat_tokenizer())
    assert meta["chat_template"]["hash"] == template_hash(tiny_chat_tokenizer())
    assert meta["target"]["num_layers"] == 4 and meta["num_tokens"] == sum(store.lengths())
    store.verify()


def test_resume_after_crash_gives_identical_store(chat_target_dir, data_file, tmp_path):
    cfg = config(chat_target_dir, data_file, tmp_path / "a")
    capture_dataset(cfg)
    reference = store_files(tmp_path / "a")
    crashed = tmp_path / "b"
    shutil.copytree(tmp_path / "a", crashed)
    index = json.loads((crashed / "index.json").read_text())
    index["shards"], index["complete"] = index["shards"][:2], False  # shard 2 never listed
    (crashed / "index.json").write_text(json.dumps(index))
    (crashed / "shard-00002.safetensors.tmp").write_bytes(
        b"partial"
    )  # an older specdraft's temp name
    (crashed / ".shard-00002.safetensors.tmp-4242").write_bytes(
        b"partial"
    )  # files.temp_path of a killed run
    (crashed / "shard-00002.safetensors").unlink()
    (crashed / "shard-00000.safetensors").unlink()  # a listed shard lost too
    with pytest.raises(CaptureError, match="unfinished store"):
        CaptureStore(crashed)
    result = capture_dataset(config(chat_target_dir, data_file, crashed))
    assert result.num_reused == 1
    assert store_files(crashed) == reference


def test_corrupt_shard_is_named_with_the_fix(chat_target_dir, data_file, tmp_path):
    capture_dataset(config(chat_target_dir, data_file, tmp_path / "s"))
    shard = tmp_path / "s" / "shard-00001.safetensors"
    data = bytearray(shard.read_bytes())
    data[-3] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(CaptureError) as err:
        CaptureStore(tmp_path / "s").verify()
    message = str(err.value)
    assert "shard-00001.safetensors" in message and "delete it and re-run capture" in message
    assert "\n" not in message
    assert capture_dataset(config(chat_target_dir, data_file, tmp_path / "s")).num_reused == 3
    CaptureStore(tmp_path / "s").verify()


def test_other_settings_are_refused(chat_target_dir, data_file, tmp_path):
    capture_dataset(config(chat_target_dir, data_file, tmp_path / "s"))
    with pytest.raises(CaptureError, match="aux_layers.*new output directory"):
        capture_dataset(config(chat_target_dir, data_file, tmp_path / "s", aux_layers=(0, 2, 4)))
    other = save_tiny_model("llama", tmp_path / "other", seed=1, num_layers=4)  # same config
    save_tiny_tokenizer(other)
    with pytest.raises(CaptureError, match="weights differ"):
        capture_dataset(config(other, data_file, tmp_path / "s"))


@pytest.mark.parametrize("width", [80, 100])
def test_disk_estimate_is_printed_first(chat_target_dir, tmp_path, width):
    """Two lines, the total, then how it adds up, whole at a 80- or 100-column terminal (one line
    broke inside its formula at 100 columns)."""
    target = load_target(chat_target_dir)
    samples = [Sample([1, 5, 6, 7], [0, 0, 1, 1]), Sample([1, 8, 9], [0, 1, 1])]
    settings = StoreSettings((1, 2, 3), torch.bfloat16, shard_tokens=4)
    buf = io.StringIO()
    write_store(target, samples, tmp_path / "s", settings, console=Console(file=buf, width=width))
    head = 2 * 128 * 32 * 4 + 32 * 4
    expected = estimate_disk(7, 32, 3, torch.bfloat16, head)
    assert expected == 7 * (5 + 4 * 32 * 2) + head
    first, second = buf.getvalue().splitlines()[:2]
    assert (
        first == f"capture: 2 samples, 7 tokens, 2 shards; estimated disk {expected / 1024:.1f} KiB"
    )
    assert second == (
        f"  = 7 tokens x {5 + 4 * 32 * 2} B (ids 4 + mask 1 + 4·32·2) + target head "
        f"{head / 1024:.1f} KiB"
    )
    shard_bytes = sum(p.stat().st_size for p in (tmp_path / "s").glob("shard-*"))
    assert 7 * (5 + 4 * 32 * 2) < shard_bytes < 7 * (5 + 4 * 32 * 2) + 2 * 1024  # headers only


def test_cli_capture(chat_target_dir, data_file, tmp_path):
    out = tmp_path / "cli"
    layout = dict(aux_layers="0,2,4", dtype="fp32", max_length=24, shard_tokens=40)
    thinking = '{"enable_thinking": true}'
    args = cli_args("capture", chat_target_dir, data_file, out, **layout, template_kwargs=thinking)
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "estimated disk" in result.output
    store = CaptureStore(out)
    assert store.meta["aux_layers"] == [0, 2, 4] and store.meta["dtype"] == "float32"
    assert store.meta["chat_template"]["kwargs"] == {"enable_thinking": True}
    assert store[0]["aux_hidden"].dtype == torch.float32 and max(store.lengths()) == 24
