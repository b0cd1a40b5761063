"""`export_dflash`: a DFlash drafter for SGLang, vLLM and the speculators form, each config read
back as that engine reads it (`conventions.dflash_reads`), every tensor bit-identical, and the
launch line's setting serving the trained block; a target the drafter does not fit and EAGLE-3
options are one line."""

from __future__ import annotations

import json

import pytest
import torch

from specdraft.checkpoint.dflash import load_dflash_draft, save_dflash_draft
from specdraft.checkpoint.manifest import Manifest
from specdraft.conventions.dflash_reads import (
    TRAINED_ATTENTION,
    engine_attention,
    engine_aux_layers,
    vllm_reading,
)
from specdraft.dflash import DFlashDraft
from specdraft.errors import UnusableInput
from specdraft.export import ExportError
from specdraft.export.dflash import export_dflash, refuse_eagle3_options
from specdraft.export.refusals import ExportOptionError
from tests.support.dflash import tiny_dflash_cfg, tiny_dflash_draft

TARGET = {"num_layers": 4, "hidden_size": 32, "vocab_size": 50, "name_or_path": "/models/t"}


def trained(tmp_path, **target):
    draft = tiny_dflash_draft().float()
    manifest = Manifest(
        draft=draft.cfg.to_dict(), target={**TARGET, **target}, aux_layers=[1, 2, 3]
    )
    manifest.extra["method"] = "dflash"
    return draft, save_dflash_draft(draft, tmp_path / "run" / "draft", manifest)


@pytest.mark.parametrize("engine", ["sglang", "vllm", "speculators"])
def test_each_engine_reads_the_training_layers_block_and_attention(tmp_path, engine):
    draft, source = trained(tmp_path)
    result = export_dflash(source, tmp_path / engine, engine=engine)
    written = json.loads((result.out_dir / "config.json").read_text())
    reader = "sglang" if engine == "sglang" else "vllm"
    reading = vllm_reading(written)
    assert engine_aux_layers(reading, reader) == (1, 2, 3)
    assert engine_attention(reading, reader) == [TRAINED_ATTENTION] * 2
    back, manifest = load_dflash_draft(result.out_dir)
    assert back.cfg == draft.cfg and manifest.extra["export"] == {"engine": engine}
    assert all(torch.equal(back.state_dict()[k], v) for k, v in draft.state_dict().items())
    assert result.num_tensors == len(draft.state_dict())
    assert result.block_size == 4


