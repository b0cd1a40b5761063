"""Mistakes a first-time user makes get one actionable line naming the file and the fix: the
target given to doctor as the drafter, a drafter doctored against another target, a broken
--samples file, hints naming options the command has, generate without --draft, files where
directories belong, a draft tree without --num-draft-tokens, option names instead of fields."""

from __future__ import annotations

import json
import re

import pytest

from specdraft.data.records import BadRecord, DataError, read_records
from specdraft.doctor import CHECKS, run_doctor
from specdraft.engine.spec_config import SpecConfig
from tests.support.cli import cli_args, flat, invoke, one_error
from tests.support.doctor_helpers import draft_checkpoint, one_thread  # noqa: F401
from tests.support.tiny_models import save_tiny_model
from tests.support.tiny_tokenizer import save_tiny_tokenizer


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """(draft dir, its target dir, another target dir) — the other one has 6 layers, not 5."""
    root = tmp_path_factory.mktemp("user-errors")
    draft, target = draft_checkpoint(root)
    return draft, target, save_tiny_model("llama", root / "other", num_layers=6)


@pytest.fixture(scope="module")
def target_with_tokenizer(tmp_path_factory):
    """A tiny Llama target directory with a word-level chat tokenizer (fits its vocabulary)."""
    path = save_tiny_model("llama", tmp_path_factory.mktemp("tok") / "target")
    save_tiny_tokenizer(path)
    return path


def write_lines(path, lines: list[str]):
    path.write_text("".join(line + "\n" for line in lines))
    return path


# --------------------------------------------------------------------- 1. doctor given the target


def test_doctor_on_a_target_directory_says_it_is_no_drafter(world):
    _, target, _ = world
    with pytest.raises(
        ValueError,
        match=r"target is a transformers target model \(LlamaForCausalLM, "
        r"5 layers\), not an EAGLE-3 drafter",
    ):
        run_doctor(target)
    result = invoke(["doctor", str(target)])
    assert result.exit_code == 1, result.output  # as every command given a target for a drafter
    text = flat(result.output)
    assert (
        "not an EAGLE-3 drafter: pass the drafter directory" in text
        and "this directory as --target" in text
    )
    assert "SKIP" not in text


# ------------------------------------------------------------ 2. doctor against another target


def test_doctor_names_the_target_the_drafter_was_trained_for(world):
    draft, target, other = world
    assert CHECKS[0].__name__ == "target_matches_training"
    finding = run_doctor(draft, target=other).finding("target_matches_training")
    assert finding.verdict == "fail"
    assert finding.evidence.startswith(
        f"this drafter was trained for target {target.resolve()} "
        "(LlamaForCausalLM, 5 layers, hidden 32, vocab 128"
    )
    assert f"not --target {other} (LlamaForCausalLM, 6 layers" in finding.evidence
    assert "num_layers, config_hash differ" in finding.evidence
    assert f"--target {target.resolve()}" in finding.fix
    same = run_doctor(draft, target=target).finding("target_matches_training")
    assert same.verdict == "pass" and "is the same model" in same.evidence
    assert run_doctor(draft).finding("target_matches_training").verdict == "skip"


# ------------------------------------------------------------------ 3. a broken --samples file


@pytest.mark.parametrize(
    "lines, where",
    [
        (['{"input_ids": [1, 2, 3, 4]}', '{"input_ids": [1, 2'], r"bad.jsonl:2: bad JSON"),
        (
            ['{"input_ids": [1, 2, 3, 4]}', '{"input_ids": "1 2 3"}'],
            r"bad.jsonl:2: input_ids must be a list of ints",
        ),
        (
            ['{"input_ids": [1, 2, 3, 4], "loss_mask": [1]}'],
            r"bad.jsonl:1: loss_mask must be 4 zeros and ones",
        ),
        (['{"prompt_ids": [1, 2, 3]}'], r"bad.jsonl:1: no non-empty 'text' or 'completion' field"),
        (['{"messages": [{"role": "user", "content": "hi"}]}'], r"bad.jsonl:1: no assistant turn"),
        (["not json"], r"bad.jsonl:1: bad JSON"),
    ],
)
def test_unreadable_samples_are_an_error_naming_file_and_line(world, tmp_path, lines, where):
    draft, _, _ = world
    bad = write_lines(tmp_path / "bad.jsonl", lines)
    with pytest.raises(DataError, match=r"^--samples .*" + where):
        run_doctor(draft, samples=bad)  # no --target: the file is read all the same


