"""specdraft export: each engine's layout and ids, refusals with reasons, bit-identical tensors."""

from __future__ import annotations

import json
import shlex

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from specdraft.checkpoint import load_draft
from specdraft.cli import app
from specdraft.export import ExportError, export_draft
from tests.support.cli import cli_args
from tests.support.doctor_helpers import draft_checkpoint, edit_weights, one_thread  # noqa: F401


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """A 5-layer Llama target and a drafter on aux layers [2, 3, 4] (every engine can express)."""
    return draft_checkpoint(tmp_path_factory.mktemp("llama"))


def same_tensors(a, b) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    for name, tensor in sa.items():
        if name != "embed_tokens.weight":
            assert torch.equal(tensor, sb[name]), name


def test_sglang_export_layout_ids_and_launch_command(llama, tmp_path):
    draft, target = llama
    result = export_draft(draft, tmp_path / "out", engine="sglang", target=target, num_steps=4)
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config == result.config
    assert config["eagle_config"] == {
        "eagle_aux_hidden_state_layer_ids": [1, 2, 3],
        "use_aux_hidden_state": True,
    }
    assert config["eagle_aux_hidden_state_layer_ids"] == [2, 3, 4]
    assert (
        config["draft_vocab_size"],
        config["norm_before_residual"],
        config["tie_word_embeddings"],
        config["rope_theta"],
    ) == (64, False, False, 10000.0)
    keys = set(load_file(str(tmp_path / "out" / "model.safetensors")))
    assert "midlayer.self_attn.q_proj.weight" in keys and not any(
        k.startswith("layers.") for k in keys
    )
    exported = json.loads((tmp_path / "out" / "specdraft_manifest.json").read_text())
    assert exported.pop("extra") == {"export": {"engine": "sglang"}}  # what tune tells an export by
    source = json.loads((draft / "specdraft_manifest.json").read_text())
    assert source.pop("extra") == {} and exported == source  # the training record, unchanged
    assert result.num_tensors == len(keys)
    assert result.launch_command == (
        f"python -m sglang.launch_server --model-path {target.resolve()} --speculative-algorithm EAGLE3 "
        f"--speculative-draft-model-path {(tmp_path / 'out').resolve()} --speculative-num-steps 4 "
        "--speculative-eagle-topk 1 --speculative-num-draft-tokens 5"
    )
    same_tensors(load_draft(draft).model, load_draft(tmp_path / "out").model)


def test_vllm_export_writes_top_level_ids_and_chain_command(llama, tmp_path):
    draft, target = llama
    result = export_draft(draft, tmp_path / "v", engine="vllm", target=target, num_steps=5)
    assert result.config["eagle_aux_hidden_state_layer_ids"] == [2, 3, 4]
    words = shlex.split(result.launch_command)
    assert words[:3] == ["vllm", "serve", str(target.resolve())]
    assert json.loads(words[words.index("--speculative-config") + 1]) == {
        "method": "eagle3",
        "model": str((tmp_path / "v").resolve()),
        "num_speculative_tokens": 5,
    }


def test_export_casts_to_bf16_exactly(llama, tmp_path):
    """--dtype bf16: float tensors rounded to bfloat16 (each equal to the source's cast), d2t /
    t2d untouched, the config's torch_dtype says so; the source checkpoint is left as it was."""
    draft, target = llama
    before = load_file(str(draft / "model.safetensors"))
    result = export_draft(draft, tmp_path / "b", engine="vllm", target=target, dtype="bf16")
    written = load_file(str(tmp_path / "b" / "model.safetensors"))
    assert result.config["torch_dtype"] == "bfloat16"
    assert any("cast from torch.float32 to torch.bfloat16" in n for n in result.notes)
    assert written["d2t"].dtype == torch.int64 and written["t2d"].dtype == torch.bool
    assert torch.equal(written["d2t"], before["d2t"]) and torch.equal(written["t2d"], before["t2d"])
    floats = [k for k, v in before.items() if v.is_floating_point()]
    assert len(floats) > 5
    for name in floats:
        assert written[name].dtype == torch.bfloat16, name
        assert torch.equal(written[name], before[name].to(torch.bfloat16)), name
    after = load_file(str(draft / "model.safetensors"))
    assert all(torch.equal(after[k], before[k]) for k in before)


