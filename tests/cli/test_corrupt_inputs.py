"""inspect, convert, generate and export given a drafter or target whose config.json or manifest is
corrupt (not JSON, no object, required keys missing): one `error:` line naming the file, what is
wrong and what fixes it (doctor's words, `doctor.inputs.given_config`), exit 2 as the commands'
other unusable inputs and as doctor (they exited 1); a damaged manifest names a fix the user can
run without it."""

from __future__ import annotations

import json
import shutil

import pytest

from specdraft.checkpoint import MANIFEST_FILE, CheckpointError, load_draft
from tests.support.cli import (
    cli_args,
    invoke,
    one_error,
    world,  # noqa: F401 (fixture)
)
from tests.support.doctor_helpers import draft_checkpoint, one_thread  # noqa: F401

DRAFTER_FIX = "re-export the drafter from its training run (specdraft export RUN/draft OUT --engine"
TARGET_FIX = "restore config.json from where the model came from"


def broken_copy(src, dst, text: str):
    shutil.copytree(src, dst)
    (dst / "config.json").write_text(text)
    return dst


def without_keys(src, dst, *keys):
    shutil.copytree(src, dst)
    config = json.loads((dst / "config.json").read_text())
    for key in keys:
        config.pop(key)
    (dst / "config.json").write_text(json.dumps(config))
    return dst


def commands(draft, target, out):
    return {
        "inspect": ["inspect", str(draft), "--target", str(target)],
        "convert": cli_args("convert", draft, out, layout="speculators", target=target),
        "generate": cli_args(
            "generate", target=target, draft=draft, prompt="hello", max_new_tokens=2
        ),
        "export": cli_args("export", draft, out, engine="vllm", target=target),
    }


CORRUPT = {
    "not-json": ("{not json", "config.json: not valid JSON ("),
    "list": ("[1, 2]", "config.json: not a JSON object (a list)"),
}


@pytest.mark.parametrize("command", ["inspect", "convert", "generate", "export"])
@pytest.mark.parametrize("kind", list(CORRUPT))
@pytest.mark.parametrize("which", ["drafter", "target"])
def test_corrupt_config(world, tmp_path, command, kind, which):
    draft, _, target = world
    text, what = CORRUPT[kind]
    bad = broken_copy(draft if which == "drafter" else target, tmp_path / "bad", text)
    dirs = (bad, target) if which == "drafter" else (draft, bad)
    fixes = (
        (DRAFTER_FIX, "or restore config.json from where the checkpoint came from")
        if which == "drafter"
        else (TARGET_FIX,)
    )
    one_error(invoke(commands(*dirs, tmp_path / "out")[command]), f"{bad}/{what}", *fixes, code=2)


def test_the_loader_names_the_fix_for_a_corrupt_drafter_config(world, tmp_path):
    """One message for every command: the loader's own (export printed it without the fix)."""
    bad = broken_copy(world[0], tmp_path / "bad", "{not json")
    with pytest.raises(CheckpointError) as e:
        load_draft(bad)
    assert str(e.value).startswith(f"{bad}/config.json: not valid JSON (") and DRAFTER_FIX in str(
        e.value
    )


@pytest.mark.parametrize("command", ["inspect", "convert", "generate"])
def test_target_config_without_layer_count(world, tmp_path, command):
    """transformers would default num_hidden_layers to 32 and read a plain drafter's aux ids wrong."""
    _, plain, target = world
    bad = without_keys(target, tmp_path / "bad", "num_hidden_layers")
    one_error(
        invoke(commands(plain, bad, tmp_path / "out")[command]),
        f"{bad}/config.json: missing num_hidden_layers, which a transformers model config holds",
        TARGET_FIX,
        code=2,
    )


@pytest.mark.parametrize("command", ["inspect", "convert", "generate"])
def test_plain_drafter_config_without_sizes(world, tmp_path, command):
    """Without a manifest the drafter is built from config.json: a missing size was a TypeError."""
    _, plain, target = world
    bad = without_keys(plain, tmp_path / "bad", "hidden_size", "num_attention_heads")
    one_error(
        invoke(commands(bad, target, tmp_path / "out")[command]),
        f"{bad}/config.json: missing hidden_size, num_attention_heads (without a specdraft manifest",
        DRAFTER_FIX,
        code=2,
    )


def test_generate_target_config_without_model_sizes(world, tmp_path):
    draft, _, target = world
    bad = without_keys(target, tmp_path / "bad", "hidden_size", "intermediate_size")
    one_error(
        invoke(commands(draft, bad, tmp_path / "out")["generate"]),
        f"{bad}/config.json: missing hidden_size, intermediate_size",
        TARGET_FIX,
        code=2,
    )


MANIFEST_FIX = (
    f"re-export the drafter from its training run (specdraft export RUN/draft OUT --engine "
    f"sglang|vllm|speculators, which writes the manifest); without the run, delete {MANIFEST_FILE}: "
    "the drafter then loads from its config.json alone (pass --target DIR)"
)


@pytest.mark.parametrize(
    "text, what",
    [
        ("{not json", "not valid JSON ("),
        ("[]", "not a JSON object (a list)"),
        ("{}", "manifest keys ['aux_layers', 'draft', 'target'] missing"),
    ],
)
def test_corrupt_manifest_names_a_fix_without_the_run(world, tmp_path, text, what):
    draft, _, target = world
    bad = tmp_path / "bad"
    shutil.copytree(draft, bad)
    (bad / MANIFEST_FILE).write_text(text)
    with pytest.raises(CheckpointError) as e:
        load_draft(bad)
    assert str(e.value).startswith(f"{bad / MANIFEST_FILE}: {what}") and str(e.value).endswith(
        MANIFEST_FIX
    )
    one_error(invoke(["inspect", str(bad)]), f"{bad / MANIFEST_FILE}: {what}", MANIFEST_FIX, code=2)
    (
        bad / MANIFEST_FILE
    ).unlink()  # the advice works: the drafter loads without it, given the target
    assert invoke(["inspect", str(bad), "--target", str(target)]).exit_code == 0


def run_commands(draft, target, tmp_path):
    """capture, regenerate --target and tune given `target`: each reads its config.json first."""
    data = tmp_path / "data.jsonl"
    data.write_text('{"text": "hello world"}\n')
    return {
        "capture": ["capture", str(target), str(data), str(tmp_path / "store"), "--no-chat"],
        "regenerate": cli_args(
            "regenerate", data, tmp_path / "out.jsonl", target=target, no_chat=True
        ),
        "tune": cli_args("tune", target=target, draft=draft, max_tokens=2),
    }


@pytest.mark.parametrize("command", ["capture", "regenerate", "tune"])
@pytest.mark.parametrize("kind", list(CORRUPT))
def test_corrupt_target_config_of_run_commands(world, tmp_path, command, kind):
    """transformers' OSError ("It looks like the config file ...") was a traceback (capture,
    regenerate) or a line without the fix (tune)."""
    draft, _, target = world
    text, what = CORRUPT[kind]
    bad = broken_copy(target, tmp_path / "bad", text)
    one_error(
        invoke(run_commands(draft, bad, tmp_path)[command]), f"{bad}/{what}", TARGET_FIX, code=2
    )
