"""A drafter config without aux ids (SpecForge's Llama-3-8B / Qwen3-8B configs, the official
EAGLE-3 config, speculators' converter output with null ids) is read with the engines' shared
default [2, L//2, L-3], said in one line; --aux-layers in a named convention overrides it on
inspect / convert / export / doctor / generate / serve (issue #21 item 2, "configs without aux ids")."""

from __future__ import annotations

import json

import pytest

from specdraft.checkpoint import CheckpointError, convert_draft, load_draft
from specdraft.conventions import ENGINE_DEFAULT_SOURCES, ConventionError, engines_default_layers
from specdraft.doctor import run_doctor
from tests.support.cli import cli_args, flat, invoke
from tests.support.doctor_helpers import draft_checkpoint, edit_config, one_thread  # noqa: F401
from tests.support.tiny_tokenizer import save_tiny_tokenizer

KEY = "eagle_aux_hidden_state_layer_ids"


def _drop_ids(config: dict, null: bool) -> None:
    config.pop("eagle_config", None)
    if null:  # speculators' converter writes the key with a null value
        config[KEY] = None
    else:
        config.pop(KEY, None)


@pytest.fixture(scope="module")
def bare(tmp_path_factory):
    """(drafter without manifest and without aux ids, its 8-layer target): trained on the default [2, 4, 5]."""
    root = tmp_path_factory.mktemp("noids")
    draft, target = draft_checkpoint(root, num_layers=8, aux=(2, 4, 5))
    (draft / "specdraft_manifest.json").unlink()
    edit_config(draft, lambda c: _drop_ids(c, null=False))
    return draft, target


def test_the_default_is_the_engines_default_for_the_target():
    assert engines_default_layers(32) == [2, 16, 29] and engines_default_layers(61) == [2, 30, 58]
    assert set(ENGINE_DEFAULT_SOURCES) == {"sglang", "vllm"}
    with pytest.raises(ConventionError, match=r"collapse to \[2\] on a 5-layer target"):
        engines_default_layers(5)


@pytest.mark.parametrize("null", [False, True])
def test_a_config_without_ids_loads_with_the_default(bare, tmp_path, null):
    draft, _ = bare
    edit_config(draft, lambda c: _drop_ids(c, null))
    assert list(load_draft(draft, target_num_layers=8).model.cfg.aux_layers) == [2, 4, 5]
    assert list(load_draft(draft, target_num_layers=32).model.cfg.aux_layers) == [2, 16, 29]
    with pytest.raises(CheckpointError, match="collapse"):
        load_draft(draft, target_num_layers=5)


def test_inspect_says_so_in_one_line(bare):
    draft, target = bare
    result = invoke(["inspect", str(draft), "--target", str(target)])
    text = flat(result.output)
    assert result.exit_code == 0, result.output
    assert f"names no {KEY}: using the engines' default [2, L//2, L-3] = [2, 4, 5]" in text, text
    assert "aux layers (specdraft indices): [2, 4, 5] of 8" in text


@pytest.mark.parametrize(
    "value, layers",
    [
        ("1,3,6", [1, 3, 6]),
        ("specdraft:1,3,6", [1, 3, 6]),
        ("vllm:1,3,6", [1, 3, 6]),
        ("sglang:0,2,5", [1, 3, 6]),
    ],
)
def test_aux_layers_in_a_named_convention_overrides(bare, value, layers):
    draft, target = bare
    result = invoke(cli_args("inspect", draft, target=target, aux_layers=value))
    text = flat(result.output)
    assert result.exit_code == 0, result.output
    assert f"aux layers (specdraft indices): {layers} of 8" in text
    assert f"aux layers {layers} (specdraft indices) from --aux-layers" in text


def test_aux_layers_is_refused_in_one_line_when_unreadable(bare):
    """A value no target could read, or --aux-layers without --target, is a usage error (exit 2); a
    readable value the drafter's weights do not fit is refused while loading (exit 1)."""
    draft, target = bare
    for value, words, code in (
        ("llama:1,2,3", "'llama' is no aux-id convention", 2),
        ("sglang:1,1,2", "name a layer twice", 2),
        ("1,2", "the drafter's fc takes 3 aux states", 1),
        ("3,2,1", "must increase strictly", 2),
    ):
        result = invoke(cli_args("inspect", draft, target=target, aux_layers=value))
        assert result.exit_code == code and words in flat(result.output), (value, result.output)
        assert "Traceback" not in result.output
    result = invoke(["inspect", str(draft), "--aux-layers", "2,4,5"])
    assert result.exit_code == 2, result.output
    assert flat(result.output) == (
        "error: --aux-layers needs --target DIR: aux ids are read by the target's layer "
        "count and class"
    )


