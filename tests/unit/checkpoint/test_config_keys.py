"""Unknown config.json keys are refused by every command, naming the keys; the configs the field
publishes (their key sets, copied from the sources config_keys names) pass."""

import json

import pytest
from typer.testing import CliRunner

from specdraft.checkpoint import UNIMPLEMENTED_FLAGS, CheckpointError, load_draft, save_draft
from specdraft.checkpoint.config_keys import unknown_config_keys
from specdraft.cli import app
from specdraft.doctor import run_doctor
from tests.support.drafts import tiny_draft

# Keys (and the values that matter) of published drafter configs, beyond what specdraft writes.
SPECFORGE_QWEN3_8B = {  # SpecForge configs/qwen3-8b-eagle3.json (a6b6b02)
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "initializer_range": 0.02,
    "max_window_layers": 36,
    "sliding_window": None,
    "use_cache": True,
    "use_sliding_window": False,
    "transformers_version": "4.51.0",
}
SPECFORGE_QWEN35_MOE = {
    "decoder_sparse_step": 1,
    "attention_dropout": 0.0,
    "use_sliding_window": False,
}
SPECFORGE_QWEN25_VL = {"target_model_type": "qwen2_5_vl", "pretraining_tp": 1, "pad_token_id": 0}
EAGLE_TRAINEAGLE3 = {
    "bos_token_id": 128000,
    "eos_token_id": 128001,
    "pad_token_id": 0,  # SafeAILab/EAGLE 9666a81
    "initializer_range": 0.02,
    "torch_dtype": "float16",
    "use_cache": True,
}
# speculators 0.9.0: the config.json of its trainer's checkpoints (saved with its config.py)
SPECULATORS_TRAINER = {
    "auto_map": {"": "config.Eagle3SpeculatorConfig"},
    "embed_requires_grad": False,
}
MODELOPT = {
    "attention_bias": False,
    "mlp_bias": False,
    "pretraining_tp": 1,
    "attention_dropout": 0.0,  # 0.47.0
    "eagle_config": {
        "eagle_aux_hidden_state_layer_ids": [1, 2, 3],
        "use_aux_hidden_state": True,
        "use_input_layernorm_in_first_layer": True,
        "use_last_layernorm": True,
        "use_mtp_layernorm": False,
        "next_layer_regular": True,
        "parallel_draft_step": 1,
        "parallel_draft_heads_num_layers": None,
    },
}


