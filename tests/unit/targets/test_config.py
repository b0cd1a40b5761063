"""Target configs as published (issue #21 item 2): DeepSeek-V3/R1's FP8 quantization_config is
data, never a kernel import (doctor skipped the forward checks with the reason instead of an
ImportError traceback); Kimi-K2's model_type kimi_k2 + auto_map is read by specdraft's table as
the DeepSeek-V3 class without transformers' "run the custom code? [y/N]" prompt; unknown remote
code is refused in one line naming --trust-remote-code."""

from __future__ import annotations

import json

import pytest

from specdraft.doctor import run_doctor
from specdraft.export import TargetFacts
from specdraft.targets.config import PUBLISHED_MODEL_TYPES, TargetConfigError, read_target_config
from tests.support.cli import flat, invoke
from tests.support.doctor_helpers import draft_checkpoint, edit_config, one_thread  # noqa: F401

# DeepSeek-V3's published quantization_config (deepseek-ai/DeepSeek-V3 config.json).
FP8 = {
    "activation_scheme": "dynamic",
    "fmt": "e4m3",
    "quant_method": "fp8",
    "weight_block_size": [128, 128],
}
# Kimi-K2's published remote-code keys (moonshotai/Kimi-K2-Instruct config.json).
KIMI = {
    "model_type": "kimi_k2",
    "auto_map": {
        "AutoConfig": "configuration_deepseek.DeepseekV3Config",
        "AutoModel": "modeling_deepseek.DeepseekV3Model",
        "AutoModelForCausalLM": "modeling_deepseek.DeepseekV3ForCausalLM",
    },
}


@pytest.fixture(scope="module")
def deepseek(tmp_path_factory):
    """(drafter with its manifest, DeepSeek-V3-class target of 8 layers)."""
    return draft_checkpoint(
        tmp_path_factory.mktemp("ds"), arch="deepseek_v3", num_layers=8, aux=(2, 4, 5)
    )


def test_kimi_k2_is_read_as_the_deepseek_v3_class_without_a_prompt(tmp_path, deepseek, monkeypatch):
    _, target = deepseek
    kimi = tmp_path / "kimi"
    kimi.mkdir()
    config = json.loads((target / "config.json").read_text())
    (kimi / "config.json").write_text(json.dumps({**config, **KIMI}))
    monkeypatch.setattr("builtins.input", lambda *a: pytest.fail("prompted for remote code"))
    read = read_target_config(kimi)
    assert read.model_type == PUBLISHED_MODEL_TYPES["kimi_k2"] == "deepseek_v3"
    facts = TargetFacts.from_target_dir(kimi)
    assert (facts.target_class, facts.num_layers, facts.hidden_size) == (
        "deepseek",
        8,
        config["hidden_size"],
    )


def test_unknown_remote_code_is_refused_in_one_line(tmp_path, deepseek):
    draft, target = deepseek
    other = tmp_path / "other"
    other.mkdir()
    config = json.loads((target / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, **KIMI, "model_type": "moonlight_x"}))
    with pytest.raises(TargetConfigError, match="pass --trust-remote-code"):
        read_target_config(other)
    result = invoke(["inspect", str(draft), "--target", str(other)])
    text = flat(result.output)
    assert (
        result.exit_code == 1
        and "model_type 'moonlight_x' is defined by the model's own code" in text
    )
    assert "Traceback" not in result.output
    with pytest.raises(ValueError, match="--trust-remote-code"):
        run_doctor(draft, target=other)


def test_an_fp8_target_needs_only_its_config(tmp_path, deepseek):
    draft, target = deepseek
    edit_config(target, lambda c: c.update(quantization_config=FP8))
    try:
        assert read_target_config(target).quantization_config["quant_method"] == "fp8"
        report = run_doctor(draft, target=target)  # ImportError traceback before
        assert report.finding("fc_width_matches_aux").verdict == "pass"
        assert report.finding("engine_captures_training_layers").verdict == "pass"
        finding = report.finding("aux_width_on_target")
        assert finding.verdict == "skip" and "cannot run the target here" in finding.evidence
        assert "FP8" in finding.evidence or "fp8" in finding.evidence.lower()
    finally:
        edit_config(target, lambda c: c.pop("quantization_config"))


def test_trust_remote_code_is_what_the_refusal_names(tmp_path, deepseek, monkeypatch):
    """--trust-remote-code reaches the config reader (here transformers is asked, and says the code
    file is missing: the flag is honoured, no prompt is drawn)."""
    draft, target = deepseek
    other = tmp_path / "other"
    other.mkdir()
    config = json.loads((target / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, **KIMI, "model_type": "moonlight_x"}))
    monkeypatch.setattr("builtins.input", lambda *a: pytest.fail("prompted for remote code"))
    for command in (["inspect", str(draft)], ["doctor", str(draft)]):
        result = invoke([*command, "--target", str(other), "--trust-remote-code"])
        text = flat(result.output)
        assert result.exit_code == 1 and "configuration_deepseek.py" in text, (
            text
        )  # transformers looked for it
        assert "is defined by the model's own code" not in text, text  # the refusal is lifted
        assert "Traceback" not in result.output


def test_a_target_config_that_is_missing_or_not_json_is_one_named_error(tmp_path):
    from specdraft.errors import SpecdraftError
    from specdraft.targets.config import TargetFileMissing

    with pytest.raises(TargetFileMissing, match="no config.json; pass the target's") as caught:
        read_target_config(tmp_path)
    assert isinstance(caught.value, FileNotFoundError) and isinstance(caught.value, SpecdraftError)
    (tmp_path / "config.json").write_text("{bad")
    with pytest.raises(TargetConfigError, match=r"config.json: not valid JSON \(Expecting"):
        read_target_config(tmp_path)
    (tmp_path / "config.json").write_bytes(b"\xff\xfe")
    with pytest.raises(TargetConfigError, match=r"not valid JSON \(not UTF-8 text\); restore"):
        read_target_config(tmp_path)


def test_a_damaged_weights_index_and_generation_config_are_named(tmp_path):
    from specdraft.targets.config import (
        TargetFileError,
        end_token_ids,
        target_generation_config,
        target_weight_files,
    )
    from tests.support.tiny_models import save_tiny_model

    target = save_tiny_model("llama", tmp_path / "t", num_layers=2)
    (target / "model.safetensors.index.json").write_text('{"metadata": {}}')
    with pytest.raises(TargetConfigError, match=r"index.json: not a sharded-weights index \("):
        target_weight_files(target)
    (target / "generation_config.json").write_text("{bad")
    with pytest.raises(TargetFileError, match="generation_config.json' is not a valid JSON"):
        target_generation_config(target)
    (target / "generation_config.json").write_text('{"eos_token_id": "two"}')

    class Tokenizer:
        eos_token_id = 2

    with pytest.raises(TargetConfigError, match="eos_token_id 'two' is not a token id"):
        end_token_ids(Tokenizer(), target)


def test_a_target_embedding_in_a_damaged_file_is_named(tmp_path):
    from specdraft.errors import DamagedFile
    from specdraft.targets import target_embedding
    from tests.support.tiny_models import save_tiny_model

    target = save_tiny_model("llama", tmp_path / "t", num_layers=2)
    weights = target / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])  # a download cut short
    with pytest.raises(DamagedFile, match="model.safetensors: cannot be read as safetensors"):
        target_embedding(target)
