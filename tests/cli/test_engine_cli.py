"""`specdraft generate`: loads the tokenizer from the target dir, streams the text to stdout, prints
the metrics table to stderr; speculative, --no-spec and draft-less runs print the target's greedy text."""

from __future__ import annotations

import os

import pytest
from typer.testing import CliRunner

from specdraft.checkpoint import Manifest, save_draft
from specdraft.cli import app
from tests.support.cli import cli_args, cli_options
from tests.support.drafts import save_training_checkpoint
from tests.support.engine_helpers import (  # noqa: F401
    AUX_LAYERS,
    VOCAB,
    copy_with_word_tokenizer,
    greedy_sequences,
    one_thread,
    tiny_setup,
)


def test_generate_streams_text_and_prints_metrics(tmp_path, monkeypatch):
    setup = tiny_setup("llama")
    tokenizer = copy_with_word_tokenizer(setup, tmp_path / "target")
    args = setup.target.args
    manifest = Manifest(
        draft=setup.trained.cfg.to_dict(),
        aux_layers=list(AUX_LAYERS),
        target={"hidden_size": args.hidden_size, "num_layers": args.num_layers},
    )
    draft_dir = save_draft(setup.trained, tmp_path / "draft", manifest=manifest)
    prompt = "w1 w5 w9 w13 w2 w7"
    ids = tokenizer(prompt)["input_ids"]
    expected = tokenizer.decode(greedy_sequences(setup.target, [ids], 12)[0, len(ids) :].tolist())
    common = cli_args(
        "generate", target=tmp_path / "target", prompt=prompt, max_new_tokens=12, max_seq_len=64
    )
    spec = CliRunner().invoke(
        app,
        common + cli_options(draft=draft_dir, topk=2, num_steps=3, num_draft_tokens=6),
    )
    assert spec.exit_code == 0, spec.output
    assert expected in spec.output.replace("\n", "")
    assert "accept length tau" in spec.output and "steps 3, topk 2, draft tokens 6" in spec.output
    # `generate ... > out.txt` keeps the text alone: the prompt and its continuation on stdout, the metrics on stderr
    assert "".join(spec.stdout.split()) == "".join(
        (prompt + expected).split()
    ) and spec.stdout.endswith("\n")
    assert "accept length tau" in spec.stderr and "tokens/s" in spec.stderr
    assert "one generation is no speed measurement" in spec.stderr  # what measures speed:
    assert "`specdraft tune`" in spec.stderr and "`specdraft bench`" in spec.stderr
    defaults = CliRunner().invoke(app, common + ["--draft", str(draft_dir)])  # topk 1, num_steps 3
    assert defaults.exit_code == 0, defaults.output
    assert expected in defaults.output.replace("\n", "")
    assert "steps 3, topk 1, draft tokens 4" in defaults.output
    monkeypatch.setattr(os, "getloadavg", lambda: (64.0, 0.0, 0.0))  # other processes on every core
    plain = CliRunner().invoke(app, common + ["--no-spec"])  # a baseline of the same command
    assert plain.exit_code == 0, plain.output
    assert expected in plain.output.replace("\n", "") and "plain decoding" in plain.output
    assert "note: the machine was busy when this started (load 64.0" in plain.stderr
    assert "".join(plain.stdout.split()) == "".join(
        (prompt + expected).split()
    )  # no table, no note
    assert "--threads 1" not in plain.output  # the remedy, already taken: one thread by default
    more = CliRunner().invoke(app, common + ["--no-spec", "--threads", "2"])
    assert "machine was busy" in more.output and "(e.g. --threads 1)" in more.output
    assert plain.output.startswith(
        prompt
    )  # the prompt, then its continuation: the text reads whole
    monkeypatch.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    no_draft = CliRunner().invoke(app, common)  # --help: "omit for plain decoding"
    assert no_draft.exit_code == 0, no_draft.output
    assert (
        expected in no_draft.output.replace("\n", "")
        and "plain decoding (no --draft)" in no_draft.output
    )
    assert "busy" not in no_draft.output
    on_cpu = CliRunner().invoke(app, common + ["--compile"])  # CUDA graphs: refused, not ignored
    assert (
        on_cpu.exit_code == 2 and "--compile needs a CUDA device" in on_cpu.stderr
    )  # a usage error


@pytest.mark.parametrize(
    "flags, named",
    [
        (["--topk", "1"], "--topk"),
        (["--num-steps", "3"], "--num-steps"),
        (["--num-draft-tokens", "0"], "--num-draft-tokens"),
        (
            cli_options(num_steps=5, topk=2, num_draft_tokens=8),
            "--topk, --num-steps, --num-draft-tokens",
        ),
    ],
)
def test_generate_refuses_drafting_flags_without_a_draft(tmp_path, flags, named):
    """Even a flag given at its default value is refused: without --draft it would be ignored."""
    (tmp_path / "config.json").write_text("{}")  # refused before the target is loaded
    result = CliRunner().invoke(
        app, ["generate", "--target", str(tmp_path), "--prompt", "hi", *flags]
    )
    assert result.exit_code == 2, result.output  # a usage error, as click's for a bad value
    assert result.stdout == ""
    text = " ".join(result.stderr.split())
    assert text == (
        f"error: {named}: drafting settings, but no --draft is given (plain decoding): "
        f"add --draft CKPT, or drop {named}"
    )


