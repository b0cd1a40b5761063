"""SGLang's own loader (ModelConfig -> get_model -> DefaultModelLoader -> load_weights) on every
`specdraft export --engine sglang` directory, with the accounting SGLang does not do: every
parameter NaN-filled first, then every parameter written (the embedding by the worker's
set_embed), every file tensor used or skipped by design, each equal to the file.

Negative controls prove the accounting can fail: SGLang loads each silently, and `specdraft doctor
--engine sglang --sglang-version V` must fail the same file with the cause.
"""

from __future__ import annotations

import pytest
import torch

from specdraft.conventions import parse_version
from specdraft.conventions.engines import sglang_replaces_embedding, sglang_replaces_head
from tests.sglang_tier import engine
from tests.sglang_tier.accounting import account, layer_module
from tests.sglang_tier.worlds import doctor, read_export, sglang_export
from tests.support.doctor_helpers import edit_config, edit_weights, one_thread, rename_layer  # noqa: F401 (autouse)

EMBEDDING = "model.embed_tokens.weight"  # not in the file: SGLang's worker sets the target's
NEW_LAYER_NAMES = parse_version(engine.VERSION) >= (0, 5, 12)  # DRAFT_LOADING: layers.0.* loads


def load_draft(export):
    return engine.load(export.path, draft=True, dtype=export.config["torch_dtype"])


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("arch", ["llama", "qwen3", "deepseek_v3"])
def test_every_parameter_written_every_tensor_used(tmp_path, arch, dtype):
    """deepseek_v3: the DeepSeek-class target's drafter (specdraft writes LlamaForCausalLMEagle3
    for every target; SGLang's MLA drafter Eagle3DeepseekV2ForCausalLM is no specdraft export)."""
    export = sglang_export(tmp_path, arch, dtype)
    loaded = load_draft(export)
    assert type(loaded.model).__name__ == export.config["architectures"][0]
    assert sorted(loaded.given) == sorted(export.tensors)  # the loader hands over every tensor
    acc = account(loaded.model, export.tensors, engine.VERSION)
    assert (acc.unused, acc.incomplete, acc.differ) == ([], [], [])
    assert sglang_replaces_embedding(export.config) and loaded.unwritten == [EMBEDDING]
    assert not sglang_replaces_head(export.config) and not loaded.model.load_lm_head_from_target
    d2t = export.tensors["d2t"]
    assert torch.equal(loaded.model.hot_token_id, d2t + torch.arange(len(d2t)))
    engine.set_embed(loaded.model, export.embedding.to(loaded.model.lm_head.weight.dtype))
    weight = loaded.model.model.embed_tokens.weight
    assert torch.equal(weight, export.embedding.to(weight.dtype))


def _layers0(tensors):
    rename_layer(tensors, "midlayer.", "layers.0.")


def _no_fc(tensors):
    del tensors["fc.weight"]


def _misspelled(tensors):
    tensors["midlayer.self_attn.q_prj.weight"] = tensors.pop("midlayer.self_attn.q_proj.weight")


# name -> (edit, what the accounting must find: (unused, incomplete or unwritten), doctor's words)
CONTROLS = {
    "layers0_names": (_layers0, "layers.0.", "layers.0"),
    "fc_removed": (_no_fc, None, "fc.weight"),
    "misspelled": (_misspelled, "midlayer.self_attn.q_prj.weight", "q_prj"),
}


@pytest.mark.parametrize("control", list(CONTROLS))
def test_negative_control_loads_silently_and_doctor_fails_it(tmp_path, control):
    if control == "layers0_names" and NEW_LAYER_NAMES:
        pytest.skip(
            f"SGLang {engine.VERSION} loads layers.0.* (test_layers0_names_load_from_0_5_12)"
        )
    edit, unused, cause = CONTROLS[control]
    export = sglang_export(tmp_path)
    edit_weights(export.path, edit)
    export = read_export(export.path, export.target)
    loaded = load_draft(export)  # no error: SGLang says nothing
    acc = account(loaded.model, export.tensors, engine.VERSION)
    if unused is not None:
        assert acc.unused and all(name.startswith(unused) for name in acc.unused), acc
    missing = [n for n in loaded.unwritten if n != EMBEDDING] + acc.incomplete
    assert missing, f"every parameter written: {acc}"
    if control == "fc_removed":
        assert missing == ["model.fc.weight"]
    verdict = doctor(export.path, export.target)["keys_match_engine"]
    assert verdict["verdict"] == "fail" and cause in verdict["evidence"], verdict


@pytest.mark.skipif(not NEW_LAYER_NAMES, reason="SGLang < 0.5.12 skips layers.0.* (a control)")
def test_layers0_names_load_from_0_5_12(tmp_path):
    """DRAFT_LOADING: from 0.5.12 on, load_weights renames midlayer to layers.0; both load."""
    export = sglang_export(tmp_path)
    edit_weights(export.path, _layers0)
    export = read_export(export.path, export.target)
    loaded = load_draft(export)
    assert layer_module(loaded.model) == "layers.0"
    acc = account(loaded.model, export.tensors, engine.VERSION)
    assert (acc.unused, acc.incomplete, acc.differ, loaded.unwritten) == ([], [], [], [EMBEDDING])
    assert doctor(export.path, export.target)["keys_match_engine"]["verdict"] == "pass"


def test_decoder_layer_module_is_the_one_draft_loading_names(tmp_path):
    """DRAFT_LOADING's rows: one `midlayer` module before 0.5.12, a `layers` ModuleList after."""
    loaded = load_draft(sglang_export(tmp_path))
    assert layer_module(loaded.model) == ("layers.0" if NEW_LAYER_NAMES else "midlayer")


def test_number_of_aux_states_sglang_builds_fc_for(tmp_path):
    """NUM_AUX_FIXED's note: from 0.5.12 on SGLang sizes fc from num_aux_hidden_states, else the
    length of eagle_config's ids; 0.5.10 hard-codes three (the export writes 3 ids: both agree)."""
    export = sglang_export(tmp_path)
    hidden = export.config["target_hidden_size"]
    edit_config(export.path, lambda c: c.update(num_aux_hidden_states=2))
    if NEW_LAYER_NAMES:  # the file's fc.weight [H, 3H] then meets an fc [H, 2H]: a shape error
        with pytest.raises(AssertionError):
            load_draft(export)
        edit_config(export.path, lambda c: c.pop("num_aux_hidden_states"))
        edit_config(
            export.path, lambda c: c["eagle_config"].update(eagle_aux_hidden_state_layer_ids=[1, 3])
        )
        config = read_export(export.path, export.target).config
        with pytest.raises(AssertionError):
            load_draft(read_export(export.path, export.target))
        assert len(config["eagle_config"]["eagle_aux_hidden_state_layer_ids"]) == 2
    else:
        loaded = load_draft(read_export(export.path, export.target))
        assert loaded.model.model.fc.weight.shape[1] == 3 * hidden
