"""`specdraft convert` names what it wrote, and a manifest-less speculators conversion records the
target's architecture as its verifier (never a hard-coded LlamaForCausalLM)."""

import json

from typer.testing import CliRunner

from specdraft.checkpoint import save_draft
from specdraft.cli import app
from tests.drafts import tiny_draft
from tests.tiny_models import save_tiny_model


def test_manifest_less_speculators_convert_records_the_targets_architecture(tmp_path):
    save_draft(tiny_draft(), tmp_path / "d", layout="sglang")
    target = save_tiny_model("qwen3", tmp_path / "target", num_layers=5)
    result = CliRunner().invoke(app, ["convert", str(tmp_path / "d"), str(tmp_path / "out"), "--layout",
                                      "speculators", "--target", str(target)])
    assert result.exit_code == 0, result.output
    verifier = json.loads((tmp_path / "out" / "config.json").read_text())["speculators_config"]["verifier"]
    assert verifier["architectures"] == ["Qwen3ForCausalLM"]
    text = " ".join(result.output.split())
    assert "config.json, model.safetensors; 15 tensors, each bit-identical" in text
    assert "speculators layout (vLLM's), no specdraft manifest" in text
    assert "architectures ['Qwen3ForCausalLM']" in text


def test_speculators_to_sglang_and_back_keeps_the_verifier(tmp_path):
    save_draft(tiny_draft(), tmp_path / "s", layout="speculators", verifier="org/target",
               verifier_architectures=["MistralForCausalLM"])
    target = save_tiny_model("llama", tmp_path / "target", num_layers=5)
    runner = CliRunner()
    assert runner.invoke(app, ["convert", str(tmp_path / "s"), str(tmp_path / "o"), "--layout", "speculators",
                               "--target", str(target)]).exit_code == 0
    verifier = json.loads((tmp_path / "o" / "config.json").read_text())["speculators_config"]["verifier"]
    assert verifier == {"name_or_path": "org/target", "architectures": ["MistralForCausalLM"]}


def test_convert_to_the_sglang_layout_notes_a_flag_sglang_does_not_implement(tmp_path):
    save_draft(tiny_draft(norm_before_residual=True), tmp_path / "d", layout="speculators", verifier="t")
    target = save_tiny_model("llama", tmp_path / "target", num_layers=5)
    result = CliRunner().invoke(app, ["convert", str(tmp_path / "d"), str(tmp_path / "out"), "--layout",
                                      "sglang", "--target", str(target)])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "note: SGLang does not implement norm_before_residual" in text, text
    plain = CliRunner().invoke(app, ["convert", str(tmp_path / "d"), str(tmp_path / "out2"), "--layout",
                                     "speculators", "--target", str(target)])
    assert plain.exit_code == 0 and "note:" not in plain.output, plain.output  # vLLM implements it
