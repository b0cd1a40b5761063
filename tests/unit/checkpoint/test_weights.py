"""The one reader of drafter weight files: every format the field ships, read bit-exactly by the
loader, inspect, convert, export and doctor alike; damaged files are one line naming the file."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from specdraft.checkpoint import (
    CheckpointError,
    convert_draft,
    load_draft,
    save_draft,
    state_dict_for_layout,
)
from specdraft.cli import app
from specdraft.doctor import run_doctor
from tests.support.drafts import tiny_draft


def sglang_dir(tmp_path, name="d", layout="sglang"):
    """(directory, model): a tiny drafter saved without a manifest, and the model saved."""
    model = tiny_draft(dtype=torch.bfloat16)
    save_draft(model, tmp_path / name, layout=layout, verifier="target")
    return tmp_path / name, model


def reshape_weights(directory, fmt: str) -> dict:
    """Rewrite directory/model.safetensors as `fmt` ("bin", "sharded-safetensors", "sharded-bin");
    returns the tensors as written."""
    file = directory / "model.safetensors"
    tensors = load_file(str(file))
    file.unlink()
    if fmt == "bin":
        torch.save(tensors, directory / "pytorch_model.bin")
        return tensors
    names = sorted(tensors)
    halves = {"a": names[: len(names) // 2], "b": names[len(names) // 2 :]}
    ext, index = (
        ("bin", "pytorch_model.bin.index.json")
        if fmt == "sharded-bin"
        else ("safetensors", "model.safetensors.index.json")
    )
    weight_map = {}
    for part, keys in halves.items():
        shard = f"model-0000{'1' if part == 'a' else '2'}-of-00002.{ext}"
        chunk = {k: tensors[k] for k in keys}
        torch.save(chunk, directory / shard) if ext == "bin" else save_file(
            chunk, str(directory / shard)
        )
        weight_map.update(dict.fromkeys(keys, shard))
    (directory / index).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return tensors


@pytest.mark.parametrize("fmt", ["bin", "sharded-safetensors", "sharded-bin"])
@pytest.mark.parametrize("layout", ["sglang", "speculators"])
def test_every_weights_format_loads_bit_exactly(tmp_path, fmt, layout):
    directory, model = sglang_dir(tmp_path, layout=layout)
    reshape_weights(directory, fmt)
    loaded = load_draft(directory, target_num_layers=5).model
    for name, tensor in state_dict_for_layout(model, "sglang").items():
        have = state_dict_for_layout(loaded, "sglang")[name]
        assert have.dtype == tensor.dtype and torch.equal(have, tensor), name
    assert (
        convert_draft(directory, tmp_path / "out", layout="sglang", target_num_layers=5).num_copied
        == 15
    )
    assert set(load_file(str(tmp_path / "out" / "model.safetensors"))) == set(
        state_dict_for_layout(model, "sglang")
    )


def test_inspect_and_doctor_read_a_pytorch_bin(tmp_path):
    directory, _ = sglang_dir(tmp_path)
    reshape_weights(directory, "bin")
    result = CliRunner().invoke(
        app, ["inspect", str(directory), "--target", str(make_target(tmp_path))]
    )
    assert result.exit_code == 0, result.output
    assert "audit: PASS" in result.output
    report = run_doctor(directory, engine="vllm")
    assert report.finding("specdraft_loads").verdict == "pass"
    assert "pytorch_model.bin" in report.finding("specdraft_loads").evidence
    assert report.finding("keys_match_engine").verdict == "pass"


def make_target(tmp_path):
    from tests.support.tiny_models import save_tiny_model

    return save_tiny_model("llama", tmp_path / "target", num_layers=5)


def test_a_pickled_object_in_a_bin_is_refused_unread(tmp_path):
    directory, _ = sglang_dir(tmp_path)
    tensors = reshape_weights(directory, "bin")
    torch.save({**tensors, "extra": torch.nn.Linear(2, 2)}, directory / "pytorch_model.bin")
    with pytest.raises(
        CheckpointError, match=r"pytorch_model.bin: holds pickled objects that are not tensors"
    ):
        load_draft(directory, target_num_layers=5)
    with pytest.raises(
        CheckpointError, match="holds pickled objects"
    ):  # unreadable: no table, as cut short
        run_doctor(directory, engine="vllm")


def test_a_truncated_bin_is_one_line_naming_the_file(tmp_path):
    directory, _ = sglang_dir(tmp_path)
    reshape_weights(directory, "bin")
    file = directory / "pytorch_model.bin"
    file.write_bytes(file.read_bytes()[:2000])
    with pytest.raises(
        CheckpointError, match=r"pytorch_model.bin: cannot be read as a PyTorch weights file"
    ):
        load_draft(directory, target_num_layers=5)
    result = CliRunner().invoke(
        app, ["inspect", str(directory), "--target", str(make_target(tmp_path))]
    )
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert "pytorch_model.bin: cannot be read" in " ".join(result.output.split())


def test_a_sharded_index_naming_a_missing_shard_or_other_names(tmp_path):
    directory, _ = sglang_dir(tmp_path)
    reshape_weights(directory, "sharded-safetensors")
    index = directory / "model.safetensors.index.json"
    data = json.loads(index.read_text())
    data["weight_map"]["extra.weight"] = "model-00001-of-00002.safetensors"
    index.write_text(json.dumps(data))
    with pytest.raises(
        CheckpointError, match=r"index.json: 1 tensors it lists are in no shard: extra.weight"
    ):
        load_draft(directory, target_num_layers=5)
    (directory / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(
        CheckpointError, match=r"names shards that are not there: model-00002-of-00002"
    ):
        load_draft(directory, target_num_layers=5)


def test_two_weight_formats_in_one_directory_are_refused(tmp_path):
    directory, _ = sglang_dir(tmp_path)
    torch.save(load_file(str(directory / "model.safetensors")), directory / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match="holds model.safetensors and pytorch_model.bin"):
        load_draft(directory, target_num_layers=5)


def test_loader_and_doctor_read_an_owned_embedding_alike(tmp_path):
    """A speculators-trained drafter saves embed_tokens.weight at the target's width: the loader
    loads it as the drafter's own embedding and doctor's specdraft_loads finding agrees."""
    directory, model = sglang_dir(tmp_path, layout="speculators")
    tensors = load_file(str(directory / "model.safetensors"))
    owned = torch.randn(
        model.cfg.vocab_size, model.cfg.hidden_size, generator=torch.Generator().manual_seed(3)
    )
    tensors["embed_tokens.weight"] = owned.to(tensors["fc.weight"].dtype)
    save_file(tensors, str(directory / "model.safetensors"))
    loaded = load_draft(directory, target_num_layers=5).model
    assert loaded.cfg.embedding_owned and torch.equal(
        loaded.embed_tokens.weight, tensors["embed_tokens.weight"]
    )
    report = run_doctor(directory)
    assert report.finding("specdraft_loads").verdict == "pass", report.finding(
        "specdraft_loads"
    ).evidence


def test_the_loaded_drafter_holds_the_tensors_read_without_a_copy(tmp_path):
    """Reading costs the file's size once: the parameters are the tensors the reader returned
    (memory-mapped), not copies into a freshly initialised model (benchmarks/drafter_memory.py)."""
    from specdraft.checkpoint import build_draft, read_weights

    directory, model = sglang_dir(tmp_path)
    tensors, files = read_weights(directory)
    built = build_draft(model.cfg, tensors, "sglang", files.entry)
    assert built.fc.weight.data_ptr() == tensors["fc.weight"].data_ptr()
    assert (
        built.midlayer.mlp.down_proj.weight.data_ptr()
        == tensors["midlayer.mlp.down_proj.weight"].data_ptr()
    )
    assert torch.equal(built.lm_head.weight, model.lm_head.weight)
