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


def _to_layers0(tensors, keep_midlayer: int = 0):
    """Rename the decoder layer midlayer.* -> layers.0.* (ModelOpt's and TorchSpec's names),
    keeping the first `keep_midlayer` names as they are (a file mixing both)."""
    names = [k for k in tensors if k.startswith("midlayer.")][keep_midlayer:]
    tensors.update({k.replace("midlayer.", "layers.0."): tensors.pop(k) for k in names})


def test_case_s1_layers0_keys_under_sglang_config_load(tmp_path):
    """vLLM and SGLang >= 0.5.12 load layers.0.* under the official architecture (issue #34 item 1):
    specdraft reads them as the same tensors (doctor fails them for SGLang < 0.5.12 only)."""
    model = tiny_draft()
    save_draft(model, tmp_path / "d", layout="sglang")
    rewrite_weights(tmp_path / "d", _to_layers0)
    loaded = load_draft(tmp_path / "d", target_num_layers=5).model
    for name, tensor in model.state_dict().items():
        if name != "embed_tokens.weight":
            assert torch.equal(loaded.state_dict()[name], tensor), name


def test_case_s1_both_layer_names_in_one_file_are_refused(tmp_path):
    save_draft(tiny_draft(), tmp_path / "d", layout="sglang")
    rewrite_weights(tmp_path / "d", lambda t: _to_layers0(t, keep_midlayer=1))
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