def test_doctor_cli_refuses_a_broken_samples_file_and_skip_bad_skips_it(world, tmp_path):
    draft, target, _ = world
    bad = write_lines(tmp_path / "bad.jsonl", ['{"input_ids": [1, 2, 3, 4, 5]}', "{"])
    result = invoke(cli_args("doctor", draft, target=target, samples=bad))
    assert result.exit_code == 2, result.output
    assert f"--samples {bad}:2: bad JSON" in flat(result.output)
    assert "(or pass --skip-bad to skip and count bad records)" in flat(result.output)
    skipped = invoke(
        cli_args("doctor", draft, target=target, samples=bad, skip_bad=True, json=True)
    )
    assert skipped.exit_code == 0, skipped.output
    assert json.loads(skipped.stdout)["ok"]


def test_samples_too_short_to_draft_are_an_error(world, tmp_path):
    draft, _, _ = world
    short = write_lines(tmp_path / "short.jsonl", ['{"input_ids": [1, 2]}'])
    with pytest.raises(DataError, match="short.jsonl: no sample of 3 tokens or more"):
        run_doctor(draft, samples=short)


# -------------------------------------------------- 4. hints name options the command really has


def test_data_errors_name_no_option_a_caller_may_lack(tmp_path):
    chat = (
        '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}'
    )
    bad = write_lines(
        tmp_path / "bad.jsonl", [chat, '{"text": "hi"}']
    )  # one text record among chats
    with pytest.raises(BadRecord) as info:
        read_records(bad, chat=True)
    message = str(info.value)
    assert (
        "skip_bad" not in message and "--skip-bad" not in message and "no-chat mode" not in message
    )
    assert "for text records pass --no-chat (capture, regenerate, train --online)" in message
    assert "chat=False" not in message


def test_train_online_and_capture_say_how_they_skip_bad_records(target_with_tokenizer, tmp_path):
    bad = write_lines(tmp_path / "data.jsonl", ['{"text": "hello how are you"}', "{oops"])
    train = invoke(
        cli_args(
            "train", bad, tmp_path / "run", online=True, target=target_with_tokenizer, no_chat=True
        )
    )
    assert train.exit_code == 1, train.output
    text = flat(train.output)
    assert (
        f"{bad}:2: bad JSON" in text
        and "(or pass --skip-bad to skip and count bad records)" in text
    )
    capture = invoke(
        ["capture", str(target_with_tokenizer), str(bad), str(tmp_path / "store"), "--no-chat"]
    )
    assert capture.exit_code == 1, capture.output
    assert f"{bad}:2: bad JSON" in flat(capture.output)
    assert "(or pass --skip-bad to skip and count bad records)" in flat(capture.output)


# ------------------------------------------------------------- 5. generate without --draft


def test_generate_without_draft_decodes_plainly_as_its_help_says(target_with_tokenizer):
    assert "omit for plain decoding" in flat(invoke(["generate", "--help"]).output)
    result = invoke(
        cli_args(
            "generate",
            target=target_with_tokenizer,
            prompt="hello how",
            max_new_tokens=4,
            max_seq_len=32,
        )
    )
    assert result.exit_code == 0, result.output
    assert "plain decoding (no --draft)" in result.output


@pytest.mark.parametrize("flags", [[], ["--no-spec"]])
def test_plain_generate_prints_tokens_and_time_without_drafting_metrics(
    target_with_tokenizer, flags
):
    """Plain decoding verifies and drafts nothing: its table has no tau, verification steps, drafted
    tokens, p_k or draft time."""
    result = invoke(
        [
            "generate",
            "--target",
            str(target_with_tokenizer),
            "--prompt",
            "hello how",
            "--max-new-tokens",
            "4",
            "--max-seq-len",
            "32",
            "--ignore-eos",
            *flags,
        ]
    )
    assert result.exit_code == 0, result.output
    table = result.output[result.output.index("plain decoding") :]
    rows = [line.strip("│┃ ").split("│")[0].strip() for line in table.splitlines() if "│" in line]
    assert rows == ["output tokens", "time prefill / decode (s)", "tokens/s"], rows
    assert re.search(r"output tokens\s*│\s*4\s*│", table), table
    for word in ("tau", "verif", "drafted", "p_k"):
        assert word not in table, word


