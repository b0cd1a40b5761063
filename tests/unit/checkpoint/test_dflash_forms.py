"""Published DFlash drafters load strictly (`checkpoint.dflash_forms`): z-lab's Qwen3-8B-DFlash-b16
form, SpecForge's save, speculators' config, each with every key kept and its sizes shrunk, and
random tensors under the names the form implies; settings of another network are one line.

Sources of the forms: z-lab's b16 config keys as a Qwen3-4B-DFlash-b16 config.json copy records
them (block_size and num_target_layers top-level, dflash_config {mask_token_id, target_layer_ids},
layer_types, auto_map, tie_word_embeddings true), with the Qwen3-8B sizes of SpecForge
configs/qwen3-8b-dflash.json; SpecForge scripts/train_dflash.py save_checkpoint (that config plus
the dflash_config it sets); speculators src/speculators/models/dflash/config.py and core.py."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from specdraft.checkpoint import CheckpointError
from specdraft.checkpoint.dflash import load_dflash_draft
from specdraft.checkpoint.dflash_forms import weights_kind
from specdraft.checkpoint.layouts import TargetNeeded
from tests.support.dflash import tiny_dflash_draft

TINY = {  # Qwen3-8B's 4096 / 12288 / 32 heads / 8 kv / 128 head_dim / 151936 vocab, shrunk
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "vocab_size": 50,
    "num_hidden_layers": 2,
    "max_position_embeddings": 128,
}
SPECFORGE = {
    "architectures": ["DFlashDraftModel"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "auto_map": {"AutoModel": "modeling_dflash.DFlashDraftModel"},
    "block_size": 4,
    "bos_token_id": 1,
    "dtype": "bfloat16",
    "eos_token_id": 2,
    "hidden_act": "silu",
    "initializer_range": 0.02,
    "layer_types": ["full_attention", "full_attention"],
    "max_window_layers": 2,
    "model_type": "qwen3",
    "num_target_layers": 4,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "use_cache": True,
    "use_sliding_window": False,
    **TINY,
    "dflash_config": {"mask_token_id": 49, "target_layer_ids": [0, 1, 2]},
}
ZLAB = {
    **SPECFORGE,
    "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
    "tie_word_embeddings": True,
    "transformers_version": "4.57.3",
}
SPECULATORS = {
    "architectures": ["DFlashSpeculator"],
    "speculators_model_type": "dflash",
    "speculators_version": "0.9.0",
    "transformer_layer_config": {
        **{k: v for k, v in SPECFORGE.items() if k not in ("dflash_config", "block_size")},
        "num_target_layers": None,
        "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"},
    },
    "draft_vocab_size": 50,
    "block_size": 4,
    "target_hidden_size": None,
    "aux_hidden_state_layer_ids": [1, 2, 3],
    "mask_token_id": 49,
    "sliding_window_non_causal": False,
    "projector_type": "dflash",
    "sample_from_anchor": False,
    "speculators_config": {
        "algorithm": "dflash",
        "default_proposal_method": "greedy",
        "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
        "verifier": {"name_or_path": "Qwen/Qwen3-8B", "architectures": ["Qwen3ForCausalLM"]},
    },
}
for key in ("rope_theta", "rope_scaling", "num_target_layers"):
    SPECULATORS["transformer_layer_config"].pop(key)


def published(tmp_path, config, tensors=None):
    """A drafter directory of `config` with random tensors of the tiny drafter's names."""
    out = tmp_path / "published"
    out.mkdir()
    (out / "config.json").write_text(json.dumps(config))
    if tensors is None:
        torch.manual_seed(1)
        tensors = {k: torch.randn(v.shape) for k, v in tiny_dflash_draft().state_dict().items()}
    save_file(tensors, out / "model.safetensors")
    return out, tensors


@pytest.mark.parametrize("config", [ZLAB, SPECFORGE], ids=["z-lab", "specforge"])
def test_zlab_and_specforge_forms_load_every_tensor(tmp_path, config):
    out, tensors = published(tmp_path, config)
    model, manifest = load_dflash_draft(out)
    cfg = model.cfg
    assert manifest is None
    assert (cfg.block_size, cfg.mask_token_id, cfg.target_layer_ids) == (4, 49, (0, 1, 2))
    assert cfg.aux_layers == (1, 2, 3) and cfg.target_num_layers == 4
    assert (cfg.rope_theta, cfg.num_hidden_layers, cfg.hidden_size) == (1e6, 2, 32)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in tensors.items())


