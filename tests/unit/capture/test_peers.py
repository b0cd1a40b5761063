"""specdraft.capture.peers / convert: speculators' and SpecForge's hidden-state stores, written
and read back tensor for tensor; strict refusals naming the file and the field."""

from __future__ import annotations

import gzip
import io
import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from specdraft.capture.convert import PeerInputs, convert_store, rms_norm
from specdraft.capture.peers import read_specforge, read_speculators
from specdraft.capture.recorded import RECORD_DIR
from specdraft.capture.stage import CaptureConfig, capture_dataset
from specdraft.capture.store import AFTER_NORM, CaptureError, CaptureStore
from specdraft.train.store_data import StoreData
from tests.support.tiny_tokenizer import CHAT

CHATS = [CHAT, CHAT[:3], CHAT[1:3], CHAT[3:]]
FIELDS = ("input_ids", "loss_mask", "aux_hidden", "last_hidden")


def make_store(target_dir, tmp_path, dtype: str):
    data = tmp_path / "chats.jsonl"
    data.write_text("".join(json.dumps({"messages": c}) + "\n" for c in CHATS))
    out = tmp_path / f"store-{dtype}"
    capture_dataset(
        CaptureConfig(
            str(target_dir), str(data), str(out), dtype=dtype, shard_tokens=40, max_length=30
        )
    )
    return out


@pytest.fixture(scope="module")
def bf16_store(chat_target_dir, tmp_path_factory):
    return make_store(chat_target_dir, tmp_path_factory.mktemp("bf16"), "bfloat16")


@pytest.fixture(scope="module")
def fp32_store(chat_target_dir, tmp_path_factory):
    return make_store(chat_target_dir, tmp_path_factory.mktemp("fp32"), "float32")


def rows(path):
    store = CaptureStore(path)
    return [store[i] for i in range(len(store))]


def test_specdraft_to_speculators_and_back_is_exact(bf16_store, chat_target_dir, tmp_path):
    convert_store(bf16_store, tmp_path / "spec", "speculators")
    hs = load_file(str(tmp_path / "spec" / "hidden_states" / "hs_0.safetensors"))
    first = CaptureStore(bf16_store)[0]
    T = first["input_ids"].numel()
    assert sorted(hs) == ["hidden_states", "token_ids"] and hs["token_ids"].dtype == torch.int64
    assert hs["hidden_states"].shape == (T, 4, 32)  # 3 aux slots then the last layer, stacked
    assert torch.equal(hs["hidden_states"][:, 1], first["aux_hidden"][:, 32:64])
    assert torch.equal(hs["hidden_states"][:, 3], first["last_hidden"])
    result = convert_store(
        tmp_path / "spec",
        tmp_path / "back",
        "specdraft",
        PeerInputs(target=str(chat_target_dir), aux_layers=(1, 2, 3)),
    )  # vLLM ids on a Llama: specdraft indices as they are
    assert result.num_samples == len(CHATS) and result.aux_layers == (1, 2, 3)
    for a, b in zip(rows(bf16_store), rows(tmp_path / "back"), strict=True):
        for name in FIELDS:
            assert a[name].dtype == b[name].dtype and torch.equal(a[name], b[name]), name
    old, new = CaptureStore(bf16_store), CaptureStore(tmp_path / "back")
    for key in ("aux_layers", "dtype", "data_hash", "num_tokens", "tokenizer", "tensors"):
        assert old.meta[key] == new.meta[key], key
    assert old.meta["target"]["config_hash"] == new.meta["target"]["config_hash"]
    assert all(torch.equal(old.target_head()[k], v) for k, v in new.target_head().items())
    new.verify()


