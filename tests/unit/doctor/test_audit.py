"""keys_match_engine's fix for a drafter whose decoder layer is stored as `layers.0.*` (ModelOpt's,
TorchSpec's naming, no specdraft manifest) that an SGLang release skips: the printed `specdraft
export` command runs as printed (it named neither --target, which export needs to read a drafter
without a manifest, nor the --sglang-version doctor was given)."""

from __future__ import annotations

import shlex

import pytest
from safetensors.torch import load_file
from typer.testing import CliRunner

from specdraft.checkpoint import convert_draft
from specdraft.cli import app
from specdraft.doctor import run_doctor
from tests.support.doctor_helpers import draft_checkpoint, edit_weights, one_thread, rename_layer  # noqa: F401


@pytest.mark.parametrize(
    ("arch", "num_layers", "aux", "version"),
    [
        ("llama", 5, (2, 3, 4), "0.5.11"),
        ("deepseek_v3", 7, (2, 4, 5), "0.5.11"),
        ("llama", 5, (2, 3, 4), None),
    ],
)
def test_the_fix_for_layers_0_names_is_an_export_that_runs_as_printed(
    tmp_path, arch, num_layers, aux, version
):
    draft, target = draft_checkpoint(tmp_path, arch=arch, num_layers=num_layers, aux=aux)
    bare = tmp_path / "bare"
    convert_draft(draft, bare, layout="sglang")  # the official files: no manifest
    edit_weights(bare, lambda t: rename_layer(t, "midlayer.", "layers.0."))
    finding = run_doctor(bare, target=target, engine="sglang", sglang_version=version).finding(
        "keys_match_engine"
    )
    assert finding.verdict == "fail", finding
    command = finding.fix.split(" (writes the engine's names")[0].replace(
        "OUT", str(tmp_path / "out")
    )
    assert f"--target {target}" in command
    assert (f"--sglang-version {version}" in command) == (version is not None)
    args = shlex.split(command)
    assert args[:2] == ["specdraft", "export"]
    result = CliRunner().invoke(app, args[1:])
    assert result.exit_code == 0, result.output
    keys = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert not any(k.startswith("layers.0.") for k in keys)
    passed = run_doctor(tmp_path / "out", target=target, engine="sglang", sglang_version=version)
    assert passed.finding("keys_match_engine").verdict == "pass"
