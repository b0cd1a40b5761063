"""`--method eagle3.1` through the commands as a user types them: train a tiny EAGLE-3.1 drafter
on the tiny store (conftest's `store`), then inspect, export for each engine, doctor (PASS, and
FAIL naming the flags once they are dropped from the exported config.json), generate; each names
the method. An SGLang release without its norms is refused in one line."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.support.cli import flat, invoke
from tests.support.doctor_helpers import edit_config
from tests.support.tiny_tokenizer import save_tiny_tokenizer
from tests.support.train_world import one_thread  # noqa: F401 (autouse: one torch thread)

METHOD = "eagle3.1 (fc_norm, norm_output)"
ENGINES = {"sglang": "sglang", "vllm": "vllm", "speculators": "vllm"}  # export -> doctor engine
ENGINE_NAMES = {"sglang": "SGLang", "vllm": "vLLM"}


@pytest.fixture(scope="module")
def trained(store, tmp_path_factory):
    """(RUN/draft, target dir, root): `specdraft train --method eagle3.1`, 8 steps."""
    root = tmp_path_factory.mktemp("e31")
    args = ["train", str(store), str(root / "run"), "--method", "eagle3.1", "--steps", "8"]
    args += ["--batch-size", "8", "--lr", "3e-3", "--warmup-steps", "2", "--draft-vocab-size", "40"]
    result = invoke(args)
    assert result.exit_code == 0, result.output
    target = str(store.parent / "target")  # train_world.write_fp32_store saves it there
    return root / "run" / "draft", target, root


@pytest.fixture(scope="module")
def exported(trained):
    """engine -> the trained drafter exported for it (`specdraft export`), and the export's output."""
    draft, target, root = trained
    outputs = {}
    for engine in ENGINES:
        result = invoke(["export", str(draft), str(root / engine), "--engine", engine])
        assert result.exit_code == 0, result.output
        outputs[engine] = flat(result.output)
    return outputs


def test_inspect_names_the_method(trained):
    result = invoke(["inspect", str(trained[0])])
    assert result.exit_code == 0 and f"method: {METHOD}" in flat(result.output), result.output


@pytest.mark.parametrize("engine", list(ENGINES))
def test_export_writes_the_norms_and_names_the_method(trained, exported, engine):
    root = trained[2]
    assert f"for {engine}: {METHOD}, " in exported[engine], exported[engine]
    config = json.loads((root / engine / "config.json").read_text())
    assert (config["fc_norm"], config["norm_output"], config["norm_before_residual"]) == (
        True,
        True,
        False,
    )


@pytest.mark.parametrize("export", list(ENGINES))
def test_doctor_passes_the_norms_each_engine_applies(trained, exported, export):
    _, target, root = trained
    engine = ENGINES[export]
    result = invoke(["doctor", str(root / export), "--target", target, "--engine", engine])
    text = flat(result.output)
    assert result.exit_code == 0, result.output
    assert (
        f"PASS norms_as_trained trained as {METHOD}; {ENGINE_NAMES[engine]} builds the same from "
        "config.json"
    ) in text, text


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_doctor_fails_the_flags_dropped_from_the_config(trained, exported, engine):
    """The fault injected: fc_norm and norm_output removed from the exported config.json."""
    _, target, root = trained
    broken = root / f"dropped-{engine}"
    shutil.copytree(root / engine, broken)
    edit_config(broken, lambda c: [c.pop("fc_norm"), c.pop("norm_output")])
    result = invoke(["doctor", str(broken), "--target", target, "--engine", engine])
    text = flat(result.output)
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    assert (
        f"FAIL norms_as_trained trained as {METHOD}, but {ENGINE_NAMES[engine]} applies eagle3 "
        "(no norm flag), without fc_norm, norm_output"
    ) in text, text


def test_export_refuses_an_sglang_release_without_the_norms_in_one_line(trained):
    draft, _, root = trained
    args = ["export", str(draft), str(root / "old"), "--engine", "sglang"]
    result = invoke([*args, "--sglang-version", "0.5.10"])
    assert result.exit_code == 1 and not (root / "old").exists(), result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and len(result.output.strip().splitlines()) == 1, result.output
    assert errors[0].startswith(
        f"error: cannot export this {METHOD} drafter for sglang: SGLang 0.5.10 does not implement "
        "fc_norm: it reads it from 0.5.12 on"
    ), errors[0]


def test_generate_names_the_drafters_method(trained, tmp_path):
    draft, target, _ = trained
    with_tokenizer = shutil.copytree(target, tmp_path / "target")
    save_tiny_tokenizer(with_tokenizer)
    args = ["generate", "--target", str(with_tokenizer), "--draft", str(draft)]
    result = invoke([*args, "--prompt", "hello", "--max-new-tokens", "4", "--num-steps", "2"])
    assert result.exit_code == 0, result.output
    assert f"drafter {draft}: {METHOD}" in flat(result.output), result.output


def test_demo_takes_the_eagle3_methods():
    """demo --method: the EAGLE-3 methods (`draft_config.EAGLE3_METHODS`) and dflash (beside
    EAGLE-3), a click choice."""
    refused = invoke(["demo", "--method", "eagle4"])
    assert refused.exit_code == 2, refused.output
    assert "'eagle4' is not one of 'eagle3', 'eagle3.1', 'dflash'" in flat(refused.output)
    assert "--method <eagle3|eagle3.1|dflash>" in invoke(["demo", "--help"]).output
