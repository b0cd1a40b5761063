"""`specdraft convert` names what it wrote, and a manifest-less speculators conversion records the
target's path and architecture as its verifier (never a hard-coded LlamaForCausalLM); a verifier
nothing names is said in one line; a t2d derived from d2t is said to be derived, not copied."""

import json

from typer.testing import CliRunner

from specdraft.checkpoint import save_draft
from specdraft.cli import app
from tests.support.cli import cli_args
from tests.support.drafts import tiny_draft
from tests.support.tiny_models import save_tiny_model


def convert_a_plain_drafter(tmp_path):
    """(target, result): a drafter without manifest (sglang layout) in tmp_path/d converted to the
    speculators layout in tmp_path/out with --target, a saved tiny 5-layer Qwen3."""
    save_draft(tiny_draft(), tmp_path / "d", layout="sglang")
    target = save_tiny_model("qwen3", tmp_path / "target", num_layers=5)
    result = CliRunner().invoke(
        app,
        cli_args("convert", tmp_path / "d", tmp_path / "out", layout="speculators", target=target),
    )
    assert result.exit_code == 0, result.output
    return target, result


def test_manifest_less_speculators_convert_records_the_targets_architecture(tmp_path):
    target, result = convert_a_plain_drafter(tmp_path)
    verifier = json.loads((tmp_path / "out" / "config.json").read_text())["speculators_config"][
        "verifier"
    ]
    assert verifier == {
        "name_or_path": str(target.resolve()),
        "architectures": ["Qwen3ForCausalLM"],
    }  # as export
    text = " ".join(result.output.split())
    assert "config.json, model.safetensors; 15 tensors, each bit-identical" in text
    assert "speculators layout (loaded by vLLM), no specdraft manifest" in text
    assert (
        f"verifier: '{target.resolve()}', architectures ['Qwen3ForCausalLM'] (`vllm serve {tmp_path / 'out'}` "
        "serves it as the target: it must resolve on the serving host)" in text
    ), text


def test_convert_reads_the_targets_config_once(tmp_path, monkeypatch):
    """Aux ids and the verifier's architectures come from one read (remote code, if trusted, runs once)."""
    import specdraft.targets.config

    reads = []
    read = specdraft.targets.config.read_target_config
    monkeypatch.setattr(
        specdraft.targets.config,
        "read_target_config",
        lambda *a, **k: reads.append(a) or read(*a, **k),
    )
    target, result = convert_a_plain_drafter(tmp_path)
    assert len(reads) == 1, reads
    assert json.loads((tmp_path / "out" / "config.json").read_text())["speculators_config"][
        "verifier"
    ]["architectures"] == ["Qwen3ForCausalLM"]


def test_a_verifier_nothing_names_is_said_in_one_line(tmp_path):
    """A manifest that records no target path, converted without --target: name_or_path is null."""
    from tests.support.doctor_helpers import draft_checkpoint

    draft, _ = draft_checkpoint(tmp_path)
    manifest = json.loads((draft / "specdraft_manifest.json").read_text())
    del manifest["target"]["name_or_path"]
    (draft / "specdraft_manifest.json").write_text(json.dumps(manifest))
    result = CliRunner().invoke(
        app, ["convert", str(draft), str(tmp_path / "out"), "--layout", "speculators"]
    )
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "out" / "config.json").read_text())["speculators_config"][
        "verifier"
    ] == {"name_or_path": None, "architectures": ["LlamaForCausalLM"]}
    lines = [line for line in result.output.splitlines() if "name_or_path" in line]
    assert lines == [
        f"note: verifier.name_or_path is null, so `vllm serve {tmp_path / 'out'}` has no target "
        "(`vllm serve DRAFTER` serves speculators_config.verifier.name_or_path as the target (vllm "
        "0.32.0 transformers_utils/config.py maybe_override_with_speculators)): pass --target DIR to "
        "record its path, or launch vLLM on the target (specdraft export --engine vllm prints the "
        "command); architectures ['LlamaForCausalLM']"
    ], result.output


def test_speculators_convert_records_the_target_as_export_does(tmp_path):
    """--target replaces the source's verifier (said in a note: tests/cli/test_speculators_launch.py)."""
    save_draft(
        tiny_draft(),
        tmp_path / "s",
        layout="speculators",
        verifier="org/target",
        verifier_architectures=["MistralForCausalLM"],
    )
    target = save_tiny_model("llama", tmp_path / "target", num_layers=5)
    runner = CliRunner()
    assert (
        runner.invoke(
            app,
            cli_args(
                "convert", tmp_path / "s", tmp_path / "t", layout="speculators", target=target
            ),
        ).exit_code
        == 0
    )
    verifier = json.loads((tmp_path / "t" / "config.json").read_text())["speculators_config"][
        "verifier"
    ]
    assert verifier == {
        "name_or_path": str(target.resolve()),
        "architectures": ["LlamaForCausalLM"],
    }


def test_convert_to_the_sglang_layout_notes_a_flag_sglang_does_not_implement(tmp_path):
    save_draft(
        tiny_draft(norm_before_residual=True), tmp_path / "d", layout="speculators", verifier="t"
    )
    target = save_tiny_model("llama", tmp_path / "target", num_layers=5)
    result = CliRunner().invoke(
        app,
        cli_args("convert", tmp_path / "d", tmp_path / "out", layout="sglang", target=target),
    )
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "note: SGLang does not implement norm_before_residual" in text, text
    plain = CliRunner().invoke(
        app,
        cli_args("convert", tmp_path / "d", tmp_path / "out2", layout="speculators", target=target),
    )
    assert plain.exit_code == 0 and "does not implement" not in plain.output, (
        plain.output
    )  # vLLM implements it


def test_a_t2d_derived_from_d2t_is_not_counted_as_copied(tmp_path):
    """A source with d2t only (NVIDIA ModelOpt's exports): convert and export write the t2d they
    derive, and count only the file's own tensors as bit-identical to it."""
    from safetensors.torch import load_file, save_file

    save_draft(tiny_draft(), tmp_path / "d", layout="sglang")
    tensors = load_file(tmp_path / "d" / "model.safetensors")
    del tensors["t2d"]
    save_file(tensors, tmp_path / "d" / "model.safetensors")
    target = save_tiny_model("llama", tmp_path / "target", num_layers=5)
    derived = f"14 tensors, each bit-identical to {tmp_path / 'd'}; t2d derived from d2t ({tmp_path / 'd'} has none)"
    result = CliRunner().invoke(
        app,
        cli_args("convert", tmp_path / "d", tmp_path / "out", layout="sglang", target=target),
    )
    assert result.exit_code == 0 and derived in " ".join(result.output.split()), result.output
    result = CliRunner().invoke(
        app,
        cli_args("export", tmp_path / "d", tmp_path / "exp", engine="vllm", target=target),
    )
    assert result.exit_code == 0, result.output
    assert (
        "14 tensors, each bit-identical to the checkpoint; t2d derived from d2t "
        f"({tmp_path / 'd'} has none)"
    ) in " ".join(result.output.split()), result.output