def test_specdraft_to_specforge_norms_the_last_state_and_back_trains_the_same(
    fp32_store, chat_target_dir, tmp_path
):
    """SpecForge holds the last state after the final norm: to SpecForge it is normed; a store
    SpecForge made (no specdraft record beside it) comes back in specdraft with the index saying
    so, and the target logits training computes are the same."""
    convert_store(fp32_store, tmp_path / "sf", "specforge", compress=True)
    files = sorted((tmp_path / "sf").rglob("*"))
    assert [p.name for p in files if p.is_file()][:2] == ["data_0.ckpt.gz", "data_1.ckpt.gz"]
    assert files[0].name == "rows_0-2000"
    raw = torch.load(io.BytesIO(gzip.decompress(files[1].read_bytes())), weights_only=True)
    first = CaptureStore(fp32_store)[0]
    T = first["input_ids"].numel()
    assert sorted(raw) == ["aux_hidden_state", "hidden_state", "input_ids", "loss_mask"]
    assert raw["aux_hidden_state"].shape == (1, T, 96) and raw["hidden_state"].shape == (1, T, 32)
    norm = CaptureStore(fp32_store).target_head()["norm.weight"]
    eps = json.loads((chat_target_dir / "config.json").read_text())["rms_norm_eps"]
    assert torch.equal(raw["hidden_state"][0], rms_norm(first["last_hidden"], norm, eps))
    shutil.rmtree(tmp_path / "sf" / RECORD_DIR)
    convert_store(
        tmp_path / "sf",
        tmp_path / "back",
        "specdraft",
        PeerInputs(target=str(chat_target_dir), aux_layers=(0, 1, 2)),
    )  # SGLang ids: index - 1 on a Llama
    back = CaptureStore(tmp_path / "back")
    assert back.meta["last_hidden"] == AFTER_NORM and back.aux_layers == [1, 2, 3]
    for a, b in zip(rows(fp32_store), rows(tmp_path / "back"), strict=True):
        for name in FIELDS[:3]:
            assert torch.equal(a[name], b[name]), name
        assert torch.equal(b["last_hidden"], rms_norm(a["last_hidden"], norm, eps))
    ids = list(range(len(CHATS)))
    before = StoreData(fp32_store, str(chat_target_dir)).batch(ids, 64, torch.device("cpu"))
    after = StoreData(tmp_path / "back", str(chat_target_dir)).batch(ids, 64, torch.device("cpu"))
    torch.testing.assert_close(after.target_logits, before.target_logits, rtol=1e-6, atol=1e-6)
    convert_store(tmp_path / "back", tmp_path / "sf2", "specforge")  # already normed: kept as is
    for a, b in zip(read_specforge(tmp_path / "sf"), read_specforge(tmp_path / "sf2"), strict=True):
        assert all(torch.equal(a[k], b[k]) for k in FIELDS)


def test_speculators_store_rows_are_torch_tensors_as_speculators_reads_them(bf16_store, tmp_path):
    """speculators 0.9.0's trainer compares each row's input_ids with its hs file's token_ids by
    torch.equal (train/data.py): a row read as a list fails there, so the saved format is torch."""
    from datasets import load_from_disk

    convert_store(bf16_store, tmp_path / "spec", "speculators")
    row = load_from_disk(str(tmp_path / "spec"))[0]
    hs = load_file(str(tmp_path / "spec" / "hidden_states" / "hs_0.safetensors"))
    assert isinstance(row["input_ids"], torch.Tensor) and isinstance(row["loss_mask"], torch.Tensor)
    assert torch.equal(hs["token_ids"], row["input_ids"])


def test_specforge_store_cannot_become_speculators(fp32_store, tmp_path):
    convert_store(fp32_store, tmp_path / "sf", "specforge")
    with pytest.raises(CaptureError, match="after the final norm"):
        convert_store(tmp_path / "sf", tmp_path / "spec", "speculators")
    assert not (tmp_path / "spec").exists()


def test_peer_files_with_a_missing_or_extra_field_are_refused_by_name(bf16_store, tmp_path):
    convert_store(bf16_store, tmp_path / "spec", "speculators")
    hs_path = tmp_path / "spec" / "hidden_states" / "hs_2.safetensors"
    save_file({**load_file(str(hs_path)), "logits": torch.zeros(2)}, str(hs_path))
    with pytest.raises(
        CaptureError,
        match=r"hs_2\.safetensors: not a speculators hidden-state file "
        r"\(extra logits;",
    ):
        list(read_speculators(tmp_path / "spec"))
    convert_store(bf16_store, tmp_path / "sf", "specforge")
    ckpt = next((tmp_path / "sf").rglob("data_1.ckpt"))
    data = torch.load(ckpt, weights_only=True)
    del data["loss_mask"]
    torch.save(data, ckpt)
    with pytest.raises(
        CaptureError, match=r"data_1\.ckpt: not a SpecForge hidden-state file \(missing loss_mask;"
    ):
        list(read_specforge(tmp_path / "sf"))
    data["loss_mask"] = torch.ones(3, dtype=torch.long)
    torch.save(data, ckpt)
    with pytest.raises(
        CaptureError, match=r"data_1\.ckpt: field loss_mask has shape \[3\], expected \[\d+\]"
    ):
        list(read_specforge(tmp_path / "sf"))
    ckpt.write_bytes(ckpt.read_bytes()[:100])
    with pytest.raises(CaptureError, match=r"data_1\.ckpt: unreadable torch.save file"):
        list(read_specforge(tmp_path / "sf"))


