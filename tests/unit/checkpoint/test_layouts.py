"""Strict checkpoint I/O: layouts, bit-exact round trips, manifest, refusals."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from specdraft.checkpoint import (
    LAYOUTS,
    CheckpointError,
    Manifest,
    audit,
    detect_layout,
    load_draft,
    save_draft,
    state_dict_for_layout,
)
from tests.support.drafts import tiny_draft, tiny_manifest


def saved_tensors(model):
    return {k: v for k, v in model.state_dict().items() if k != "embed_tokens.weight"}


@pytest.mark.parametrize("src", LAYOUTS)
@pytest.mark.parametrize("dst", LAYOUTS)
def test_round_trip_between_layouts_is_bit_exact(tmp_path, src, dst):
    model = tiny_draft(dtype=torch.bfloat16)
    manifest = tiny_manifest(model) if src == "specdraft" else None  # sglang + manifest = specdraft
    save_draft(model, tmp_path / "a", layout=src, manifest=manifest)
    loaded = load_draft(tmp_path / "a", target_num_layers=5)
    assert loaded.layout == src
    save_draft(loaded.model, tmp_path / "b", layout=dst, manifest=tiny_manifest(model))
    again = load_draft(tmp_path / "b", target_num_layers=5).model
    for name, tensor in saved_tensors(model).items():
        assert torch.equal(again.state_dict()[name], tensor), name
        assert again.state_dict()[name].dtype == tensor.dtype


def test_layout_key_names(tmp_path):
    model = tiny_draft()
    sglang = state_dict_for_layout(model, "sglang")
    speculators = state_dict_for_layout(model, "speculators")
    assert "midlayer.self_attn.q_proj.weight" in sglang and "embed_tokens.weight" not in sglang
    assert "layers.0.self_attn.q_proj.weight" in speculators
    assert not any(k.startswith("midlayer.") for k in speculators)
    assert {"fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d"} <= set(sglang)


def test_owned_embedding_is_saved_and_loaded(tmp_path):
    model = tiny_draft(
        hidden_size=16, num_attention_heads=2, num_key_value_heads=1, intermediate_size=32
    )
    assert model.cfg.owns_embedding
    save_draft(model, tmp_path / "d", layout="sglang")
    assert "embed_tokens.weight" in load_file(str(tmp_path / "d" / "model.safetensors"))
    loaded = load_draft(tmp_path / "d", target_num_layers=5).model
    assert loaded.embedding_loaded
    assert torch.equal(loaded.embed_tokens.weight, model.embed_tokens.weight)


def test_shared_embedding_not_loaded_until_given(tmp_path):
    model = tiny_draft()
    save_draft(model, tmp_path / "d", layout="specdraft", manifest=tiny_manifest(model))
    loaded = load_draft(tmp_path / "d").model
    assert not loaded.embedding_loaded


def test_configs_carry_engine_keys(tmp_path):
    model = tiny_draft()
    save_draft(model, tmp_path / "s", layout="sglang")
    save_draft(model, tmp_path / "v", layout="speculators", verifier="/models/target")
    sg = json.loads((tmp_path / "s" / "config.json").read_text())
    assert sg["architectures"] == ["LlamaForCausalLMEagle3"] and sg["tie_word_embeddings"] is False
    assert sg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]  # SGLang adds 1
    assert sg["eagle_aux_hidden_state_layer_ids"] == [2, 3, 4]  # vLLM reads as-is
    assert sg["draft_vocab_size"] == 64 and sg["rope_theta"] == model.cfg.rope_theta
    sp = json.loads((tmp_path / "v" / "config.json").read_text())
    assert sp["speculators_model_type"] == "eagle3" and sp["norm_before_residual"] is False
    assert sp["speculators_config"]["verifier"]["name_or_path"] == "/models/target"
    assert detect_layout(tmp_path / "v") == "speculators"


def test_manifest_round_trip_and_bad_json(tmp_path):
    model = tiny_draft()
    manifest = tiny_manifest(model)
    manifest.training = {"acc_0": 0.75}
    save_draft(model, tmp_path / "d", layout="specdraft", manifest=manifest)
    assert load_draft(tmp_path / "d").manifest == manifest
    (tmp_path / "d" / "specdraft_manifest.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="specdraft_manifest.json: not valid JSON"):
        load_draft(tmp_path / "d")


def test_specdraft_layout_needs_manifest(tmp_path):
    with pytest.raises(ValueError, match="needs a manifest"):
        save_draft(tiny_draft(), tmp_path / "d", layout="specdraft")


def test_save_replaces_atomically(tmp_path):
    model = tiny_draft()
    save_draft(model, tmp_path / "d", layout="sglang")
    save_draft(tiny_draft(seed=1), tmp_path / "d", layout="sglang")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]
    assert not torch.equal(
        load_draft(tmp_path / "d", target_num_layers=5).model.fc.weight, model.fc.weight
    )


@pytest.mark.parametrize("flag", ["embed_norm", "attention_bias", "mlp_bias"])
def test_unimplemented_config_flag_is_an_error(tmp_path, flag):
    save_draft(tiny_draft(), tmp_path / "d", layout="sglang")
    config = json.loads((tmp_path / "d" / "config.json").read_text())
    config[flag] = True
    (tmp_path / "d" / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=flag):
        load_draft(tmp_path / "d", target_num_layers=5)


def test_more_than_one_layer_is_an_error(tmp_path):
    save_draft(tiny_draft(), tmp_path / "d", layout="sglang")
    config = json.loads((tmp_path / "d" / "config.json").read_text())
    config["num_hidden_layers"] = 2
    (tmp_path / "d" / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="num_hidden_layers = 2"):
        load_draft(tmp_path / "d", target_num_layers=5)


def test_conflicting_aux_keys_are_an_error(tmp_path):
    save_draft(tiny_draft(), tmp_path / "d", layout="sglang")
    config = json.loads((tmp_path / "d" / "config.json").read_text())
    config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [0, 1, 2]  # SGLang: layers 1, 2, 3
    (tmp_path / "d" / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="name different layers"):
        load_draft(tmp_path / "d", target_num_layers=5)


def test_without_manifest_needs_target_layers(tmp_path):
    save_draft(tiny_draft(), tmp_path / "d", layout="sglang")
    with pytest.raises(CheckpointError, match="--target"):
        load_draft(tmp_path / "d")


def test_corrupt_weights_file(tmp_path):
    save_draft(tiny_draft(), tmp_path / "d", layout="sglang")
    (tmp_path / "d" / "model.safetensors").write_bytes(b"\x00garbage")
    with pytest.raises(CheckpointError, match="model.safetensors: cannot be read"):
        load_draft(tmp_path / "d", target_num_layers=5)


def test_wrong_shape_is_named(tmp_path):
    save_draft(tiny_draft(), tmp_path / "d", layout="sglang")
    file = tmp_path / "d" / "model.safetensors"
    tensors = load_file(str(file))
    tensors["fc.weight"] = torch.zeros(32, 32)
    save_file(tensors, str(file))
    with pytest.raises(CheckpointError, match=r"fc.weight \(32, 32\) \(expected \(32, 96\)\)"):
        load_draft(tmp_path / "d", target_num_layers=5)


def test_audit_finds_nan_and_bad_vocab_map():
    model = tiny_draft()
    assert audit(model) == []
    with torch.no_grad():
        model.lm_head.weight[0, 0] = float("nan")
        model.d2t.zero_()
    problems = audit(model)
    assert any("lm_head.weight holds NaN" in p for p in problems)
    assert len(problems) >= 2


def test_manifest_unknown_key(tmp_path):
    path = tmp_path / "m.json"
    path.write_text(json.dumps({"draft": {}, "target": {}, "aux_layers": [], "bogus": 1}))
    with pytest.raises(CheckpointError, match="unknown manifest keys"):
        Manifest.read(path)


def test_convert_keeps_the_manifest_both_ways(tmp_path):
    from specdraft.checkpoint import convert_draft

    model = tiny_draft()
    manifest = tiny_manifest(model)
    manifest.target["name_or_path"] = "/models/target"
    save_draft(model, tmp_path / "a", layout="specdraft", manifest=manifest)
    assert convert_draft(tmp_path / "a", tmp_path / "spec", layout="speculators").num_copied == 15
    spec = load_draft(tmp_path / "spec")
    assert spec.layout == "speculators" and spec.manifest == manifest
    config = json.loads((tmp_path / "spec" / "config.json").read_text())
    assert config["speculators_config"]["verifier"]["name_or_path"] == "/models/target"
    assert convert_draft(tmp_path / "spec", tmp_path / "back", layout="specdraft").num_copied == 15
    assert load_draft(tmp_path / "back").manifest == manifest


def test_a_manifest_missing_keys_is_a_one_line_error(tmp_path):
    """Valid JSON without the required keys names them (was a TypeError from the dataclass)."""
    from specdraft.checkpoint import CheckpointError, Manifest

    (tmp_path / "m.json").write_text("{}")
    with pytest.raises(
        CheckpointError, match=r"manifest keys \['aux_layers', 'draft', 'target'\] missing"
    ):
        Manifest.read(tmp_path / "m.json")
