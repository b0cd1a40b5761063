"""Doctor reads a drafter through the loader's own reader and reports, as separate findings, what
specdraft loads and what each engine release loads (conventions.DRAFT_LOADING)."""

import json

import pytest
from safetensors.torch import load_file, save_file

from specdraft.checkpoint import save_draft
from specdraft.doctor import run_doctor
from tests.support.drafts import tiny_draft


def sharded(tmp_path):
    """A tiny drafter saved as two safetensors shards and their index."""
    save_draft(tiny_draft(), tmp_path / "d", layout="sglang")
    tensors = load_file(str(tmp_path / "d" / "model.safetensors"))
    (tmp_path / "d" / "model.safetensors").unlink()
    names = sorted(tensors)
    weight_map = {}
    for i, part in enumerate((names[:5], names[5:])):
        shard = f"model-0000{i + 1}-of-00002.safetensors"
        save_file({k: tensors[k] for k in part}, str(tmp_path / "d" / shard))
        weight_map.update(dict.fromkeys(part, shard))
    (tmp_path / "d" / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": weight_map})
    )
    return tmp_path / "d"


def test_a_sharded_drafter_is_read_like_the_loader_reads_it(tmp_path):
    report = run_doctor(sharded(tmp_path))
    loads = report.finding("specdraft_loads")
    assert (
        loads.verdict == "pass" and "15 tensors of model.safetensors.index.json" in loads.evidence
    )
    assert (
        report.finding("keys_match_engine").evidence
        == "SGLang loads all 15 tensors; vLLM loads all 15 tensors"
    )


def test_a_cut_shard_is_an_unusable_input_naming_it(tmp_path):
    """doctor cannot judge a drafter whose weights are cut short: one line (exit 2), as bad JSON."""
    directory = sharded(tmp_path)
    shard = directory / "model-00002-of-00002.safetensors"
    shard.write_bytes(shard.read_bytes()[:100])
    with pytest.raises(
        ValueError,
        match=r"model-00002-of-00002.safetensors: cannot be read as safetensors, cut short",
    ):
        run_doctor(directory)


def test_a_pinned_sglang_version_names_one_reading(tmp_path):
    save_draft(tiny_draft(), tmp_path / "d", layout="sglang")
    config = json.loads((tmp_path / "d" / "config.json").read_text())
    config["architectures"] = ["GptOssForCausalLMEagle3"]
    (tmp_path / "d" / "config.json").write_text(json.dumps(config))
    keys = run_doctor(tmp_path / "d", engine="sglang", sglang_version="0.5.23").finding(
        "keys_match_engine"
    )
    assert keys.verdict == "fail"
    assert keys.evidence.startswith(
        "SGLang would not load this drafter: architectures ['GptOssForCausalLMEagle3']"
    )
    assert "llama_eagle3.py" in keys.evidence


def test_a_drafter_without_manifest_is_not_told_that_export_copies_one(tmp_path):
    """Export keeps a manifest, never makes one: the skip's fix names what writes it instead."""
    save_draft(tiny_draft(), tmp_path / "d", layout="sglang")
    for check in ("tokenizer_matches_manifest", "chat_template_matches_manifest"):
        finding = run_doctor(tmp_path / "d").finding(check)
        assert finding.verdict == "skip" and "has no specdraft_manifest.json" in finding.evidence, (
            finding
        )
        assert (
            finding.fix.startswith("only `specdraft train` writes the manifest")
            and "copies" not in finding.fix
        )
        assert "exporting this one writes config.json and weights, no manifest" in finding.fix
