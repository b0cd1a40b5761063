"""export per target class (issue #22): the two DeepSeek fixes (SGLang's file is checked as
SGLang reads it; vLLM 0.32 captures index L on DeepSeek), and refusals naming the engine's reason."""

from __future__ import annotations

import pytest

from specdraft.export import ExportError, export_draft
from tests.support.doctor_helpers import draft_checkpoint


def test_deepseek_embeddings_export_for_sglang_reads_only_sglangs_key(tmp_path):
    draft, target = draft_checkpoint(tmp_path, arch="deepseek_v3", num_layers=8, aux=(0, 3, 6))
    result = export_draft(
        draft, tmp_path / "s", engine="sglang", target=target, sglang_version="0.5.14"
    )
    assert result.config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 3, 6]
    assert "eagle_aux_hidden_state_layer_ids" not in result.config  # vLLM cannot capture index 0
    assert any("serve this export with sglang only" in note for note in result.notes)
    with pytest.raises(ExportError, match="embeddings.*DeepSeek-class targets in vLLM"):
        export_draft(draft, tmp_path / "v", engine="vllm", target=target)


def test_deepseek_last_layer_exports_for_vllm(tmp_path):
    draft, target = draft_checkpoint(tmp_path, arch="deepseek_v3", num_layers=8, aux=(2, 4, 8))
    result = export_draft(draft, tmp_path / "v", engine="vllm", target=target)
    assert result.config["eagle_aux_hidden_state_layer_ids"] == [2, 4, 8]


def test_speculators_export_names_the_class_vllm_loads_for_kimi(tmp_path):
    draft, target = draft_checkpoint(tmp_path, arch="kimi_k25", num_layers=8, aux=(2, 4, 8))
    result = export_draft(draft, tmp_path / "s", engine="speculators", target=target)
    assert result.config["speculators_config"]["verifier"]["architectures"] == [
        "KimiK25ForConditionalGeneration"
    ]
    assert result.config["eagle_aux_hidden_state_layer_ids"] == [
        2,
        4,
        8,
    ]  # DeepSeek rules through the wrapper


def test_a_qwen3_manifest_recording_the_llama_class_reads_as_qwen(tmp_path):
    """Manifests written before the Qwen2/Qwen3 rule class recorded target_class "llama"; export
    without --target takes the class from the recorded architecture, so index 0 exports for
    SGLang 0.5.21 (qwen3.py captures the embeddings there; llama.py only from 0.5.22)."""
    import json

    from specdraft.checkpoint import MANIFEST_FILE

    draft, _ = draft_checkpoint(tmp_path, arch="qwen3", num_layers=7, aux=(0, 3, 5))
    manifest = json.loads((draft / MANIFEST_FILE).read_text())
    assert manifest["target"]["architecture"] == "Qwen3ForCausalLM"
    manifest["target"]["target_class"] = "llama"
    (draft / MANIFEST_FILE).write_text(json.dumps(manifest))
    result = export_draft(draft, tmp_path / "s", engine="sglang", sglang_version="0.5.21")
    assert result.config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [-1, 2, 4]
