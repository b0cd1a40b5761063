"""Drafter files as the field publishes them: ModelOpt's d2t without t2d, draft architectures no
engine (or only an engine) loads. Loader and doctor give the same verdict."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from specdraft.checkpoint import CheckpointError, load_draft, save_draft
from specdraft.data.vocab import t2d_from_d2t
from specdraft.doctor import run_doctor
from specdraft.export import export_draft
from tests.support.drafts import tiny_draft
from tests.support.tiny_models import save_tiny_model


@pytest.fixture
def modelopt(tmp_path):
    """(drafter dir without t2d, target dir, the model saved)."""
    model = tiny_draft()
    save_draft(model, tmp_path / "d", layout="sglang")
    file = tmp_path / "d" / "model.safetensors"
    tensors = load_file(str(file))
    del tensors["t2d"]
    save_file(tensors, str(file))
    return tmp_path / "d", save_tiny_model("llama", tmp_path / "target", num_layers=5), model


def test_a_missing_t2d_is_derived_from_d2t(modelopt):
    directory, _, model = modelopt
    loaded = load_draft(directory, target_num_layers=5).model
    assert torch.equal(loaded.t2d, model.t2d) and loaded.t2d.dtype == torch.bool
    assert torch.equal(t2d_from_d2t(model.d2t, 128), model.t2d)
    finding = run_doctor(directory, engine="sglang").finding("specdraft_loads")
    assert finding.verdict == "pass" and "t2d derived from d2t" in finding.evidence


@pytest.mark.parametrize("engine", ["sglang", "vllm", "speculators"])
def test_export_writes_the_derived_t2d(modelopt, tmp_path, engine):
    directory, target, model = modelopt
    export_draft(directory, tmp_path / "out", engine=engine, target=target)
    assert torch.equal(load_file(str(tmp_path / "out" / "model.safetensors"))["t2d"], model.t2d)


def set_architectures(directory, architectures):
    config = json.loads((directory / "config.json").read_text())
    config["architectures"] = architectures
    (directory / "config.json").write_text(json.dumps(config))


def test_a_draft_architecture_no_engine_loads(tmp_path):
    save_draft(tiny_draft(), tmp_path / "d", layout="sglang")
    set_architectures(tmp_path / "d", ["GptOssForCausalLMEagle3"])
    with pytest.raises(
        CheckpointError,
        match=r"\['GptOssForCausalLMEagle3'\] is a draft architecture specdraft "
        r"does not implement .*neither SGLang 0\.5\.23 nor vLLM 0\.32 registers it",
    ) as refused:
        load_draft(tmp_path / "d", target_num_layers=5)
    report = run_doctor(tmp_path / "d")
    assert report.finding("specdraft_loads").evidence == str(refused.value)
    keys = report.finding("keys_match_engine")
    assert keys.verdict == "fail"
    assert (
        "SGLang would not load this drafter: architectures ['GptOssForCausalLMEagle3'] is no EAGLE-3"
        in keys.evidence
    )
    assert "vLLM would not load this drafter" in keys.evidence and "registry.py" in keys.evidence


def test_an_architecture_only_vllm_registers_names_it(tmp_path):
    save_draft(tiny_draft(), tmp_path / "d", layout="sglang")
    set_architectures(tmp_path / "d", ["Eagle3Qwen3ForCausalLM"])
    with pytest.raises(CheckpointError, match="vLLM 0.32 registers it: serve it there"):
        load_draft(tmp_path / "d", target_num_layers=5)
    keys = run_doctor(tmp_path / "d").finding("keys_match_engine")
    assert (
        "SGLang would not load this drafter" in keys.evidence
        and "vLLM loads all 15 tensors" in keys.evidence
    )