# ------------------------------------------------------------------------- 6. path mistakes


@pytest.mark.parametrize("command", [["generate", "--prompt", "hi"], ["serve"], ["tune"]])
def test_draft_given_as_its_weights_file_names_the_directory(tmp_path, command):
    (tmp_path / "target").mkdir()
    (tmp_path / "target" / "config.json").write_text("{}")
    (tmp_path / "draft").mkdir()
    weights = tmp_path / "draft" / "model.safetensors"
    weights.write_bytes(b"")
    (tmp_path / "draft" / "config.json").write_text(
        "{}"
    )  # a checkpoint directory: named as the fix
    result = invoke(command + ["--target", str(tmp_path / "target"), "--draft", str(weights)])
    assert result.exit_code == 2, result.output
    text = flat(result.output)
    assert (
        f"Invalid value for '--draft': {weights} is a file; pass the checkpoint directory" in text
    )
    assert f"(here: {tmp_path / 'draft'})" in text and "config.json: missing" not in text


def test_train_on_a_data_file_without_online_says_how_to_train_on_it(tmp_path):
    data = write_lines(tmp_path / "chats.jsonl", ['{"text": "hi"}'])
    result = invoke(["train", str(data), str(tmp_path / "run")])
    assert result.exit_code == 1, result.output
    text = flat(result.output)
    assert f"{data} is a data file, not a capture store directory" in text
    assert (
        "--online --target DIR" in text and "specdraft capture" in text and "index.json" not in text
    )


@pytest.mark.parametrize(
    "text, words",
    [
        (
            '{"lr": 1e-4,}',
            "not JSON (Expecting property name enclosed in double quotes at line 1 column 13)",
        ),
        (
            '{"learning_rate": 1e-4}',
            "unknown keys: learning_rate; TrainConfig fields are lr, warmup_steps,",
        ),
        (
            '{"ttt_step": 3, "warmup_step": 1, "zzz": 0}',
            "unknown keys: ttt_step (did you mean ttt_steps?), "
            "warmup_step (did you mean warmup_steps?), zzz; TrainConfig fields",
        ),
        ('{"lr": -1}', "--lr -1: must be positive"),
        ('{"total_steps": 3, "epochs": 1}', "both set (--config): keep one run length"),
    ],
)
def test_train_names_a_bad_config_file(tmp_path, text, words):
    """A --config the run cannot use is a usage error (exit 2, as click's for a bad value), one line;
    a mistyped key names the field it is closest to."""
    store = tmp_path / "store"
    store.mkdir()
    config = tmp_path / "cfg.json"
    config.write_text(text)
    result = invoke(["train", str(store), str(tmp_path / "run"), "--config", str(config)])
    assert result.exit_code == 2, result.output
    assert (
        flat(result.output).startswith("error: ") and len(result.output.strip().splitlines()) == 1
    )
    assert words in flat(result.output), result.output
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--method", "dflash", "--ttt-steps", "4"], "--ttt-steps 4: a setting of --method eagle3"),
        (
            ["--method", "eagle3", "--block-size", "4"],
            "--block-size 4: a setting of --method dflash",
        ),
    ],
)
def test_train_refuses_a_flag_of_another_method(tmp_path, args, words):
    store = tmp_path / "store"
    store.mkdir()
    result = invoke(["train", str(store), str(tmp_path / "run"), *args])
    one_error(result, words, "which ignores it: drop it", code=2)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("values", "args", "words"),
    [
        ({"num_anchors": 16}, [], "key num_anchors is a setting of --method dflash"),
        ({"ttt_steps": 4}, ["--method", "dflash"], "key ttt_steps is a setting of --method eagle3"),
    ],
)
def test_train_refuses_a_config_key_of_another_method(tmp_path, values, args, words):
    """A --config key of the other method was ignored silently (the run trained without it)."""
    store = tmp_path / "store"
    store.mkdir()
    config = tmp_path / "c.json"
    config.write_text(json.dumps(values))
    result = invoke(["train", str(store), str(tmp_path / "run"), "--config", str(config), *args])
    one_error(result, f"--config {config}: {words}", f"from {config}, or train --method", code=2)
    assert not (tmp_path / "run").exists()