def test_the_launch_lines_serve_the_trained_block(tmp_path):
    _, source = trained(tmp_path)
    sglang = export_dflash(source, tmp_path / "s", engine="sglang")
    assert "--speculative-algorithm DFLASH" in sglang.launch_command
    assert sglang.launch_command.endswith("--speculative-num-draft-tokens 4")
    assert sglang.launch_command.startswith("python -m sglang.launch_server --model-path /models/t")
    vllm = export_dflash(source, tmp_path / "v", engine="vllm")
    spec = json.loads(vllm.launch_command.split("--speculative-config ")[1].strip("'"))
    assert spec == {"method": "dflash", "model": str(vllm.out_dir), "num_speculative_tokens": 3}
    spec_export = export_dflash(source, tmp_path / "p", engine="speculators")
    written = json.loads((spec_export.out_dir / "config.json").read_text())
    assert written["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 3
    assert written["speculators_config"]["verifier"]["name_or_path"] == "/models/t"
    assert spec_export.launch_command == f"vllm serve {spec_export.out_dir}"


def test_the_zlab_form_keeps_block_size_where_each_reader_looks(tmp_path):
    _, source = trained(tmp_path)
    written = export_dflash(source, tmp_path / "s", engine="sglang").config
    assert written["block_size"] == written["dflash_config"]["block_size"] == 4
    assert written["dflash_config"]["target_layer_ids"] == [0, 1, 2]
    assert written["layer_types"] == ["full_attention"] * 2
    assert written["architectures"] == ["DFlashDraftModel"]


def test_a_target_of_other_sizes_is_refused_and_nothing_is_written(tmp_path):
    _, source = trained(tmp_path, num_layers=6)
    with pytest.raises(ExportError, match="6 layers and 50 ids, but the drafter was trained on a"):
        export_dflash(source, tmp_path / "out", engine="vllm")
    assert not (tmp_path / "out").exists()


def test_eagle3_options_are_one_line():
    """One grammatical line for one option or several; an unusable input (the CLI exits 2)."""
    with pytest.raises(
        ExportOptionError, match=r"^--topk: an EAGLE-3 setting, and D is a DF.*drop it$"
    ):
        refuse_eagle3_options("D", ["--num-steps", "--topk"])
    with pytest.raises(
        ExportOptionError, match=r"^--topk, --aux-layers: EAGLE-3 settings, and D .*drop them$"
    ):
        refuse_eagle3_options("D", ["--topk", "--aux-layers"])
    assert issubclass(ExportOptionError, UnusableInput) and issubclass(
        ExportOptionError, ExportError
    )
    refuse_eagle3_options("D", [])
    refuse_eagle3_options("D", ["--num-steps"])


def test_vllm_drafts_fewer_than_the_block_and_sglang_only_the_block(tmp_path):
    _, source = trained(tmp_path)  # block 4: 3 drafts after the anchor
    fewer = export_dflash(source, tmp_path / "v", engine="vllm", num_steps=2)
    spec = json.loads(fewer.launch_command.split("--speculative-config ")[1].strip("'"))
    assert spec["num_speculative_tokens"] == 2 == fewer.num_speculative_tokens
    assert any("vLLM drafts 2 of the 3 trained positions" in n for n in fewer.notes)
    full = export_dflash(source, tmp_path / "w", engine="vllm", num_steps=3)
    assert full.num_speculative_tokens == 3
    with pytest.raises(ExportError, match=r"--num-steps 4: .* blocks of 4 .* give 1\.\.3$"):
        export_dflash(source, tmp_path / "x", engine="vllm", num_steps=4)
    with pytest.raises(ExportError, match="DFLASH worker would draft a block of .*-tokens 3, unl"):
        export_dflash(source, tmp_path / "s", engine="sglang", num_steps=2)
    assert export_dflash(
        source, tmp_path / "t", engine="sglang", num_steps=3
    ).launch_command.endswith("--speculative-num-draft-tokens 4")
    with pytest.raises(ExportError, match="speculators form serves the trained block of 4"):
        export_dflash(source, tmp_path / "p", engine="speculators", num_steps=1)
    assert not any((tmp_path / d).exists() for d in ("x", "s", "p"))


def test_a_target_tokenizer_with_the_mask_text_elsewhere_is_refused(tmp_path):
    from tests.support.tiny_models import save_tiny_model
    from tests.support.tiny_tokenizer import tiny_chat_tokenizer

    draft = DFlashDraft(tiny_dflash_cfg(vocab_size=128, mask_token_id=85))
    target = {"num_layers": 4, "hidden_size": 32, "vocab_size": 128}
    manifest = Manifest(draft=draft.cfg.to_dict(), target=target, aux_layers=[1, 2, 3])
    source = save_dflash_draft(draft, tmp_path / "draft", manifest)
    target_dir = save_tiny_model("llama", tmp_path / "target", vocab_size=128)
    tokenizer = tiny_chat_tokenizer()
    tokenizer.add_tokens(["extra"])
    tokenizer.add_special_tokens({"mask_token": "<|MASK|>"})  # id 86, not the drafter's 85
    tokenizer.save_pretrained(target_dir)
    with pytest.raises(ExportError) as raised:
        export_dflash(source, tmp_path / "out", "sglang", target=target_dir)
    assert "holds '<|MASK|>' at id 86, the drafter's mask token is 85" in str(raised.value)
    assert not (tmp_path / "out").exists()
