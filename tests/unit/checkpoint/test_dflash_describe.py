"""`describe_dflash`: what inspect says of a DFlash drafter (block, mask token, both layer
numberings, each engine's reading) and its audit of non-finite tensors."""

from __future__ import annotations

import json

import torch
from safetensors.torch import load_file, save_file

from specdraft.checkpoint.dflash import save_dflash_draft
from specdraft.checkpoint.dflash_describe import describe_dflash
from specdraft.checkpoint.manifest import Manifest
from tests.support.dflash import tiny_dflash_draft


def saved(tmp_path):
    draft = tiny_dflash_draft().float()
    manifest = Manifest(draft=draft.cfg.to_dict(), target={"num_layers": 4}, aux_layers=[1, 2, 3])
    manifest.extra["method"] = "dflash"
    return save_dflash_draft(draft, tmp_path / "draft", manifest)


def test_the_lines_name_block_mask_layers_and_each_engines_reading(tmp_path):
    seen = describe_dflash(saved(tmp_path))
    text = "\n".join(seen.lines)
    assert "DFlashDraftModel config" in seen.lines[0] and "with specdraft manifest" in seen.lines[0]
    assert "block size 4 (anchor + 3 drafts); mask token 49; 2 draft layers" in text
    assert "(DFlash, 0-based) [0, 1, 2] of 4 = aux layers (specdraft indices) [1, 2, 3]" in text
    assert "SGLang reads: aux layers [1, 2, 3]; draft attention full, bidirectional" in text
    assert "served by --speculative-num-draft-tokens 4" in text
    assert "vLLM reads: aux layers [1, 2, 3]" in text and "num_speculative_tokens 3" in text
    assert seen.problems == []


def test_a_config_vllm_reads_otherwise_shows_in_its_line(tmp_path):
    out = saved(tmp_path)
    config = json.loads((out / "config.json").read_text())
    config["eagle_aux_hidden_state_layer_ids"] = [2, 3, 4]  # vLLM reads this list first
    (out / "config.json").write_text(json.dumps(config))
    text = "\n".join(describe_dflash(out).lines)
    assert (
        "SGLang reads: aux layers [1, 2, 3]" in text and "vLLM reads: aux layers [2, 3, 4]" in text
    )


def test_a_nan_tensor_fails_the_audit(tmp_path):
    out = saved(tmp_path)
    tensors = load_file(out / "model.safetensors")
    tensors["norm.weight"][0] = float("nan")
    save_file(tensors, out / "model.safetensors")
    assert describe_dflash(out).problems == ["tensors with NaN or inf values: norm.weight"]
    assert torch.isnan(describe_dflash(out).model.norm.weight).any()
