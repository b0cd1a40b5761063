"""Options with a fixed set of values are click choices: a value outside the set is click's usage
error (exit 2) naming the option and listing every accepted value, like any other usage error,
and --help shows the set. The sets match what the library accepts."""

from __future__ import annotations

from typing import get_args

import pytest
from typer.testing import CliRunner

from specdraft.cli import app
from specdraft.cli import options as cli
from specdraft.cli.engine_setting import engine_dtype

DTYPE_NAMES = ("bf16", "fp16", "fp32", "bfloat16", "float16", "float32")
ENGINE_DTYPES = ("fp32", "bf16", "fp16")

# (command, option, accepted values); each command fails on a missing argument or option once
# its choice is accepted, so no model is needed
CHOICES = [
    ("capture", "--dtype", DTYPE_NAMES),
    ("capture", "--target-dtype", DTYPE_NAMES),
    ("regenerate", "--api", ("chat", "completions")),
    ("convert", "--layout", ("sglang", "speculators", "specdraft")),
    ("generate", "--dtype", ENGINE_DTYPES),
    ("train", "--precision", ("fp32", "bf16")),
    ("train", "--method", ("eagle3", "eagle3.1", "dflash")),
    ("train", "--target-dtype", DTYPE_NAMES),
    ("export", "--engine", ("sglang", "vllm", "speculators")),
    ("export", "--dtype", DTYPE_NAMES),
    ("doctor", "--engine", ("sglang", "vllm")),
    ("serve", "--dtype", ENGINE_DTYPES),
    ("tune", "--dtype", ENGINE_DTYPES),
]
IDS = [f"{command} {option}" for command, option, _ in CHOICES]


def invoke(args: list[str]):
    return CliRunner().invoke(app, args, env={"COLUMNS": "400", "TERMINAL_WIDTH": "400"})


@pytest.mark.parametrize("command,option,values", CHOICES, ids=IDS)
def test_a_value_outside_the_choices_is_a_usage_error_listing_them(command, option, values):
    result = invoke([command, option, "int8"])
    assert result.exit_code == 2, result.output
    listed = ", ".join(
        f"'{value}'" for value in values
    )  # specdraft's words, not pydantic's "Value error, ..."
    assert (
        f"Error: Invalid value for '{option}': 'int8' is not one of {listed}.\n" in result.output
    ), result.output
    assert "Traceback" not in result.output and "error: " not in result.output


@pytest.mark.parametrize("command,option,values", CHOICES, ids=IDS)
def test_every_choice_is_accepted_and_shown_in_help(command, option, values):
    for value in values:
        result = invoke(
            [command, option, value]
        )  # then refused for what is missing, not for the value
        assert result.exit_code == 2 and "Missing " in result.output, (value, result.output)
        assert "Invalid value" not in result.output, (value, result.output)
    assert f"{option} <{'|'.join(values)}>" in invoke([command, "--help"]).output


def test_the_choices_match_the_library():
    from specdraft.checkpoint import LAYOUTS
    from specdraft.conventions import DTYPES
    from specdraft.doctor.inputs import DOCTOR_ENGINES
    from specdraft.export import EXPORT_ENGINES

    assert set(get_args(cli.DtypeName)) == set(DTYPES)
    assert set(get_args(cli.Layout)) == set(LAYOUTS)
    assert set(get_args(cli.ExportEngine)) == set(EXPORT_ENGINES)
    assert set(get_args(cli.DoctorEngine)) == set(DOCTOR_ENGINES)
    assert {name: engine_dtype(name) for name in get_args(cli.EngineDtype)} == {
        name: DTYPES[name] for name in ENGINE_DTYPES
    }


class Stop(ValueError):
    pass


def _record(calls: list[dict]):
    def fake(*args, **kwargs):
        calls.append(kwargs)
        raise Stop("stopped after parsing")

    return fake


def test_export_dtype_and_doctor_engine_left_out_mean_keep_and_all(monkeypatch, tmp_path):
    import specdraft.doctor
    import specdraft.export

    calls: list[dict] = []
    monkeypatch.setattr(specdraft.export, "export_draft", _record(calls))
    monkeypatch.setattr(specdraft.doctor, "run_doctor", _record(calls))
    for extra in ([], ["--dtype", "bfloat16"]):
        result = invoke(
            ["export", str(tmp_path), str(tmp_path / "out"), "--engine", "vllm", *extra]
        )
        assert "stopped after parsing" in result.output, result.output
    for extra in ([], ["--engine", "sglang"]):
        result = invoke(["doctor", str(tmp_path), *extra])
        assert "stopped after parsing" in result.output, result.output
    assert [(c.get("engine"), c.get("dtype")) for c in calls] == [
        ("vllm", None),
        ("vllm", "bfloat16"),
        (None, None),
        ("sglang", None),
    ]
