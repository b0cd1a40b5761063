"""Cases S1 and FC-01: a key that matches nothing or a parameter left unfilled is an error."""

import pytest
import torch
from safetensors.torch import load_file, save_file

from specdraft.checkpoint import CheckpointError, load_draft, save_draft
from tests.support.drafts import tiny_draft


def rewrite_weights(directory, edit):
    file = directory / "model.safetensors"
    tensors = load_file(str(file))
    edit(tensors)
    save_file(tensors, str(file))


def test_case_s1_layers0_keys_under_sglang_config(tmp_path):
    save_draft(tiny_draft(), tmp_path / "d", layout="sglang")
    rewrite_weights(
        tmp_path / "d",
        lambda t: t.update(
            {
                k.replace("midlayer.", "layers.0."): t.pop(k)
                for k in [k for k in t if k.startswith("midlayer.")]
            }
        ),
    )
    with pytest.raises(CheckpointError) as err:
        load_draft(tmp_path / "d", target_num_layers=5)
    message = str(err.value)
    assert "layers.0.self_attn.q_proj.weight" in message
    assert "midlayer.self_attn.q_proj.weight" in message
    assert "rename" in message and "\n" not in message


def test_case_s1_import_never_leaves_initial_values(tmp_path):
    model = tiny_draft(seed=3)
    save_draft(model, tmp_path / "d", layout="speculators")
    loaded = load_draft(tmp_path / "d", target_num_layers=5).model
    fresh = tiny_draft(seed=4)
    for name, tensor in loaded.state_dict().items():
        if name == "embed_tokens.weight":
            continue
        assert torch.equal(tensor, model.state_dict()[name]), name
        if tensor.is_floating_point():
            assert not torch.equal(tensor, fresh.state_dict()[name]), name


def test_case_fc01_missing_tensor_is_named(tmp_path):
    save_draft(tiny_draft(), tmp_path / "d", layout="sglang")
    rewrite_weights(tmp_path / "d", lambda t: t.pop("fc.weight"))
    with pytest.raises(CheckpointError, match="parameters not in the file: fc.weight"):
        load_draft(tmp_path / "d", target_num_layers=5)


def test_case_fc01_extra_tensor_is_named(tmp_path):
    save_draft(tiny_draft(), tmp_path / "d", layout="sglang")
    rewrite_weights(
        tmp_path / "d", lambda t: t.update({"midlayer.extra_norm.weight": torch.ones(32)})
    )
    with pytest.raises(CheckpointError, match="match no parameter: midlayer.extra_norm.weight"):
        load_draft(tmp_path / "d", target_num_layers=5)