def test_the_speculators_form_loads_given_the_target_layer_count(tmp_path):
    out, tensors = published(tmp_path, SPECULATORS)
    with pytest.raises(TargetNeeded, match="layer count is not in the file .speculators form"):
        load_dflash_draft(out)
    model, _ = load_dflash_draft(out, target_num_layers=4)
    assert model.cfg.target_layer_ids == (0, 1, 2)  # aux ids [1, 2, 3] - 1, as vLLM reads them
    assert (model.cfg.block_size, model.cfg.mask_token_id, model.cfg.rope_theta) == (4, 49, 1e6)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in tensors.items())


@pytest.mark.parametrize(
    "change, named",
    [
        ({"draft_vocab_size": 20}, "draft_vocab_size 20 of 50: a reduced draft vocabulary"),
        ({"projector_type": "domino"}, "dflash_config.projector_type set"),
        ({"sample_from_anchor": True}, "dflash_config.sample_from_anchor set"),
        ({"mask_token_id": None}, "keys ['mask_token_id'] missing"),
    ],
)
def test_speculators_settings_of_another_network_are_one_line(tmp_path, change, named):
    out, _ = published(tmp_path, {**SPECULATORS, **change})
    with pytest.raises(CheckpointError) as raised:
        load_dflash_draft(out, target_num_layers=4)
    assert str(raised.value).startswith(f"{out / 'config.json'}: ") and named in str(raised.value)


@pytest.mark.parametrize(
    "change, named",
    [
        ({"dflash_config": {**SPECFORGE["dflash_config"], "use_swa": True}}, "use_swa set"),
        ({"dflash_config": {**SPECFORGE["dflash_config"], "causal": True}}, "causal set"),
        ({"use_sliding_window": True, "sliding_window": 8}, "use_sliding_window set"),
        ({"quantization_config": {"quant_method": "fp8"}}, "quantization_config set"),
        (
            {"dflash_config": {**SPECFORGE["dflash_config"], "block_size": 8}},
            "dflash_config.block_size 8 != block_size 4",
        ),
        ({"num_target_layers": 2}, "target_layer_ids [0, 1, 2]: need ids of decoder layers 0..1"),
    ],
)
def test_dflash_form_settings_of_another_network_are_one_line(tmp_path, change, named):
    out, _ = published(tmp_path, {**SPECFORGE, **change})
    with pytest.raises(CheckpointError) as raised:
        load_dflash_draft(out)
    assert str(raised.value).startswith(f"{out / 'config.json'}: ") and named in str(raised.value)


def test_eagle3_weights_under_a_dflash_config_are_named(tmp_path):
    eagle = {"fc.weight": torch.zeros(32, 96), "midlayer.hidden_norm.weight": torch.ones(32)}
    out, _ = published(tmp_path, SPECFORGE, {**eagle, "d2t": torch.zeros(50, dtype=torch.long)})
    with pytest.raises(CheckpointError, match="EAGLE-3 tensors .* under a DFlash config"):
        load_dflash_draft(out)


def test_weights_kind_tells_the_two_drafters_apart():
    dflash = tiny_dflash_draft().state_dict()
    assert weights_kind(dflash) == "dflash"
    assert weights_kind(["fc.weight", "midlayer.self_attn.q_proj.weight", "d2t"]) == "eagle3"
    assert weights_kind(["layers.0.hidden_norm.weight", "fc.weight"]) == "eagle3"  # speculators'
    assert weights_kind(["embed_tokens.weight"]) is None


def test_dflash_weights_under_an_eagle3_config_are_named(tmp_path):
    from specdraft.checkpoint import load_draft, save_draft
    from tests.support.drafts import tiny_draft, tiny_manifest

    eagle = tiny_draft()
    out = save_draft(eagle, tmp_path / "eagle", layout="specdraft", manifest=tiny_manifest(eagle))
    save_file(tiny_dflash_draft().float().state_dict(), out / "model.safetensors")
    with pytest.raises(CheckpointError, match="these are a DFlash drafter's tensors"):
        load_draft(out)


def test_an_id_list_of_another_length_than_fc_names_both_counts(tmp_path):
    config = {**SPECFORGE, "dflash_config": {"mask_token_id": 49, "target_layer_ids": [0, 2]}}
    out, _ = published(tmp_path, config)
    with pytest.raises(CheckpointError) as raised:
        load_dflash_draft(out)
    assert "fc.weight (32, 96) != (32, 64)" in str(raised.value)
    assert "fc.weight reads 3 target layers' states, the config names 2" in str(raised.value)
