"""What doctor reads as the engines' evidence: `--engine sglang` means SGLang's rules only (issue
#34 item 11, the seeds' case: a Kimi-K2.5 / DeepSeek-V3 target served by SGLang, a drafter
trained with the embeddings among its aux layers, which vLLM cannot capture there)."""

from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner

from specdraft.cli import app
from specdraft.doctor import run_doctor
from specdraft.export import export_draft
from specdraft.targets import load_target
from tests.support.doctor_helpers import (  # noqa: F401
    one_thread,
    random_samples,
    train_on_store,
    unsupported_target,
    write_samples,
)
from tests.support.tiny_models import save_tiny_model

AUX = (0, 3, 5)  # index 0: the embeddings, capturable by SGLang >= 0.5.14 on DeepSeek, not vLLM


def test_kimi_on_sglang_with_the_embeddings_among_aux_layers_passes(tmp_path):
    """export --engine sglang --sglang-version 0.5.23 (nested ids only: "serve this export with
    sglang only"), then doctor --engine sglang --sglang-version 0.5.23 with the export's own
    launch line: no check fails on vLLM's grounds and offline acceptance is measured, a pass."""
    target_dir = save_tiny_model("kimi_k25", tmp_path / "target", num_layers=7)
    samples = random_samples(96)
    with torch.random.fork_rng(devices=[]):
        run = train_on_store(load_target(target_dir), samples, tmp_path, AUX, 120)
    write_samples(tmp_path / "s.jsonl", samples[:16])
    out = tmp_path / "out"
    result = export_draft(
        run.draft_dir, out, engine="sglang", target=target_dir, sglang_version="0.5.23", num_steps=1
    )
    assert "eagle_aux_hidden_state_layer_ids" not in result.config  # vLLM cannot capture index 0
    assert any("serve this export with sglang only" in note for note in result.notes)
    report = run_doctor(
        out,
        target=target_dir,
        engine="sglang",
        sglang_version="0.5.23",
        engine_args=result.launch_command,
        samples=tmp_path / "s.jsonl",
    )
    assert report.ok, [f for f in report.findings if f.verdict == "fail"]
    for check in ("aux_ids_read_alike", "engine_captures_training_layers", "aux_width_on_target"):
        assert report.finding(check).verdict == "pass", report.finding(check)
        assert "vLLM" not in report.finding(check).evidence
    offline = report.finding("offline_acceptance_matches_training")
    assert offline.verdict == "pass" and "aux layers [0, 3, 5]" in offline.evidence, offline


@pytest.mark.parametrize(
    ("config_class", "architecture"),
    [("Olmo2Config", "Olmo2ForCausalLM")],
)
def test_unsupported_target_class_is_named_and_strict_fails(tmp_path, config_class, architecture):
    """doctor on a target class no engine rule covers (issue #34 item 10): the checks that read
    aux ids by class skip naming the class and saying no engine rule is known for it, never
    advising --target (it was passed); the other checks still run; --strict exits 1."""
    draft, target = unsupported_target(tmp_path, config_class)
    report = run_doctor(draft, target=target, engine="sglang")
    for check in ("aux_ids_read_alike",):
        finding = report.finding(check)
        assert finding.verdict == "skip", finding
        assert f"no engine rule is known for the target class {architecture}" in finding.evidence
        assert "--target" not in finding.fix + finding.evidence
    assert report.finding("keys_match_engine").verdict == "pass"
    (note,) = [n for n in report.notes if "no engine rule is known" in n]
    assert "skipped aux_ids_read_alike" in note and note.endswith("the other checks ran")
    assert "--target" not in report.skips_enabled_by()
    result = CliRunner().invoke(
        app,
        ["doctor", str(draft), "--target", str(target), "--engine", "sglang", "--strict"],
        env={"COLUMNS": "200"},
    )
    assert result.exit_code == 1, result.output
    assert "no engine rule is known for the target class" in " ".join(result.output.split())


@pytest.mark.parametrize("config_class", ["Qwen3_5TextConfig", "Gemma4TextConfig"])
def test_qwen3_5_and_gemma4_targets_get_engine_rules_in_doctor(tmp_path, config_class):
    """vLLM 0.32.0 serves EAGLE-3 on Qwen3.5 and Gemma 4 (SupportsEagle3): doctor reads the
    export's ids by their rows instead of skipping the class as unknown."""
    draft, target = unsupported_target(tmp_path, config_class)
    export_draft(draft, tmp_path / "vllm", engine="vllm", target=target)
    report = run_doctor(tmp_path / "vllm", target=target, engine="vllm")
    finding = report.finding("aux_ids_read_alike")
    assert finding.verdict == "pass", finding
    assert not [n for n in report.notes if "no engine rule is known" in n]
    # a target directory without tokenizer files: no tokenizer (transformers builds an empty
    # Qwen3_5Tokenizer of length 1 from none), not "d2t past the tokenizer's 1 tokens"
    assert not [f.check for f in report.findings if f.verdict == "fail"]
    assert report.finding("vocab_map_valid").verdict == "pass"