def test_a_peer_store_without_target_or_aux_layers_is_refused_naming_the_option(
    bf16_store, chat_target_dir, tmp_path
):
    convert_store(bf16_store, tmp_path / "spec", "speculators")
    shutil.rmtree(tmp_path / "spec" / RECORD_DIR)  # as speculators writes it
    with pytest.raises(CaptureError, match="--target DIR is required"):
        convert_store(
            tmp_path / "spec", tmp_path / "a", "specdraft", PeerInputs(aux_layers=(1, 2, 3))
        )
    with pytest.raises(CaptureError, match="--aux-layers is required"):
        convert_store(
            tmp_path / "spec", tmp_path / "a", "specdraft", PeerInputs(target=str(chat_target_dir))
        )
    with pytest.raises(CaptureError, match="2 layers, but the store holds 3"):
        convert_store(
            tmp_path / "spec",
            tmp_path / "a",
            "specdraft",
            PeerInputs(target=str(chat_target_dir), aux_layers=(1, 2)),
        )
    assert not (tmp_path / "a").exists()


def test_speculators_to_specforge_norms_with_the_targets_weights(
    bf16_store, chat_target_dir, tmp_path
):
    convert_store(bf16_store, tmp_path / "spec", "speculators")
    with pytest.raises(CaptureError, match="--target DIR is required"):
        convert_store(tmp_path / "spec", tmp_path / "a", "specforge")
    convert_store(
        tmp_path / "spec", tmp_path / "a", "specforge", PeerInputs(target=str(chat_target_dir))
    )
    convert_store(bf16_store, tmp_path / "b", "specforge")
    for a, b in zip(read_specforge(tmp_path / "a"), read_specforge(tmp_path / "b"), strict=True):
        assert all(torch.equal(a[k], b[k]) for k in FIELDS)


def test_a_pickled_object_in_a_specforge_file_is_refused(tmp_path):
    (tmp_path / "rows_0-2000").mkdir()
    torch.save({"input_ids": object()}, tmp_path / "rows_0-2000" / "data_0.ckpt")
    with pytest.raises(
        CaptureError, match=r"data_0\.ckpt: holds objects torch.load\(weights_only=True\) refuses"
    ):
        list(read_specforge(tmp_path))


@pytest.mark.parametrize("peer", ["speculators", "specforge"])
def test_a_store_converted_to_a_peer_comes_back_the_same_store(bf16_store, tmp_path, peer):
    """The peer store keeps the specdraft index (aux layers, chat template, max_length, data) and,
    for SpecForge, the last states before the norm: back needs no --target / --aux-layers and
    gives the same index.json and the same tensors."""
    convert_store(bf16_store, tmp_path / "peer", peer)
    result = convert_store(tmp_path / "peer", tmp_path / "back", "specdraft")
    assert result.aux_layers == (1, 2, 3)
    old, new = CaptureStore(bf16_store), CaptureStore(tmp_path / "back")
    assert (
        new.meta == old.meta and new.meta["chat_template"]["chat"] and new.meta["max_length"] == 30
    )
    for a, b in zip(rows(bf16_store), rows(tmp_path / "back"), strict=True):
        for name in FIELDS:
            assert a[name].dtype == b[name].dtype and torch.equal(a[name], b[name]), name
    new.verify()


def test_a_recorded_store_refuses_other_layers_and_changed_samples(
    bf16_store, chat_target_dir, tmp_path
):
    convert_store(bf16_store, tmp_path / "sf", "specforge")
    with pytest.raises(
        CaptureError,
        match=r"--aux-layers 2,3,4 reads as specdraft indices \[2, 3, 4\], but .*"
        r"specdraft_store/index.json records \[1, 2, 3\]",
    ):
        convert_store(
            tmp_path / "sf",
            tmp_path / "a",
            "specdraft",
            PeerInputs(aux_layers=(2, 3, 4), convention="vllm"),
        )
    convert_store(
        tmp_path / "sf",
        tmp_path / "a",
        "specdraft",
        PeerInputs(aux_layers=(0, 1, 2), target=str(chat_target_dir)),
    )
    next((tmp_path / "sf").rglob(f"data_{len(CHATS) - 1}.ckpt")).unlink()
    with pytest.raises(CaptureError, match="its samples are not the ones .* records"):
        convert_store(tmp_path / "sf", tmp_path / "b", "specdraft")
    assert not (tmp_path / "b").exists()


def test_converting_to_speculators_prints_no_progress_bar_of_the_datasets_library(
    bf16_store, tmp_path, capsys
):
    """store convert's output is specdraft's own: datasets' "Saving the dataset" bar stays off
    (and its setting is as before after the write)."""
    from datasets.utils import are_progress_bars_disabled

    before = are_progress_bars_disabled()
    convert_store(bf16_store, tmp_path / "spec", "speculators")
    captured = capsys.readouterr()
    assert "Saving the dataset" not in captured.err + captured.out
    assert are_progress_bars_disabled() == before
