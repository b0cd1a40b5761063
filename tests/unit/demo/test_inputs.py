"""`specdraft demo` refuses bad inputs with one `error: ...` line (exit 2, a usage error, as click's
for a bad option value) before any stage runs, and a later stage's error is one line too (exit 1, no
traceback)."""

from __future__ import annotations

import json
import pathlib

import pytest
from typer.testing import CliRunner

import specdraft.demo.run as run
import specdraft.demo.stages as demo
from specdraft.capture.store import CaptureError
from specdraft.cli import app
from specdraft.demo.config import DemoConfig
from specdraft.demo.inputs import check_inputs, parse_documents, split_documents
from specdraft.errors import UnusableInput


def invoke(args: list[str]):
    return CliRunner().invoke(app, ["demo", *args], env={"COLUMNS": "400", "TERMINAL_WIDTH": "400"})


@pytest.fixture
def no_stages(monkeypatch):
    """Fail the test if the first expensive stage (converting the target) starts."""

    def stage_target(cfg, say=print):
        raise AssertionError("a stage ran before the inputs were checked")

    monkeypatch.setattr(demo, "stage_target", stage_target)


def one_error_line(result, *fragments: str, exit_code: int = 2) -> str:
    lines = result.output.strip().splitlines()
    assert result.exit_code == exit_code, result.output
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert "Traceback" not in result.output
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def drafter_dir(path):
    path.mkdir()
    (path / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["LlamaForCausalLMEagle3"],
                "model_type": "llama",
                "num_hidden_layers": 1,
                "hidden_size": 64,
                "num_attention_heads": 8,
                "vocab_size": 512,
                "draft_vocab_size": 512,
            }
        )
    )
    return path


@pytest.mark.parametrize(
    "args, fragments",
    [
        (["--num-train", "0"], ["--num-train 0", "at least 2"]),
        (["--train-steps", "0"], ["--train-steps 0", "at least 1"]),
        (["--train-steps", "-5"], ["--train-steps -5", "at least 1"]),
        (["--device", "mps"], ["--device mps", "cpu or cuda"]),
    ],
)
def test_bad_flags_are_one_line_before_any_stage(tmp_path, no_stages, args, fragments):
    one_error_line(invoke(["--out", str(tmp_path / "out"), *args]), *fragments)
    assert not (tmp_path / "out").exists()


def test_missing_data_file_is_refused_before_the_target_is_converted(tmp_path, no_stages):
    one_error_line(
        invoke(["--out", str(tmp_path / "out"), "--data", str(tmp_path / "missing.txt")]),
        "--data",
        "missing.txt",
        "no such file",
    )  # exit 2, as a missing --target's (it was 1)
    missing_target = invoke(["--out", str(tmp_path / "out"), "--target", str(tmp_path / "nowhere")])
    assert missing_target.exit_code == 2, missing_target.output
    assert not (tmp_path / "out").exists()


def test_too_few_documents_names_the_count_and_the_fix(tmp_path, no_stages):
    data = tmp_path / "small.txt"
    data.write_text("\n\n".join(f"story {i}" for i in range(16)))
    line = one_error_line(
        invoke(["--out", str(tmp_path / "out"), "--data", str(data)]),
        "holds 16 document(s)",
        "needs 816",
        "--num-train",
    )
    assert "at most 0" not in line  # 16 documents minus 16 held out: more documents are the fix
    data.write_text("\n\n".join(f"story {i}" for i in range(40)))
    one_error_line(
        invoke(["--out", str(tmp_path / "out"), "--data", str(data)]),
        "lower --num-train to at most 24",
    )


def test_help_names_the_held_out_count_num_train_adds_to():
    help_text = " ".join(invoke(["--help"]).output.split())
    assert "holds out 16 documents of --data" in help_text
    assert "--data needs --num-train + 16" in help_text


def test_too_few_chats_name_the_count_a_file_needs(tmp_path, no_stages):
    """16 chats with --chat-template: the 16 held-out chats are fixed, so no --num-train fits;
    the one line names the count the file needs (was "lower --num-train")."""
    template = tmp_path / "chat.jinja"
    template.write_text("{% for m in messages %}{{ m['content'] }}\n{% endfor %}")
    data = tmp_path / "chats.jsonl"
    chat = [{"role": "user", "content": "hi"}]
    data.write_text("".join(json.dumps({"messages": chat}) + "\n" for _ in range(16)))
    args = ["--out", str(tmp_path / "out"), "--data", str(data), "--chat-template", str(template)]
    line = one_error_line(
        invoke(args), "holds 16 chat(s)", "pass at least 18 chats (--num-train 2 + 16 held out)"
    )
    assert "lower --num-train" not in line
    one_error_line(invoke([*args, "--num-train", "2"]), "needs 18", "pass at least 18 chats")


