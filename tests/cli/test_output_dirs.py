"""Writing a drafter never destroys what it should not: `export` / `convert` / `save_draft`
refuse a file or a directory of other files as OUT, replace an earlier drafter atomically,
and write weights readable by other users (a server in another account)."""

from __future__ import annotations

import os
import stat

import pytest
from typer.testing import CliRunner

from specdraft.checkpoint import CheckpointError, check_output_dir, load_draft, save_draft
from specdraft.cli import app
from specdraft.export import export_draft
from tests.support.cli import cli_args
from tests.support.doctor_helpers import draft_checkpoint, one_thread  # noqa: F401


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return draft_checkpoint(tmp_path_factory.mktemp("llama"))


def test_export_refuses_a_directory_of_other_files_and_keeps_them(llama, tmp_path):
    draft, target = llama
    out = tmp_path / "notes"
    (out / "sub").mkdir(parents=True)
    (out / "notes.txt").write_text("keep me")
    with pytest.raises(CheckpointError, match="not an EAGLE-3 drafter"):
        export_draft(draft, out, engine="vllm", target=target)
    assert (out / "notes.txt").read_text() == "keep me" and (out / "sub").is_dir()


def test_export_refuses_a_file_and_a_target_model_directory(llama, tmp_path):
    draft, target = llama
    config = (target / "config.json").read_text()
    for out in (target / "config.json", target):
        result = CliRunner().invoke(
            app, cli_args("export", draft, out, engine="vllm", target=target)
        )
        assert result.exit_code == 1, result.output
        assert "error:" in result.output and "Traceback" not in result.output
    assert (target / "config.json").read_text() == config


def test_export_and_convert_refuse_to_write_over_their_source(llama, tmp_path):
    """OUT = CHECKPOINT would replace the drafter being read (a cast or a dropped manifest, silently):
    a usage error (exit 2, one line), the drafter left as it was."""
    draft, _ = llama
    before = {f.name: f.read_bytes() for f in draft.iterdir()}
    for args in (
        cli_args("export", draft, draft, engine="vllm", dtype="bf16"),
        ["convert", draft, draft, "--layout", "sglang"],
    ):
        result = CliRunner().invoke(app, [str(a) for a in args], env={"COLUMNS": "400"})
        assert result.exit_code == 2, result.output
        assert result.output == (
            f"error: {draft}: is the checkpoint being read; writing there would replace it: "
            "give another output directory\n"
        )
    assert {f.name: f.read_bytes() for f in draft.iterdir()} == before


def test_convert_refuses_a_directory_of_other_files(llama, tmp_path):
    draft, _ = llama
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "data.bin").write_bytes(b"x")
    result = CliRunner().invoke(
        app, ["convert", str(draft), str(tmp_path / "other"), "--layout", "sglang"]
    )
    assert result.exit_code == 1 and "not an EAGLE-3 drafter" in result.output, result.output
    assert (tmp_path / "other" / "data.bin").read_bytes() == b"x"


def test_an_earlier_drafter_or_an_empty_directory_is_replaced(llama, tmp_path):
    draft, target = llama
    (tmp_path / "empty").mkdir()
    export_draft(draft, tmp_path / "empty", engine="vllm", target=target)
    export_draft(draft, tmp_path / "empty", engine="sglang", target=target)  # over the vLLM export
    assert load_draft(tmp_path / "empty").layout == "specdraft"  # manifest copied alongside
    assert check_output_dir(tmp_path / "empty") == (tmp_path / "empty").resolve()


def test_dot_names_the_current_directory(llama, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert check_output_dir(".") == tmp_path.resolve()


def test_weights_are_readable_by_others(llama, tmp_path):
    draft, target = llama
    old = os.umask(0o022)
    try:
        export_draft(draft, tmp_path / "e", engine="vllm", target=target)
        save_draft(load_draft(draft).model, tmp_path / "s", layout="sglang")
    finally:
        os.umask(old)
    for path in (tmp_path / "e" / "model.safetensors", tmp_path / "s" / "model.safetensors"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o644, oct(path.stat().st_mode)