def test_speculators_export_names_verifier_and_round_trips(llama, tmp_path):
    draft, target = llama
    result = export_draft(draft, tmp_path / "s", engine="speculators", target=target, num_steps=2)
    config = result.config
    assert config["speculators_model_type"] == "eagle3" and config["norm_before_residual"] is False
    assert config["speculators_config"]["verifier"] == {
        "name_or_path": str(target.resolve()),
        "architectures": ["LlamaForCausalLM"],
    }
    assert config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 2
    assert "eagle_config" not in config and config["eagle_aux_hidden_state_layer_ids"] == [2, 3, 4]
    keys = set(load_file(str(tmp_path / "s" / "model.safetensors")))
    assert "layers.0.mlp.up_proj.weight" in keys and not any(
        k.startswith("midlayer.") for k in keys
    )
    assert any("must resolve on the serving host" in n for n in result.notes)
    assert result.launch_command == f"vllm serve {(tmp_path / 's').resolve()}"
    loaded = load_draft(tmp_path / "s")
    assert loaded.layout == "speculators" and loaded.manifest is not None
    same_tensors(load_draft(draft).model, loaded.model)


def test_speculators_verifier_name_is_written_as_given(llama, tmp_path):
    draft, _ = llama
    result = export_draft(draft, tmp_path / "s", engine="speculators", verifier="org/target-8b")
    assert result.config["speculators_config"]["verifier"]["name_or_path"] == "org/target-8b"


def test_export_refuses_an_aux_count_engines_cannot_feed(tmp_path):
    draft, _ = draft_checkpoint(
        tmp_path
    )  # then rewritten as a 2-aux drafter (save_draft refuses one)
    edit_weights(draft, lambda t: t.update({"fc.weight": t["fc.weight"][:, :64].contiguous()}))
    manifest = json.loads((draft / "specdraft_manifest.json").read_text())
    manifest["aux_layers"] = manifest["draft"]["aux_layers"] = [2, 4]
    (draft / "specdraft_manifest.json").write_text(json.dumps(manifest))
    assert load_draft(draft).model.cfg.n_aux == 2
    with pytest.raises(ExportError, match=r"hard-code 3 aux states .* fuses 2 \(layers \[2, 4\]\)"):
        export_draft(draft, tmp_path / "out", engine="vllm")
    assert not (tmp_path / "out").exists()


def test_export_refuses_deepseek_ids_whose_reading_depends_on_sglang_version(tmp_path):
    draft, target = draft_checkpoint(tmp_path, arch="deepseek_v3", num_layers=8, aux=(3, 4, 5))
    with pytest.raises(ExportError, match="read differently by SGLang version on DeepSeek-class"):
        export_draft(draft, tmp_path / "out", engine="sglang", target=target)
    old = export_draft(
        draft, tmp_path / "old", engine="sglang", target=target, sglang_version="0.5.12"
    )
    new = export_draft(
        draft, tmp_path / "new", engine="sglang", target=target, sglang_version="0.5.14"
    )
    assert old.config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 3, 4]
    assert new.config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [3, 4, 5]


def test_export_refuses_invalid_speculative_settings(llama, tmp_path):
    draft, _ = llama
    with pytest.raises(ExportError, match=r"num_draft_tokens must be num_steps \+ 1 = 2"):
        export_draft(
            draft, tmp_path / "o", engine="sglang", num_steps=1, topk=1, num_draft_tokens=16
        )
    with pytest.raises(ExportError, match="drafts a chain"):
        export_draft(draft, tmp_path / "o", engine="vllm", topk=2, num_draft_tokens=4)
    with pytest.raises(ExportError, match="needs --num-draft-tokens in 2..11"):
        export_draft(draft, tmp_path / "o", engine="sglang", num_steps=3, topk=2)


def test_export_refuses_another_target(llama, tmp_path):
    draft, _ = llama
    other, _ = draft_checkpoint(tmp_path / "wide", hidden_size=64)
    with pytest.raises(ExportError, match=r"hidden_size 32 \(trained\) vs 64 \(target"):
        export_draft(draft, tmp_path / "o", engine="vllm", target=tmp_path / "wide" / "target")
    assert other.exists()


def test_cli_export_prints_launch_command_and_refuses_with_reason(llama, tmp_path):
    draft, target = llama
    runner = CliRunner()
    done = runner.invoke(
        app,
        cli_args("export", draft, tmp_path / "o", engine="sglang", target=target),
    )
    assert done.exit_code == 0, done.output
    assert "bit-identical" in done.output and "--speculative-algorithm EAGLE3" in done.output
    refused = runner.invoke(
        app,
        cli_args(
            "export", draft, tmp_path / "x", engine="sglang", num_steps=1, num_draft_tokens=16
        ),
    )
    assert (
        refused.exit_code == 2 and "num_steps 15 / num_draft_tokens 16" in refused.output
    )  # a usage error