def test_jsonl_data_without_text_field_is_one_line_and_names_the_formats(tmp_path, no_stages):
    data = tmp_path / "chat.jsonl"
    data.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    one_error_line(
        invoke(["--out", str(tmp_path / "out"), "--data", str(data)]),
        "line 1",
        '"text"',
        "blank lines",
        "JSONL",
    )


def test_jsonl_text_records_are_documents():
    text = (
        "\n".join(
            json.dumps({"text": t, "id": i}) for i, t in enumerate(["one\n\ntwo", "three", ""])
        )
        + "\n"
    )
    assert parse_documents(text) == [
        "one\ntwo",
        "three",
    ]  # inner blank lines would split a document later
    assert parse_documents("a\nb\n\n\nc\n") == ["a\nb", "c"]
    with pytest.raises(ValueError, match="line 2: bad JSON"):
        parse_documents('{"text": "x"}\nnot json\n')


def test_jsonl_data_passes_the_input_check(tmp_path):
    data = tmp_path / "docs.jsonl"
    data.write_text("".join(json.dumps({"text": f"story {i}"}) + "\n" for i in range(10)))
    check_inputs(DemoConfig(out=tmp_path / "out", data=data, num_train=8, num_heldout=2))
    with pytest.raises(ValueError, match="holds 10 document"):
        check_inputs(DemoConfig(out=tmp_path / "out", data=data, num_train=9, num_heldout=2))


def test_drafter_as_target_is_refused_before_any_stage(tmp_path, no_stages):
    target = drafter_dir(tmp_path / "draft")
    one_error_line(
        invoke(["--out", str(tmp_path / "out"), "--target", str(target)]),
        f"--target {target}",
        "EAGLE-3 drafter",
        "not a target model",
        exit_code=1,
    )  # every command's --target check (cli.common.refuse_wrong_kind)
    assert not (tmp_path / "out").exists()
    with pytest.raises(ValueError, match="EAGLE-3 drafter, not a target model.*leave --target out"):
        check_inputs(
            DemoConfig(out=tmp_path / "out", target=target)
        )  # the library path, without the CLI


def test_target_with_too_few_layers_is_refused(tmp_path, no_stages):
    target = tmp_path / "tiny"
    target.mkdir()
    (target / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["LlamaForCausalLM"],
                "model_type": "llama",
                "num_hidden_layers": 2,
                "hidden_size": 64,
                "num_attention_heads": 8,
                "vocab_size": 512,
            }
        )
    )
    one_error_line(
        invoke(["--out", str(tmp_path / "out"), "--target", str(target)]),
        f"--target {target}",
        "too few layers",
        "at least 4 decoder layers",
    )


def test_a_later_stage_error_is_one_line(tmp_path, monkeypatch):
    def stage_target(cfg, say=print):
        raise CaptureError("capture: the store is full")

    monkeypatch.setattr(demo, "stage_target", stage_target)
    one_error_line(
        invoke(["--out", str(tmp_path / "out")]), "capture: the store is full", exit_code=1
    )


def test_few_train_steps_give_a_valid_training_config(tmp_path, stopped_train):
    seen = stopped_train
    with pytest.raises(RuntimeError, match="stop here"):  # not "--config key eval_every 0"
        demo.stage_train(DemoConfig(out=tmp_path, train_steps=2), tmp_path / "store")
    assert seen["config"].eval_every == 1 and seen["config"].total_steps == 2


@pytest.mark.parametrize("sub", ["", "inner"])
def test_out_that_is_a_file_is_one_line_before_any_stage(tmp_path, no_stages, sub):
    afile = tmp_path / "afile"
    afile.write_text("not a directory")
    out = afile / sub if sub else afile
    line = one_error_line(
        invoke(["--out", str(out)]),
        f"--out {out}",
        f"{afile} is a file",
        "pass a directory (created if missing)",
    )
    assert "Errno" not in line and afile.read_text() == "not a directory"


def test_too_few_documents_to_split_is_an_unusable_input():
    text = "\n\n".join(f"doc {i}" for i in range(10))
    with pytest.raises(UnusableInput, match="holds 10 documents; the demo needs 11"):
        split_documents(text, 10, 1, seed=0)


def test_an_out_the_os_refuses_to_create_is_one_line(tmp_path, monkeypatch):
    def refuse(self, *args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(run, "check_inputs", lambda cfg: None)
    monkeypatch.setattr(pathlib.Path, "mkdir", refuse)
    out = tmp_path / "out"
    with pytest.raises(
        UnusableInput, match=f"^--out {out}: cannot create it \\(Permission denied\\)"
    ):
        run.start(DemoConfig(out=out), console=None)