def _training_run(setup, run):
    """RUN/checkpoints/step-00000005.pt for setup.trained (`drafts.save_training_checkpoint`)."""
    args = setup.target.args
    manifest = Manifest(
        draft=setup.trained.cfg.to_dict(),
        aux_layers=list(AUX_LAYERS),
        target={
            "hidden_size": args.hidden_size,
            "num_layers": args.num_layers,
            "vocab_size": args.vocab_size,
        },
    )
    return save_training_checkpoint(setup.trained, manifest, run)


def test_generate_takes_a_training_checkpoint_and_points_a_run_directory_at_one(tmp_path):
    """--draft RUN/checkpoints/step-N.pt speculates with that checkpoint's drafter; RUN or
    RUN/checkpoints is refused naming RUN/draft and a step file (not "config.json missing")."""
    import torch

    from specdraft.engine.load import load_engine
    from specdraft.engine.spec_config import SpecConfig

    setup = tiny_setup("llama")
    tokenizer = copy_with_word_tokenizer(setup, tmp_path / "target")
    step = _training_run(setup, tmp_path / "run")
    engine = load_engine(tmp_path / "target", step, SpecConfig.chain(3))
    expected_state = setup.trained.state_dict()
    assert all(torch.equal(v, expected_state[k]) for k, v in engine.draft.state_dict().items())
    prompt = "w1 w5 w9 w13 w2 w7"
    ids = tokenizer(prompt)["input_ids"]
    expected = tokenizer.decode(greedy_sequences(setup.target, [ids], 12)[0, len(ids) :].tolist())
    common = cli_args(
        "generate", target=tmp_path / "target", prompt=prompt, max_new_tokens=12, max_seq_len=64
    )
    result = CliRunner().invoke(app, common + ["--draft", str(step)])
    assert result.exit_code == 0, result.output
    assert (
        expected in result.output.replace("\n", "")
        and "steps 3, topk 1, draft tokens 4" in result.output
    )
    for given, what in (
        (tmp_path / "run", "a training run directory"),
        (tmp_path / "run" / "checkpoints", "a training run's checkpoints directory"),
    ):
        refused = CliRunner().invoke(app, common + ["--draft", str(given)])
        assert refused.exit_code == 1, refused.output
        assert " ".join(refused.output.split()) == (
            f"error: {given} is {what}, not a drafter: pass {tmp_path / 'run' / 'draft'} (the drafter train "
            f"writes at the end) or one of its checkpoints, e.g. {step}"
        )


@pytest.mark.parametrize("command", ["generate", "serve"])
@pytest.mark.parametrize(
    "flags, named",
    [
        (["--num-steps", "5"], "--num-steps"),
        (["--topk", "2", "--num-draft-tokens", "6"], "--topk, --num-draft-tokens"),
        (["--sglang-version", "0.5.23"], "--sglang-version"),
    ],
)
def test_no_spec_refuses_drafting_flags(tmp_path, command, flags, named, monkeypatch):
    """--no-spec with a drafting flag is one line, before anything loads or a server starts."""
    import specdraft.engine.load as engine_load

    def no_load(*args, **kwargs):
        raise AssertionError("loaded a model")

    monkeypatch.setattr(engine_load, "load_engine", no_load)
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "draft").mkdir()
    extra = ["--prompt", "hi"] if command == "generate" else []
    for draft in ([], ["--draft", str(tmp_path / "draft")]):
        result = CliRunner().invoke(
            app, [command, "--target", str(tmp_path), *extra, *draft, "--no-spec", *flags]
        )
        assert result.exit_code == 2, result.output  # a usage error, as click's for a bad value
        assert " ".join(result.stderr.split()) == (
            f"error: {named}: drafting settings, but --no-spec decodes plainly (they would be "
            f"ignored): drop {named}, or drop --no-spec"
        )


@pytest.mark.parametrize(
    "flags, named",
    [(["--temperature", "-1"], "--temperature"), (["--max-new-tokens", "0"], "--max-new-tokens")],
)
def test_generate_checks_sampling_values_before_loading(tmp_path, flags, named, monkeypatch):
    import transformers

    def no_load(*args, **kwargs):
        raise AssertionError("loaded the tokenizer")

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", no_load)
    (tmp_path / "config.json").write_text("{}")
    result = CliRunner().invoke(
        app, ["generate", "--target", str(tmp_path), "--prompt", "hi", *flags]
    )
    assert result.exit_code == 2, result.output  # a usage error, not the load's failure
    assert named in result.output and "Invalid value" in result.output
