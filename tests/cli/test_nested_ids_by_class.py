"""Nested eagle_config ids are read by the rule of the target's class and SGLang version (the
engine-rule table), convert takes --sglang-version, and no file is written whose top-level and
nested id lists name different layers (issue #21 item 2, "nested ids read by the rule of the
target's class"); generate and serve take --sglang-version as inspect and convert do. A Kimi-K2 / DeepSeek-V3 target has 61 layers: SGLang >= 0.5.13 reads the ids
[2, 30, 58] as-is there (their first is not 1), older versions add 1."""

from __future__ import annotations

import json

import pytest

from specdraft.checkpoint import CheckpointError, Manifest, load_draft, save_draft
from specdraft.checkpoint.id_reading import IdReading
from specdraft.conventions import aux_layers_from_config
from specdraft.draft_config import DraftConfig
from specdraft.errors import SpecdraftError
from tests.support.cli import cli_args, flat, invoke
from tests.support.drafts import seeded_draft
from tests.support.tiny_models import tiny_config
from tests.support.tiny_tokenizer import save_tiny_tokenizer

KEY = "eagle_aux_hidden_state_layer_ids"
LAYERS = 61


def _target(root, model_type="deepseek_v3"):
    """A DeepSeek-V3-class target directory of 61 layers: its config.json alone (ids need no weights)."""
    config = tiny_config("deepseek_v3", num_layers=LAYERS).to_dict()
    config["model_type"] = model_type
    target = root / "target"
    target.mkdir()
    (target / "config.json").write_text(json.dumps(config))
    return target


def _drafter(root, aux, manifest_class=None):
    cfg = DraftConfig.from_target(
        tiny_config("deepseek_v3", num_layers=LAYERS), aux, draft_vocab_size=64
    )
    manifest = (
        None
        if manifest_class is None
        else Manifest(
            draft=cfg.to_dict(),
            target={"num_layers": LAYERS, "target_class": manifest_class},
            aux_layers=list(aux),
        )
    )
    return save_draft(
        seeded_draft(cfg),
        root / "draft",
        layout="sglang" if manifest is None else "specdraft",
        manifest=manifest,
    )


@pytest.fixture
def sglang_only(tmp_path):
    """(drafter whose config holds only the nested SGLang ids [2, 30, 58], DeepSeek-class target)."""
    draft = _drafter(tmp_path, (2, 30, 58))
    config = json.loads((draft / "config.json").read_text())
    config.pop(KEY)
    config["eagle_config"][KEY] = [2, 30, 58]
    (draft / "config.json").write_text(json.dumps(config))
    return draft, _target(tmp_path)


def test_inspect_reads_nested_ids_by_the_targets_class_and_version(sglang_only):
    draft, target = sglang_only
    for version, layers in (("0.5.23", [2, 30, 58]), ("0.5.12", [3, 31, 59])):
        result = invoke(cli_args("inspect", draft, target=target, sglang_version=version))
        assert result.exit_code == 0, result.output
        assert f"aux layers (specdraft indices): {layers} of {LAYERS}" in flat(result.output)
    result = invoke(
        ["inspect", str(draft), "--target", str(target)]
    )  # the reading depends on the version
    text = flat(result.output)
    assert (
        result.exit_code == 1
        and "read differently by SGLang version" in text
        and "--sglang-version" in text
    )
    assert "[3, 31, 59] of 61" not in text  # the Llama rule's reading, whatever the class, before


def test_convert_writes_two_id_lists_that_agree(sglang_only, tmp_path):
    draft, target = sglang_only
    out = tmp_path / "out"
    result = invoke(
        cli_args("convert", draft, out, layout="sglang", target=target, sglang_version="0.5.23")
    )
    assert result.exit_code == 0, result.output
    config = json.loads((out / "config.json").read_text())
    assert config[KEY] == [2, 30, 58] and config["eagle_config"][KEY] == [1, 29, 57]
    reading = aux_layers_from_config(config, LAYERS, "deepseek")  # every SGLang version, and vLLM
    assert reading.sglang == reading.vllm == [2, 30, 58]


@pytest.mark.parametrize(
    "version, nested", [(None, None), ("0.5.23", [3, 30, 58]), ("0.5.12", [2, 29, 57])]
)
def test_a_drafter_of_a_deepseek_target_never_gets_disagreeing_ids(tmp_path, version, nested):
    """First index 3: SGLang >= 0.5.13 writes it as-is on DeepSeek targets, older versions as 2;
    the Llama rule wrote [2, 29, 57], which 0.5.13+ reads as layers [2, 29, 57]."""
    draft = _drafter(tmp_path, (3, 30, 58), manifest_class="deepseek")
    out = tmp_path / "out"
    args = ["convert", str(draft), str(out), "--layout", "sglang"]
    result = invoke(args + (["--sglang-version", version] if version else []))
    assert result.exit_code == 0, result.output
    config = json.loads((out / "config.json").read_text())
    assert config[KEY] == [3, 30, 58]
    assert (config.get("eagle_config") or {}).get(KEY) == nested
    if nested is not None:
        assert aux_layers_from_config(config, LAYERS, "deepseek", version).sglang == [3, 30, 58]


def test_two_lists_that_disagree_by_the_class_rule_are_refused(sglang_only):
    draft, _ = sglang_only
    config = json.loads((draft / "config.json").read_text())
    config[KEY] = [3, 31, 59]  # the Llama rule's reading of [2, 30, 58]: wrong for 0.5.23 DeepSeek
    (draft / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="name different layers"):
        load_draft(
            draft, target_num_layers=LAYERS, target_class="deepseek", sglang_version="0.5.23"
        )


@pytest.mark.parametrize("command", ["generate", "serve"])
def test_generate_and_serve_read_sglang_ids_by_the_sglang_version(
    sglang_only, command, monkeypatch
):
    """--aux-layers sglang:2,30,58 on a DeepSeek-class target names other layers by SGLang version:
    --sglang-version picks one, and the reading reaches the engine's loader; without it, the refusal
    names the flag, which these commands take too."""
    import specdraft.engine.load
    import specdraft.serve.server

    draft, target = sglang_only
    save_tiny_tokenizer(target)
    readings = []

    def stop(*args, reading=None, **kwargs):
        readings.append(reading)
        raise SpecdraftError("stopped before loading")

    monkeypatch.setattr(specdraft.engine.load, "load_engine", stop)
    monkeypatch.setattr(specdraft.serve.server, "build_app", stop)
    args = [
        command,
        "--target",
        str(target),
        "--draft",
        str(draft),
        "--aux-layers",
        "sglang:2,30,58",
        *(["--prompt", "hi"] if command == "generate" else ["--port", "8123"]),
    ]
    for version, layers in (("0.5.23", [2, 30, 58]), ("0.5.12", [3, 31, 59])):
        result = invoke([*args, "--sglang-version", version])
        assert flat(result.output) == "error: stopped before loading", result.output
        assert readings.pop() == IdReading(LAYERS, "deepseek", version, layers)
    text = flat(invoke(args).output)
    assert "read differently by SGLang version" in text and "pass --sglang-version" in text, text
    assert not readings
