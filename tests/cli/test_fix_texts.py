"""Refusals name the command-line flag and the remedy that fits (issue #20 item 10): export's
SGLang-version refusal names --sglang-version; a drafter whose own max positions are short is told
to keep requests within them (not to serve another target), as the engine's length refusal says;
generate's error starts its own line after the echoed prompt; doctor draws no transformers bar."""

from __future__ import annotations

import json

import pytest

from specdraft.checkpoint import convert_draft
from specdraft.doctor import run_doctor
from tests.support.cli import cli_args, flat, invoke
from tests.support.doctor_helpers import draft_checkpoint, edit_config, one_thread  # noqa: F401
from tests.support.tiny_models import save_tiny_model
from tests.support.tiny_tokenizer import save_tiny_tokenizer


def test_export_names_the_sglang_version_flag(tmp_path):
    # index 1 first: SGLang < 0.5.13 writes it on DeepSeek-class targets, >= 0.5.13 cannot
    draft, _ = draft_checkpoint(tmp_path, arch="deepseek_v3", num_layers=8, aux=(1, 4, 5))
    result = invoke(["export", str(draft), str(tmp_path / "out"), "--engine", "sglang"])
    text = flat(result.output)
    assert (
        result.exit_code == 1
        and (
            "on DeepSeek-class targets in SGLang >= 0.5.13: first id 1 reads as index 2, 0 as 0; "
            "pass --sglang-version if you serve SGLang < 0.5.13, which can"
        )
        in text
    ), text
    assert "sglang_version" not in text


def test_a_drafter_with_short_max_positions_is_told_to_keep_requests_within_them(tmp_path):
    draft, target = draft_checkpoint(tmp_path)  # the tiny target: 256 positions
    edit_config(draft, lambda c: c.update(max_position_embeddings=128))
    manifest = json.loads((draft / "specdraft_manifest.json").read_text())
    manifest["draft"]["max_position_embeddings"] = 128  # trained so: the config is as trained
    (draft / "specdraft_manifest.json").write_text(json.dumps(manifest))
    finding = run_doctor(draft, target=target).finding(
        "rope_matches_training"
    )  # its own choice: no fail
    assert finding.verdict == "pass" and "max positions 128: as trained" in finding.evidence, (
        finding
    )
    assert (
        "the drafter's own 128 positions are fewer than the target's 256: keep prompt + output within 128"
        in finding.evidence
    )
    assert "serve the target the drafter was trained on" not in finding.fix


@pytest.fixture(scope="module")
def target_with_tokenizer(tmp_path_factory):
    path = save_tiny_model("llama", tmp_path_factory.mktemp("tok") / "target")
    save_tiny_tokenizer(path)
    return path


def test_generate_refuses_a_too_long_request_before_echoing_the_prompt(target_with_tokenizer):
    """A request past the engine's limits is refused before the prompt is echoed: stdout (a file
    the text is piped to) stays empty, the error is stderr's one line."""
    result = invoke(
        cli_args("generate", target=target_with_tokenizer, prompt="hello how", max_new_tokens=300)
    )
    assert result.exit_code == 1, result.output
    assert result.stdout == ""
    assert result.stderr.startswith("error: prompt ") and len(result.stderr.splitlines()) == 1
    assert (
        "exceeds the target's max_position_embeddings 256: ask for at most 253 new tokens"
        in flat(result.stderr)
    )


def test_doctor_on_a_deepseek_target_draws_no_loading_bar(tmp_path, capfd):
    from transformers.utils import logging as hf_logging

    draft, target = draft_checkpoint(tmp_path, arch="deepseek_v3", num_layers=8, aux=(2, 4, 5))
    capfd.readouterr()
    assert hf_logging.is_progress_bar_enabled()
    report = run_doctor(draft, target=target)
    assert report.finding("aux_width_on_target").verdict == "pass"  # it loaded and ran the target
    captured = capfd.readouterr()
    assert "Loading weights" not in captured.err + captured.out and "it/s" not in captured.err
    assert hf_logging.is_progress_bar_enabled()


def test_doctor_command_on_a_deepseek_target_draws_no_loading_bar(tmp_path):
    from transformers.utils import logging as hf_logging

    draft, target = draft_checkpoint(tmp_path, arch="deepseek_v3", num_layers=8, aux=(2, 4, 5))
    result = invoke(["doctor", str(draft), "--target", str(target)])
    assert "aux_width_on_target" in result.output  # it loaded and ran the target
    assert "Loading weights" not in result.output and "it/s]" not in result.output, result.output
    assert hf_logging.is_progress_bar_enabled()  # the user's setting comes back after the command


def test_inspect_names_the_drafters_method(tmp_path):
    """The summary says which method the drafter is (eagle3, eagle3.1: its norm flags), or which
    other EAGLE-3 variant."""
    plain, _ = draft_checkpoint(tmp_path / "plain")
    variant, _ = draft_checkpoint(
        tmp_path / "variant", draft_kw={"norm_before_residual": True, "norm_output": True}
    )
    eagle31, _ = draft_checkpoint(tmp_path / "e31", draft_kw={"fc_norm": True, "norm_output": True})
    assert "method: eagle3 (no norm flag)" in flat(invoke(["inspect", str(plain)]).output)
    assert "method: eagle3.1 (fc_norm, norm_output)" in flat(
        invoke(["inspect", str(eagle31)]).output
    )
    result = invoke(["inspect", str(variant)])
    assert result.exit_code == 0 and (
        "method: EAGLE-3 variant (norm_before_residual, norm_output)" in flat(result.output)
    ), result.output
    convert_draft(eagle31, tmp_path / "bare", layout="sglang", target_num_layers=5)  # no manifest
    bare = flat(invoke(["inspect", str(tmp_path / "bare")]).output)  # no --target: the files alone
    assert "method: eagle3.1 (fc_norm, norm_output) (config.json's norm flags)" in bare, bare