def edit_config(directory, **keys):
    config = json.loads((directory / "config.json").read_text())
    config.update(keys)
    (directory / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize(
    "keys",
    [
        SPECFORGE_QWEN3_8B,
        SPECFORGE_QWEN35_MOE,
        SPECFORGE_QWEN25_VL,
        EAGLE_TRAINEAGLE3,
        MODELOPT,
        SPECULATORS_TRAINER,
    ],
)
def test_published_keys_load(tmp_path, keys):
    save_draft(tiny_draft(), tmp_path / "d", layout="sglang")
    edit_config(tmp_path / "d", **keys)
    load_draft(tmp_path / "d", target_num_layers=5)


def test_speculators_trainer_layer_config_keys_pass():
    """speculators 0.9.0 saves transformer_layer_config as a transformers config's to_diff_dict."""
    from transformers import LlamaConfig, Qwen3Config

    for config in (LlamaConfig(num_hidden_layers=1), Qwen3Config(num_hidden_layers=1)):
        layer = config.to_diff_dict()
        assert (
            unknown_config_keys(
                {
                    "speculators_model_type": "eagle3",
                    "transformer_layer_config": layer,
                    "embed_requires_grad": False,
                    "norm_before_fc": False,
                },
                UNIMPLEMENTED_FLAGS,
            )
            == []
        )


@pytest.mark.parametrize(
    ("keys", "named"),
    [
        (
            {"moe_intermediate_size": 768},
            "moe_intermediate_size = 768 (closest known key: intermediate_size)",
        ),
        (
            {"quantization_config": {"quant_method": "fp8"}},
            "quantization_config = {'quant_method': 'fp8'};",
        ),
        ({"rope_thetta": 1e6}, "rope_thetta = 1000000.0 (closest known key: rope_theta)"),
        ({"hidden_act": "gelu"}, "hidden_act = 'gelu' (harmless only as 'silu')"),
        ({"use_sliding_window": True}, "use_sliding_window = True (harmless only as False / None)"),
        (
            {
                "eagle_config": {
                    "eagle_aux_hidden_state_layer_ids": [1, 2, 3],
                    "use_mtp_layernorm": True,
                }
            },
            "eagle_config.use_mtp_layernorm = True (harmless only as False / None)",
        ),
    ],
)
def test_an_unknown_key_is_refused_naming_it(tmp_path, keys, named):
    """One readable line: the key, what is known of it, the fix and where the known keys are
    listed (not the list itself); doctor says the loader's words."""
    save_draft(tiny_draft(), tmp_path / "d", layout="sglang")
    edit_config(tmp_path / "d", **keys)
    with pytest.raises(CheckpointError, match="does not know to be harmless") as refused:
        load_draft(tmp_path / "d", target_num_layers=5)
    message = str(refused.value)
    assert (
        named in message
        and f"`specdraft inspect {tmp_path / 'd'} --known-keys` lists the keys known" in message
    )
    assert "rms_norm_eps" not in message and len(message.replace(str(tmp_path / "d"), "")) < 350
    finding = run_doctor(tmp_path / "d").finding("specdraft_loads")
    assert finding.verdict == "fail" and finding.evidence.endswith(message)


def test_a_long_unknown_value_is_cut():
    value = {"quant_method": "fp8", "weight_block_size": [128, 128], "activation_scheme": "dynamic"}
    (entry,) = unknown_config_keys({"quantization_config": value})
    assert entry == "quantization_config = " + repr(value)[:57] + "..."


def test_inspect_known_keys_lists_the_keys_and_the_checkpoints_others(tmp_path):
    save_draft(tiny_draft(), tmp_path / "d", layout="sglang")
    result = CliRunner().invoke(app, ["inspect", str(tmp_path / "d"), "--known-keys"])
    lines = result.output.splitlines()
    assert result.exit_code == 0 and lines[0].startswith(
        "read: architectures, model_type, hidden_size"
    )
    assert lines[-1] == f"{tmp_path / 'd'}/config.json: no other keys"
    assert any(
        line.startswith("flags judged by their own rule: norm_before_residual")
        and "mlp_bias" in line
        for line in lines
    )
    edit_config(tmp_path / "d", use_mrope=False)
    result = CliRunner().invoke(app, ["inspect", str(tmp_path / "d"), "--known-keys"])
    assert result.exit_code == 0 and result.output.splitlines()[-2:] == [
        f"{tmp_path / 'd'}/config.json: ignored (no engine reads it): use_mrope",
        f"{tmp_path / 'd'}/config.json: no refused keys",
    ]
    edit_config(tmp_path / "d", rope_thetta=1e6)
    result = CliRunner().invoke(app, ["inspect", str(tmp_path / "d"), "--known-keys"])
    assert result.exit_code == 1 and result.output.splitlines()[-1] == (
        f"{tmp_path / 'd'}/config.json: neither read nor known harmless: rope_thetta = 1000000.0 "
        "(closest known key: rope_theta)"
    )


def test_inspect_names_a_key_no_engine_reads_in_a_speculators_layer_config_as_ignored(tmp_path):
    """No engine reads num_experts of a Llama EAGLE-3 drafter (issue #34 item 3): the drafter loads
    as the engines serve it, and inspect says in one line that the key is ignored."""
    save_draft(tiny_draft(), tmp_path / "d", layout="speculators", verifier="t")
    config = json.loads((tmp_path / "d" / "config.json").read_text())
    config["transformer_layer_config"]["num_experts"] = 8
    (tmp_path / "d" / "config.json").write_text(json.dumps(config))
    from tests.support.tiny_models import save_tiny_model

    target = save_tiny_model("llama", tmp_path / "target", num_layers=5)
    result = CliRunner().invoke(app, ["inspect", str(tmp_path / "d"), "--target", str(target)])
    text = " ".join(result.output.split())
    assert result.exit_code == 0, result.output
    assert (
        "note: config.json keys no engine reads, ignored (as SGLang and vLLM ignore them): "
        "transformer_layer_config.num_experts" in text
    )


# Keys of published configs no engine reads (SpecForge qwen25-7b, AngelSlim qwen3-30b-a3b and
# qwen3-vl-4b-mrope, tests/fixtures/published_configs): ignored, named in one line.
IGNORED = {
    "use_mrope": False,
    "router_aux_loss_coef": 0.001,
    "output_router_logits": False,
    "image_token_id": 151655,
    "video_token_id": 151656,
    "vision_start_token_id": 151652,
    "vision_end_token_id": 151653,
    "modal_type": "VLM",  # close to model_type, yet no engine reads it: not a misspelling
}


def test_keys_no_engine_reads_are_ignored_and_named_in_one_line(tmp_path):
    from specdraft.checkpoint.config_keys import ignored_keys_note

    save_draft(tiny_draft(), tmp_path / "d", layout="sglang")
    edit_config(tmp_path / "d", **IGNORED)
    load_draft(tmp_path / "d", target_num_layers=5)
    config = json.loads((tmp_path / "d" / "config.json").read_text())
    assert unknown_config_keys(config, UNIMPLEMENTED_FLAGS) == []
    note = ignored_keys_note(config)
    assert note.endswith(", ".join(IGNORED)) and "\n" not in note


@pytest.mark.parametrize(
    ("keys", "named"),
    [
        ({"logit_scale": 0.5}, "logit_scale = 0.5 (harmless only as 1 / 1.0 / None)"),
        ({"parallel_drafting": True}, "parallel_drafting = True (harmless only as False / None)"),
        ({"partial_rotary_factor": 0.5}, "partial_rotary_factor = 0.5 (harmless only as"),
        ({"bias": True}, "bias = True (harmless only as False / None)"),
        ({"num_hiden_layers": 1}, "num_hiden_layers = 1 (closest known key: num_hidden_layers)"),
    ],
)
def test_a_key_an_engine_reads_otherwise_or_a_misspelling_is_refused(tmp_path, keys, named):
    save_draft(tiny_draft(), tmp_path / "d", layout="sglang")
    edit_config(tmp_path / "d", **keys)
    with pytest.raises(CheckpointError, match="does not know to be harmless") as refused:
        load_draft(tmp_path / "d", target_num_layers=5)
    assert named in str(refused.value)


def test_num_aux_hidden_states_is_read_as_the_aux_count(tmp_path):
    """SGLang >= 0.5.12 and vLLM size fc by num_aux_hidden_states (TorchSpec writes it): the
    drafter's count loads, another count is refused naming both."""
    save_draft(tiny_draft(), tmp_path / "d", layout="sglang")
    edit_config(tmp_path / "d", num_aux_hidden_states=3)
    assert load_draft(tmp_path / "d", target_num_layers=5).model.cfg.n_aux == 3
    edit_config(tmp_path / "d", num_aux_hidden_states=4)
    with pytest.raises(
        CheckpointError, match=r"num_aux_hidden_states = 4, but the drafter reads 3"
    ):
        load_draft(tmp_path / "d", target_num_layers=5)
