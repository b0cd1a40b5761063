"""What the engines make of a manifest-less drafter's config.json, said by inspect, convert and
export (`checkpoint.config_notes`), and the drafters the engines serve that specdraft now reads
(issue #34 items 2, 4, 5): a full-vocabulary drafter without d2t / t2d nor draft_vocab_size (the
identity map; SGLang runs the target's lm_head), vLLM's class name Eagle3LlamaForCausalLM, and
tie_word_embeddings true (SGLang runs the embedding as the head)."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from specdraft.checkpoint import load_draft
from specdraft.cli import app
from specdraft.doctor import run_doctor
from specdraft.export import export_draft
from tests.support.doctor_helpers import draft_checkpoint, edit_config, edit_weights, one_thread  # noqa: F401

VOCAB = 128  # the tiny target's vocabulary


def cli(*args) -> tuple[int, str]:
    result = CliRunner().invoke(app, [str(a) for a in args], env={"COLUMNS": "400"})
    return result.exit_code, " ".join(result.output.split())


@pytest.fixture
def full_vocab(tmp_path):
    """(a drafter whose lm_head spans the target's vocabulary, with neither d2t, t2d nor
    draft_vocab_size, as TorchSpec's Kimi drafters; its target)."""
    draft, target = draft_checkpoint(tmp_path, layout="sglang", draft_vocab_size=VOCAB)
    edit_config(draft, lambda c: c.pop("draft_vocab_size"))
    edit_weights(draft, lambda t: (t.pop("d2t"), t.pop("t2d")))
    return draft, target


def test_a_full_vocabulary_drafter_reads_as_the_identity_map(full_vocab):
    draft, target = full_vocab
    loaded = load_draft(draft, target_num_layers=5)
    assert loaded.derived == ("d2t", "t2d") and loaded.model.cfg.draft_vocab_size == VOCAB
    assert torch.equal(loaded.model.d2t, torch.zeros(VOCAB, dtype=torch.int64))
    assert bool(loaded.model.t2d.all())
    code, said = cli("inspect", draft, "--target", target)
    assert code == 0 and "audit: PASS" in said
    assert (
        "note: config.json has no draft_vocab_size: SGLang runs the target's lm_head in place of "
        "the trained one" in said
    )
    assert "vLLM 0.32 and specdraft run the file's lm_head.weight" in said


def test_doctor_compares_the_head_sglang_runs_with_the_trained_one(full_vocab):
    """SGLang loads the target's lm_head when draft_vocab_size is absent: a trained head that
    differs fails for SGLang, one identical to the target's passes."""
    draft, target = full_vocab
    finding = run_doctor(draft, target=target, engine="sglang").finding(
        "embedding_and_head_as_trained"
    )
    assert finding.verdict == "fail" and "which differs from it" in finding.evidence
    from safetensors.torch import load_file

    head = load_file(str(target / "model.safetensors"))["lm_head.weight"]
    edit_weights(draft, lambda t: t.update({"lm_head.weight": head.clone()}))
    finding = run_doctor(draft, target=target, engine="sglang").finding(
        "embedding_and_head_as_trained"
    )
    assert (
        finding.verdict == "pass" and "identical to the drafter's trained one" in finding.evidence
    )


def test_export_writes_the_identity_map_and_says_draft_vocab_size_is_new(full_vocab, tmp_path):
    draft, target = full_vocab
    result = export_draft(draft, tmp_path / "out", engine="vllm", target=target)
    assert result.derived == ("d2t", "t2d") and result.config["draft_vocab_size"] == VOCAB
    assert any(
        "values written otherwise than the source's: draft_vocab_size absent -> 128" in n
        for n in result.notes
    )


@pytest.mark.parametrize(
    "name",
    [
        "Eagle3LlamaForCausalLM",
        "Eagle3Qwen2_5vlForCausalLM",
        "Eagle3Qwen3vlForCausalLM",
        "Eagle3MiniMaxM2ForCausalLM",
    ],
)
def test_vllms_class_name_reads_as_the_official_drafter(tmp_path, name):
    """AngelSlim saves architectures ["Eagle3LlamaForCausalLM"], vLLM's name of the same network
    (vLLM 0.32's registry maps its Qwen2.5-VL / Qwen3-VL / MiniMax-M2 names to the same class):
    it loads; inspect says SGLang does not register it; convert writes the official name, saying so."""
    draft, target = draft_checkpoint(tmp_path, layout="sglang")
    edit_config(draft, lambda c: c.update(architectures=[name]))
    official = load_draft(draft, target_num_layers=5)
    assert official.layout == "sglang"
    code, said = cli("inspect", draft, "--target", target)
    assert code == 0 and "read as LlamaForCausalLMEagle3" in said
    assert "SGLang 0.5.23 registers only LlamaForCausalLMEagle3" in said
    code, said = cli("convert", draft, tmp_path / "out", "--layout", "sglang", "--target", target)
    assert code == 0, said
    assert f'architectures ["{name}"] -> ["LlamaForCausalLMEagle3"]' in said
    finding = run_doctor(draft, target=target, engine="sglang").finding("keys_match_engine")
    assert (
        finding.verdict == "fail"
        and "no EAGLE-3 draft architecture it registers" in finding.evidence
    )


def test_a_tied_head_is_said_by_inspect_and_export(tmp_path):
    """tie_word_embeddings true: SGLang runs the embedding as the head; inspect says so, export
    (which writes false, the head vLLM and specdraft run) says it changed the value."""
    draft, target = draft_checkpoint(tmp_path, layout="sglang")
    edit_config(draft, lambda c: c.update(tie_word_embeddings=True))
    code, said = cli("inspect", draft, "--target", target)
    assert code == 0 and "note: tie_word_embeddings true: SGLang uses the embedding" in said
    result = export_draft(draft, tmp_path / "out", engine="vllm", target=target)
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    assert written["tie_word_embeddings"] is False
    assert any("tie_word_embeddings true -> false" in n for n in result.notes)


def test_the_trainer_architecture_loads_for_vllm_and_fails_for_sglang(tmp_path):
    """architectures ["LlamaForCausalLM"] (the official EAGLE-3 trainer's): vLLM serves the
    drafter (EAGLEConfig renames it Eagle3LlamaForCausalLM), SGLang builds its plain Llama."""
    draft, target = draft_checkpoint(tmp_path, layout="sglang")
    edit_config(draft, lambda c: c.update(architectures=["LlamaForCausalLM"]))
    assert load_draft(draft, target_num_layers=5).layout == "sglang"
    vllm = run_doctor(draft, target=target, engine="vllm").finding("keys_match_engine")
    sglang = run_doctor(draft, target=target, engine="sglang").finding("keys_match_engine")
    assert vllm.verdict == "pass", vllm
    assert sglang.verdict == "fail" and "would not load this drafter" in sglang.evidence
