"""inspect, export and doctor of a DFlash drafter from the command line: the lines a user reads,
the exit codes, the EAGLE-3-only options refused in one line."""

from __future__ import annotations

import json

import pytest

from specdraft.checkpoint.dflash import save_dflash_draft
from specdraft.checkpoint.manifest import Manifest
from tests.support.cli import flat, invoke, one_error
from tests.support.dflash import tiny_dflash_draft
from tests.support.doctor_helpers import edit_config
from tests.support.tiny_models import save_tiny_model
from tests.support.tiny_tokenizer import save_tiny_tokenizer


@pytest.fixture
def trained(tmp_path):
    draft = tiny_dflash_draft().float()
    target = {"num_layers": 4, "hidden_size": 32, "vocab_size": 50, "name_or_path": "/models/t"}
    manifest = Manifest(draft=draft.cfg.to_dict(), target=target, aux_layers=[1, 2, 3])
    manifest.extra["method"] = "dflash"
    return save_dflash_draft(draft, tmp_path / "run" / "draft", manifest)


def test_inspect_shows_block_mask_and_layers(trained):
    result = invoke(["inspect", str(trained)])
    assert result.exit_code == 0, result.output
    text = flat(result.output)
    assert "DFlash drafter, DFlashDraftModel config" in text
    assert "block size 4 (anchor + 3 drafts); mask token 49" in text
    assert (
        "target layer ids (DFlash, 0-based) [0, 1, 2] of 4 = aux layers (specdraft indices) [1, 2, 3]"
        in text
    )
    assert "audit: PASS" in text


def test_export_prints_the_launch_line_serving_the_block(trained, tmp_path):
    result = invoke(["export", str(trained), str(tmp_path / "out"), "--engine", "vllm"])
    assert result.exit_code == 0, result.output
    text = flat(result.output)
    assert "DFlash drafter, 25 tensors, each bit-identical" in text
    assert "launch (block 4: num_speculative_tokens 3):" in text
    assert '"method": "dflash"' in text and '"num_speculative_tokens": 3' in text


def test_export_num_steps_sets_vllm_drafts_a_round(trained, tmp_path):
    out = tmp_path / "out"
    result = invoke(["export", str(trained), str(out), "--engine", "vllm", "--num-steps", "2"])
    assert result.exit_code == 0, result.output
    text = flat(result.output)
    assert "launch (block 4: num_speculative_tokens 2):" in text
    assert '"num_speculative_tokens": 2' in text
    # a --num-steps the trained block cannot serve is a bad option value: exit 2, as --topk's
    more = invoke(["export", str(trained), str(out), "--engine", "vllm", "--num-steps", "5"])
    one_error(more, "--num-steps 5:", "give 1..3", code=2)
    sglang = invoke(["export", str(trained), str(out), "--engine", "sglang", "--num-steps", "2"])
    one_error(
        sglang, "--num-steps 2: SGLang's DFLASH worker", "unlike the trained block of 4", code=2
    )


@pytest.mark.parametrize(
    "options, words",
    [
        (["--topk", "4"], "--topk: an EAGLE-3 setting, and"),
        (
            ["--topk", "4", "--num-draft-tokens", "5"],
            "--topk, --num-draft-tokens: EAGLE-3 settings,",
        ),
    ],
)
def test_an_eagle3_option_for_a_dflash_drafter_is_one_line(trained, tmp_path, options, words):
    result = invoke(["export", str(trained), str(tmp_path / "out"), "--engine", "sglang", *options])
    text = one_error(result, words, "is a DFlash drafter", code=2)
    assert text.endswith("drop it" if len(options) == 2 else "drop them"), text
    assert not (tmp_path / "out").exists()


def test_doctor_passes_the_export_and_fails_a_wrong_launch_line(trained, tmp_path):
    out = tmp_path / "out"
    assert invoke(["export", str(trained), str(out), "--engine", "sglang"]).exit_code == 0
    launch = f"python -m sglang.launch_server --model-path T --speculative-algorithm DFLASH --speculative-draft-model-path {out}"
    good = invoke(
        [
            "doctor",
            str(out),
            "--engine-args",
            launch + " --speculative-num-draft-tokens 4",
            "--json",
        ]
    )
    assert good.exit_code == 0, good.output
    assert json.loads(good.output)["counts"]["fail"] == 0
    bad = invoke(
        [
            "doctor",
            str(out),
            "--engine-args",
            launch + " --speculative-num-draft-tokens 16",
            "--json",
        ]
    )
    assert bad.exit_code == 1
    failed = [f["check"] for f in json.loads(bad.output)["findings"] if f["verdict"] == "fail"]
    assert failed == ["block_size_matches_engine"]


def test_doctor_names_layers_vllm_would_read_otherwise(trained, tmp_path):
    out = tmp_path / "out"
    assert invoke(["export", str(trained), str(out), "--engine", "vllm"]).exit_code == 0
    edit_config(out, lambda c: c.update(eagle_aux_hidden_state_layer_ids=[2, 3, 4]))
    report = json.loads(invoke(["doctor", str(out), "--json"]).output)
    failed = {f["check"]: f["evidence"] for f in report["findings"] if f["verdict"] == "fail"}
    assert list(failed) == ["target_layers_as_engines_read"]
    assert failed["target_layers_as_engines_read"].startswith("vLLM captures [2, 3, 4]")


def test_inspect_and_generate_refuse_a_config_block_other_than_the_trained_one(trained, tmp_path):
    """config.json edited to block 16 over a drafter trained on block 4: inspect and generate
    each refuse it in one line naming config.json and both values (never 15 steps a round;
    generate reads it with its options: exit 2)."""
    edit_config(
        trained, lambda c: c.update(block_size=16) or c["dflash_config"].update(block_size=16)
    )
    said = (f"{trained / 'config.json'}: block_size 16", "trained on blocks of 4")
    one_error(invoke(["inspect", str(trained)]), *said)
    target = save_tiny_tokenizer(save_tiny_model("llama", tmp_path / "t", vocab_size=50))
    generate = [
        "generate",
        "--target",
        str(target),
        "--draft",
        str(trained),
        "--prompt",
        "a",
    ]
    one_error(invoke(generate), *said, code=2)