def test_train_help_says_what_it_trains():
    text = flat(invoke(["train", "--help"]).output)
    assert (
        "Train a drafter on SOURCE into OUT: EAGLE-3" in text and "DFlash (--method dflash)" in text
    )


def test_train_out_that_is_a_file_says_out_is_a_directory(tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    out = tmp_path / "run.txt"
    out.write_text("")
    result = invoke(["train", str(store), str(out)])
    assert result.exit_code == 1, result.output
    text = flat(result.output)
    assert (
        f"{out} is a file; the run directory OUT must be a directory" in text
        and "Errno" not in text
    )


# ----------------------------------------------- 7. a tree without --num-draft-tokens; flag names


@pytest.mark.parametrize(
    "command",
    [
        ["export", "{draft}", "{out}", "--engine", "sglang"],
        cli_args("generate", target="{target}", draft="{draft}", prompt="hi"),
        ["serve", "--target", "{target}", "--draft", "{draft}"],
    ],
)
def test_an_invalid_speculative_triple_is_a_usage_error_in_every_command(world, tmp_path, command):
    """--num-steps 3 --topk 1 --num-draft-tokens 7 (a chain verifies num_steps + 1 nodes) exits 2,
    before anything loads, in export as in generate and serve (export exited 1)."""
    draft, target, _ = world
    words = [w.format(draft=draft, target=target, out=tmp_path / "out") for w in command]
    result = invoke([*words, "--num-steps", "3", "--topk", "1", "--num-draft-tokens", "7"])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and "num_draft_tokens" in flat(result.output).replace(
        "-", "_"
    )
    assert not (tmp_path / "out").exists()


def test_tree_without_num_draft_tokens_names_the_flag_and_a_valid_value(tmp_path):
    (tmp_path / "target").mkdir()
    (tmp_path / "target" / "config.json").write_text("{}")
    (tmp_path / "draft").mkdir()
    result = invoke(
        cli_args(
            "generate", target=tmp_path / "target", prompt="hi", draft=tmp_path / "draft", topk=4
        )
    )
    assert result.exit_code == 2, result.output  # a usage error, as --topk 0 is
    text = flat(result.output)
    assert (
        "--topk 4 drafts a tree, which needs --num-draft-tokens (nodes verified per step incl. the "
        "root: 2..37 with --num-steps 3), e.g. --num-draft-tokens 13"
    ) in text
    assert "SpecConfig" not in text
    assert SpecConfig(3, 4, 13).num_draft_tokens == 13  # the example is a valid setting


@pytest.mark.parametrize(
    "args, flag",
    [
        (["train", "{dir}", "{dir}/run", "--batch-size", "0"], "--batch-size"),
        (["train", "{dir}", "{dir}/run", "--ttt-steps", "0"], "--ttt-steps"),
        (cli_args("generate", target="{dir}", prompt="hi", num_steps=0), "--num-steps"),
    ],
)
def test_out_of_range_options_are_named_by_their_flag(tmp_path, args, flag):
    (tmp_path / "config.json").write_text("{}")
    result = invoke([a.replace("{dir}", str(tmp_path)) for a in args])
    assert result.exit_code == 2, result.output
    text = flat(result.output)
    assert f"Invalid value for '{flag}'" in text and "Config." not in text


@pytest.mark.parametrize(
    "command",
    [
        ["export", "{path}", "{out}", "--engine", "vllm"],
        ["inspect", "{path}"],
        ["convert", "{path}", "{out}", "--layout", "sglang"],
    ],
)
def test_a_drafter_path_that_does_not_exist_is_a_usage_error_in_every_command(tmp_path, command):
    """A missing CHECKPOINT is a bad command line (exit 2) naming the path and the forms accepted,
    in export as in inspect and convert (export exited 1 with its own line)."""
    missing, out = tmp_path / "no-such-drafter", tmp_path / "out"
    result = invoke([word.format(path=missing, out=out) for word in command])
    assert result.exit_code == 2, result.output
    assert f"{missing}: no such file or directory; pass a drafter directory" in flat(result.output)
    assert not out.exists()