def test_convert_and_export_write_the_layers_explicitly(bare, tmp_path):
    draft, target = bare
    out = tmp_path / "conv"
    result = invoke(cli_args("convert", draft, out, layout="sglang", target=target))
    assert result.exit_code == 0, result.output
    assert "using the engines' default" in flat(result.output)
    config = json.loads((out / "config.json").read_text())
    assert config[KEY] == [2, 4, 5] and config["eagle_config"][KEY] == [1, 3, 4]
    out = tmp_path / "exp"
    result = invoke(
        cli_args("export", draft, out, engine="vllm", target=target, aux_layers="vllm:1,3,6")
    )
    assert result.exit_code == 0, result.output
    assert "from --aux-layers" in flat(result.output)
    assert json.loads((out / "config.json").read_text())[KEY] == [1, 3, 6]


def test_doctor_reads_the_default(bare):
    draft, target = bare
    report = run_doctor(draft, target=target)
    assert any(
        "names no eagle_aux_hidden_state_layer_ids: using the engines' default" in n
        for n in report.notes
    )
    assert report.finding("aux_ids_read_alike").verdict == "pass"
    assert (
        "SGLang reads [2, 4, 5], vLLM reads [2, 4, 5]"
        in report.finding("aux_ids_read_alike").evidence
    )
    assert report.finding("keys_match_engine").verdict == "pass", report.finding(
        "keys_match_engine"
    )


def test_doctor_compares_the_engines_default_with_aux_layers(bare):
    draft, target = bare
    finding = run_doctor(draft, target=target, aux_layers=[1, 3, 6]).finding(
        "engine_captures_training_layers"
    )
    assert finding.verdict == "fail"
    assert "trained on [1, 3, 6]" in finding.evidence and "captures [2, 4, 5]" in finding.evidence
    result = invoke(cli_args("doctor", draft, target=target, aux_layers="sglang:1,3,4"))
    assert "engine_captures_training_layers" in result.output and "Traceback" not in result.output
    assert result.exit_code == 0, result.output


def test_generate_and_serve_say_the_default_and_take_aux_layers(bare, monkeypatch):
    import specdraft.serve.server

    draft, target = bare
    save_tiny_tokenizer(target)
    loaded = ["--target", str(target), "--draft", str(draft)]
    result = invoke(["generate", *loaded, "--prompt", "hello", "--max-new-tokens", "2"])
    assert result.exit_code == 0, result.output
    assert (
        f"note: config.json names no {KEY}: using the engines' default [2, L//2, L-3] = [2, 4, 5]"
        in flat(result.output)
    ), result.output
    result = invoke(
        [
            "generate",
            *loaded,
            "--prompt",
            "hello",
            "--max-new-tokens",
            "2",
            "--aux-layers",
            "vllm:1,3,6",
        ]
    )
    assert (
        result.exit_code == 0
        and "note: aux layers [1, 3, 6] (specdraft indices) from --aux-layers"
        in flat(result.output)
    ), result.output
    served = []
    monkeypatch.setattr(
        specdraft.serve.server, "serve", lambda app_, host, port: served.append(app_)
    )
    result = invoke(["serve", *loaded, "--aux-layers", "sglang:0,2,5", "--port", "8123"])
    assert (
        result.exit_code == 0
        and "note: aux layers [1, 3, 6] (specdraft indices) from --aux-layers"
        in flat(result.output)
    ), result.output
    assert list(served[0].state.server.engine.draft.cfg.aux_layers) == [1, 3, 6]
    result = invoke(cli_args("serve", target=target, no_spec=True, aux_layers="2,4,5", port=8123))
    assert result.exit_code == 2 and "--aux-layers: drafting settings, but --no-spec" in flat(
        result.stderr
    )


def test_a_target_of_other_sizes_is_named_before_the_default_ids_collapse(bare, tmp_path):
    """A 6-layer target (the default collapses there) of another hidden size and vocabulary: the
    sizes are the error, not the collapse, on inspect, export and generate."""
    from tests.support.tiny_models import save_tiny_model

    draft, _ = bare
    other = save_tiny_model(
        "llama", tmp_path / "other", num_layers=6, hidden_size=64, vocab_size=96
    )
    save_tiny_tokenizer(other)
    for args in (
        ["inspect", str(draft), "--target", str(other)],
        cli_args("export", draft, tmp_path / "out", engine="vllm", target=other),
        cli_args("generate", target=other, draft=draft, prompt="hello"),
    ):
        result = invoke(args)
        text = flat(result.output)
        assert (
            result.exit_code == 1
            and "this drafter was trained for another target: one of hidden 32, "
            "vocab 128 (path not recorded)"
            in text
            and "hidden_size, vocab_size differ" in text
        ), (args, text)
        assert "collapse" not in text


