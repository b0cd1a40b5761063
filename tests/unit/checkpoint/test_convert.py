"""`specdraft convert --layout sglang` writes the plain official layout; `--layout specdraft`
the same files plus specdraft's manifest (they once wrote identical directories)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from specdraft.checkpoint import MANIFEST_FILE, load_draft, save_draft
from specdraft.cli import app
from tests.support.doctor_helpers import draft_checkpoint
from tests.support.drafts import tiny_draft, tiny_manifest


def convert(src, dst, layout: str, *options: str):
    result = CliRunner().invoke(
        app,
        ["convert", str(src), str(dst), "--layout", layout, *options],
        env={"COLUMNS": "400", "TERMINAL_WIDTH": "400"},
    )
    assert result.exit_code == 0, result.output
    return " ".join(result.output.split())


def files(directory) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def test_sglang_and_specdraft_layouts_differ_exactly_by_the_manifest(tmp_path):
    model = tiny_draft()
    manifest = tiny_manifest(model)
    src = save_draft(model, tmp_path / "src", layout="specdraft", manifest=manifest)
    said_sglang = convert(src, tmp_path / "sglang", "sglang")
    said_specdraft = convert(src, tmp_path / "specdraft", "specdraft")
    sglang, specdraft = files(tmp_path / "sglang"), files(tmp_path / "specdraft")
    assert MANIFEST_FILE not in sglang
    assert set(specdraft) - set(sglang) == {MANIFEST_FILE} and set(sglang) <= set(specdraft)
    assert all(sglang[name] == specdraft[name] for name in sglang)  # config.json, model.safetensors
    assert json.loads(specdraft[MANIFEST_FILE]) == json.loads(manifest.to_json())
    assert "no specdraft manifest" in said_sglang and "specdraft manifest (" not in said_sglang
    assert "+ specdraft manifest" in said_specdraft and "left out" not in said_specdraft
    assert (
        "manifest is left out of the official layout (--layout specdraft keeps it)" in said_sglang
    )


def test_the_sglang_layout_reads_back_to_the_same_drafter(tmp_path):
    """Lossless without the manifest: the config alone rebuilds the drafter (given the target's depth)."""
    model = tiny_draft()
    src = save_draft(model, tmp_path / "src", layout="specdraft", manifest=tiny_manifest(model))
    convert(src, tmp_path / "sglang", "sglang")
    back = load_draft(tmp_path / "sglang", target_num_layers=model.cfg.target_num_layers)
    assert back.layout == "sglang" and back.manifest is None and back.model.cfg == model.cfg


def test_a_config_that_reads_back_differently_is_refused(tmp_path, monkeypatch):
    """Without the manifest only config.json describes the drafter: convert proves it rebuilds the same one."""
    import pytest

    from specdraft.checkpoint import CheckpointError, config_write, convert_draft

    model = tiny_draft()
    src = save_draft(model, tmp_path / "src", layout="specdraft", manifest=tiny_manifest(model))
    real = config_write.base_llama_config
    monkeypatch.setattr(
        config_write,
        "base_llama_config",
        lambda cfg, dtype: {**real(cfg, dtype), "rms_norm_eps": 0.5},
    )
    with pytest.raises(
        CheckpointError, match=r"config reads back differently: rms_norm_eps 1e-0\d -> 0.5"
    ):
        convert_draft(src, tmp_path / "sglang", layout="sglang")


@pytest.mark.parametrize("layout", ["sglang", "speculators"])
@pytest.mark.parametrize("names", ["midlayer", "layers.0"])
def test_convert_writes_either_layer_name_on_request(tmp_path, layout, names):
    """--layer-names writes the decoder layer as SGLang's midlayer.* or ModelOpt's layers.0.*
    (issue #34 item 1); the written drafter reads back bit-identical."""
    model = tiny_draft()
    src = save_draft(model, tmp_path / "src", layout="specdraft", manifest=tiny_manifest(model))
    output = convert(src, tmp_path / "out", layout, "--layer-names", names)
    note = "note: SGLang before 0.5.12 skips layers.0.* tensors without a word"
    assert (note in output) == (names == "layers.0")  # a fresh user read "loaded by SGLang" alone
    keys = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert sum(k.startswith(names + ".") for k in keys) == 10
    other = "layers.0." if names == "midlayer" else "midlayer."
    assert not any(k.startswith(other) for k in keys)
    back = load_draft(tmp_path / "out", target_num_layers=model.cfg.target_num_layers).model
    assert torch.equal(
        back.midlayer.self_attn.q_proj.weight, model.midlayer.self_attn.q_proj.weight
    )


def test_convert_refuses_unknown_layer_names(tmp_path):
    from specdraft.checkpoint import CheckpointError, convert_draft

    model = tiny_draft()
    src = save_draft(model, tmp_path / "src", layout="specdraft", manifest=tiny_manifest(model))
    with pytest.raises(CheckpointError, match="unknown layer names 'layers.1'"):
        convert_draft(src, tmp_path / "out", layout="sglang", layer_names="layers.1")


def _with_recorded_class(draft, target_class):
    """`draft`'s manifest rewritten as one written before its class had a rule: the recorded
    target_class replaced (None: removed), the architecture kept."""
    path = draft / MANIFEST_FILE
    manifest = json.loads(path.read_text())
    manifest["target"]["target_class"] = target_class
    path.write_text(json.dumps(manifest))
    return manifest["target"]


@pytest.mark.parametrize("layout", ["sglang", "specdraft"])
@pytest.mark.parametrize("version", ["0.5.15", "0.5.21"])
def test_an_old_qwen3_manifest_converts_by_the_qwen_rule_without_target(tmp_path, layout, version):
    """A manifest written before the qwen rule class says "llama" for a Qwen3 target; convert
    without --target reads the class from the recorded architecture, so SGLang 0.5.10-0.5.21
    get their index-0 ids (qwen2.py / qwen3.py capture the embeddings there; llama.py does not,
    and the llama reading left SGLang's key out)."""
    draft, _ = draft_checkpoint(tmp_path, arch="qwen3", num_layers=7, aux=(0, 3, 5))
    assert _with_recorded_class(draft, "llama")["architecture"] == "Qwen3ForCausalLM"
    convert(draft, tmp_path / "out", layout, "--sglang-version", version)
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [-1, 2, 4]
    assert config["eagle_aux_hidden_state_layer_ids"] == [0, 3, 5]


def test_a_manifest_naming_no_class_names_target_when_the_classes_read_the_ids_apart(tmp_path):
    """No architecture, no class recorded: aux layers 1, 3, 5 are SGLang ids 0, 2, 4 on Llama
    but ambiguous on DeepSeek (the first-id rule), so convert names --target in one line."""
    model = tiny_draft(num_layers=7, aux_layers=(1, 3, 5))
    src = save_draft(model, tmp_path / "src", layout="specdraft", manifest=tiny_manifest(model))
    result = CliRunner().invoke(
        app, ["convert", str(src), str(tmp_path / "out"), "--layout", "sglang"]
    )
    said = " ".join(result.output.split())
    assert result.exit_code == 1, said
    assert "records no target class" in said and "pass the target (--target DIR)" in said
    assert len(result.output.strip().splitlines()) == 1 and not (tmp_path / "out").exists()


def test_a_manifest_naming_no_class_converts_when_every_class_reads_the_ids_alike(tmp_path):
    model = tiny_draft()  # aux layers 2, 3, 4 of 5: SGLang 1, 2, 3 and vLLM 2, 3, 4 on every class
    src = save_draft(model, tmp_path / "src", layout="specdraft", manifest=tiny_manifest(model))
    convert(src, tmp_path / "out", "sglang")
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]
