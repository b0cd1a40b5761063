"""specdraft.cli option parsing: integer lists and checkpoint directories give one clear usage
error naming the bad value (exit 2), never a traceback or a message about a path that was not given;
--version, and positional arguments named in upper case as the commands' help names them."""

from __future__ import annotations

import re

import pytest
import typer
from typer.testing import CliRunner

from specdraft.cli import app
from specdraft.cli.checks import check_checkpoint_dir, int_list
from tests.support.cli import cli_args, flat, invoke


def test_int_list():
    assert int_list("1,4,16") == (1, 4, 16)
    assert int_list(" 2, 3 ") == (2, 3)
    assert int_list("") == ()
    with pytest.raises(
        typer.BadParameter, match=r"'1,a,3': 'a' is not an integer; give comma-separated integers"
    ):
        int_list("1,a,3")
    with pytest.raises(typer.BadParameter, match=r"'' is not an integer"):
        int_list("1,,3")


@pytest.mark.parametrize(
    "args",
    [
        ["bench", "--url", "http://127.0.0.1:1", "--concurrency", "a,b"],
        cli_args("tune", topks="1,x", target="unused", draft="unused"),
        cli_args("capture", "{dir}", "data.jsonl", "out", aux_layers="2,three"),
    ],
)
def test_integer_list_options_give_a_usage_error(args, tmp_path):
    (tmp_path / "config.json").write_text("{}")  # passes capture's --target check
    result = invoke([a.replace("{dir}", str(tmp_path)) for a in args])
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert re.search(
        r"Invalid value for '--(concurrency|topks|aux-layers)': '[^']+': '\w+' is not an integer",
        flat(result.output),
    ), result.output


def test_inspect_given_a_file_names_the_directory(tmp_path, monkeypatch):
    ckpt = tmp_path / "draft"
    ckpt.mkdir()
    (ckpt / "model.safetensors").write_bytes(b"")
    stray = invoke(
        ["inspect", str(ckpt / "model.safetensors")]
    )  # no config.json: no checkpoint to name
    assert stray.exit_code == 2 and "here:" not in stray.output, stray.output
    assert "model.safetensors, not the file" in flat(stray.output)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "demo.out").write_text(
        "a stray file"
    )  # the fresh-user trial: "(here: .)", no checkpoint there
    stray = invoke(["inspect", "demo.out"])
    assert stray.exit_code == 2 and "here:" not in stray.output, stray.output
    (ckpt / "config.json").write_text("{}")
    result = invoke(["inspect", str(ckpt / "model.safetensors")])
    assert result.exit_code == 2
    text = flat(result.output)
    assert (
        f"{ckpt / 'model.safetensors'} is a file; pass the checkpoint directory that holds config.json and "
        f"model.safetensors (here: {ckpt}), not the file"
    ) in text
    assert "config.json: missing" not in text
    missing = invoke(["inspect", str(tmp_path / "nowhere")])
    assert missing.exit_code == 2 and f"{tmp_path / 'nowhere'}: no such file or directory" in flat(
        missing.output
    )
    with pytest.raises(typer.BadParameter, match="is a file"):
        check_checkpoint_dir(str(ckpt / "model.safetensors"))
    assert check_checkpoint_dir(str(ckpt)) == str(ckpt)


def test_bench_and_tune_check_their_output_paths_before_running(tmp_path):
    """A result file path that cannot be written is refused before minutes of measuring."""
    (tmp_path / "file").write_text("x")
    bench = CliRunner().invoke(
        app, ["bench", "--url", "http://127.0.0.1:9", "--out", str(tmp_path / "file")]
    )
    assert bench.exit_code == 1 and "--out" in bench.output and "is a file" in bench.output, (
        bench.output
    )
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")  # never loaded: the check comes first
    for bad in (tmp_path, tmp_path / "missing" / "t.json"):
        tune = CliRunner().invoke(
            app,
            cli_args("tune", target=tmp_path / "model", draft=tmp_path / "model", json_out=bad),
        )
        assert tune.exit_code == 1 and "--json-out" in tune.output, tune.output


def test_inspect_summarises_the_manifest_and_prints_it_whole_on_request(tmp_path):
    """The manifest's training record made inspect a ~200-line JSON dump before the verdict."""
    import json

    from specdraft.checkpoint import save_draft
    from tests.support.drafts import tiny_draft, tiny_manifest

    model = tiny_draft()
    manifest = tiny_manifest(model)
    manifest.training = {"steps": 3, "validation": {"accuracy": [0.5] * 40}}
    ckpt = save_draft(model, tmp_path / "draft", manifest=manifest)
    short = invoke(["inspect", str(ckpt)])
    assert short.exit_code == 0, short.output
    lines = short.output.splitlines()
    start = lines.index("manifest (--manifest prints it whole):")
    assert "  training: 2 fields: steps, validation" in lines and "  aux_layers: [2, 3, 4]" in lines
    assert "  extra: 0 fields" in lines  # no dangling "0 fields: "
    assert lines[-1] == "audit: PASS" and len(lines) - start < 20
    whole = invoke(["inspect", str(ckpt), "--manifest"])
    assert whole.exit_code == 0 and "manifest (--manifest" not in whole.output
    body = whole.output[whole.output.index("{\n") : whole.output.rindex("}") + 1]
    assert json.loads(body)["training"]["validation"]["accuracy"] == [0.5] * 40


def test_the_version_is_asked_one_way():
    """`specdraft --version` prints the version; there is no second way (a `version` command)."""
    from specdraft import __version__

    option, command = invoke(["--version"]), invoke(["version"])
    assert option.exit_code == 0 and option.output == f"{__version__}\n", option.output
    assert command.exit_code == 2 and "No such command 'version'" in command.output


@pytest.mark.parametrize(
    "command, names",
    [
        ("doctor", ["CHECKPOINT"]),
        ("export", ["CHECKPOINT", "OUT"]),
        ("inspect", ["CHECKPOINT"]),
        ("capture", ["TARGET", "DATA", "OUT"]),
        ("regenerate", ["DATA", "OUT"]),
        ("convert", ["SRC", "DST"]),
        ("train", ["SOURCE", "OUT"]),
        ("store convert", ["SRC", "DST"]),
    ],
)
def test_usage_lines_name_positional_arguments_in_upper_case(command, names):
    """Not typer's `{checkpoint}` nor `{CHECKPOINT}`: the plain names the commands' descriptions use
    (CHECKPOINT, OUT), in help and in a usage error's usage line."""
    words = command.split()
    for output in (invoke([*words, "--help"]).output, invoke(words).output):
        usage = output.splitlines()[0]
        assert usage.startswith("Usage: ") and usage.endswith(
            f" {command} [OPTIONS] {' '.join(names)}"
        ), usage
    assert f"Missing argument '{names[0]}'" in invoke(words).output