def test_aux_layers_messages_name_the_real_constraint_and_echo_what_was_typed(bare):
    """No vLLM in inspect / generate: a count the drafter's fc does not take is named by the fc;
    the echo is the value as typed; a list every SGLang version refuses names no version range (a
    usage error, as a --sglang-version that is no version)."""
    draft, target = bare
    save_tiny_tokenizer(target)
    for command in (
        ["inspect", str(draft)],
        ["generate", "--draft", str(draft), "--prompt", "hello"],
    ):
        text = flat(invoke([*command, "--target", str(target), "--aux-layers", "2,4"]).output)
        assert (
            "the drafter's fc takes 3 aux states (3 x target hidden size 32) and the aux layers [2, 4] are 2: "
            "name 3 layers"
            in text
            and "hard-codes" not in text
        ), text
    text = flat(invoke(cli_args("inspect", draft, target=target, aux_layers="3,2,1")).output)
    assert "--aux-layers 3,2,1: " in text and "specdraft:" not in text, text
    for pinned in ([], ["--sglang-version", "0.5.23"]):
        result = invoke(
            [
                "inspect",
                str(draft),
                "--target",
                str(target),
                "--aux-layers",
                "sglang:0,1,7",
                *pinned,
            ]
        )
        assert (
            result.exit_code == 2
            and "index 8 (last layer's output, before the final norm) is not capturable "
            "on Llama-class targets in SGLang < 0.5.22 and SGLang >= 0.5.22 alike"
            in flat(result.output)
        ), result.output
    result = invoke(cli_args("inspect", draft, target=target, sglang_version="abc"))
    assert result.exit_code == 2 and "'abc' is not a version: write one like 0.5.23" in flat(
        result.output
    )


def test_inspect_without_target_shows_what_the_files_say(bare, tmp_path):
    """A manifest-less drafter without --target: layout, tensor table and the ids as written (it
    printed only an error), then what --target adds; the loader's config checks still refuse."""
    draft, _ = bare
    convert_draft(draft, tmp_path / "spec", layout="speculators", target_num_layers=8)
    convert_draft(draft, tmp_path / "sgl", layout="sglang", target_num_layers=8)
    written = {
        draft: "none (the engines' default [2, L//2, L-3] of the target's L layers)",
        tmp_path / "spec": f"top-level {KEY} [2, 4, 5] (vLLM reads them as-is)",
        tmp_path
        / "sgl": f"top-level {KEY} [2, 4, 5] (vLLM reads them as-is); eagle_config's [1, 3, 4] "
        "(SGLang adds 1 by the target's class and version)",
    }
    for path, ids in written.items():
        result = invoke(["inspect", str(path)])
        text = flat(result.output)
        assert result.exit_code == 0 and "error" not in text, result.output
        assert text.startswith(f"{path}: ") and "no specdraft manifest" in text, text
        assert (
            "fc.weight (32, 96) float32" in text
            and f"aux ids as config.json writes them: {ids}" in text
        ), text
        assert (
            "--target DIR would add: the aux layers as specdraft indices" in text
            and "audit: PASS" not in text
        )
    edit_config(tmp_path / "spec", lambda c: c["transformer_layer_config"].pop("hidden_size"))
    result = invoke(["inspect", str(tmp_path / "spec")])
    assert result.exit_code == 2 and "missing hidden_size" in flat(result.output), result.output


def test_inspect_without_target_runs_the_loaders_key_checks(bare, tmp_path):
    """Without --target, inspect still refuses what the loader refuses (it listed the file's
    tensors unchecked): a name that matches no parameter, a parameter not in the file."""
    import shutil

    from safetensors.torch import load_file, save_file

    draft, _ = bare
    convert_draft(draft, tmp_path / "sgl", layout="sglang", target_num_layers=8)
    text = flat(invoke(["inspect", str(tmp_path / "sgl")]).output)
    assert "keys: every tensor of model.safetensors is one the sglang layout loads" in text, text
    for name, edit in [
        ("extra", lambda t: {**t, "midlayer.mlp.gate_proj.bias": t["norm.weight"].clone()}),
        ("missing", lambda t: {k: v for k, v in t.items() if k != "norm.weight"}),
    ]:
        shutil.copytree(tmp_path / "sgl", tmp_path / name)
        weights = tmp_path / name / "model.safetensors"
        save_file(edit(load_file(str(weights))), str(weights))
        result = invoke(["inspect", str(tmp_path / name)])
        text = flat(result.output)
        assert result.exit_code == 1 and text.startswith(f"error: {weights}: sglang layout"), (
            result.output
        )
        assert (
            "1 tensors match no parameter: midlayer.mlp.gate_proj.bias"
            if name == "extra"
            else "1 parameters not in the file: norm.weight"
        ) in text, text
        assert "tensors of model.safetensors" not in text
