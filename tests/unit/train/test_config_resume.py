"""`specdraft train --resume` keeps the run's own settings: options left out come from the
checkpoint, options given are compared with it. Also train's flag-named errors and --help text.

Same tiny seeded target and synthetic store as tests/unit/train/test_loop.py.
"""

from __future__ import annotations

import json

import torch

from specdraft.checkpoint import checkpoint_paths
from specdraft.train.config import TrainConfig, resume_config
from tests.support.cli import cli_args, cli_options, flat, invoke
from tests.support.train_world import one_thread  # noqa: F401

FIRST = cli_options(
    batch_size=4, ttt_steps=2, draft_vocab_size=96, save_every=3, warmup_steps=5, lr="0.003"
)


def trained_config(run) -> dict:
    return torch.load(checkpoint_paths(run)[-1], map_location="cpu", weights_only=False)["config"]


def test_resume_takes_the_settings_left_out_from_the_checkpoint(store, tmp_path):
    run = tmp_path / "run"
    first = invoke(["train", str(store), str(run), *FIRST, "--steps", "3"])
    assert first.exit_code == 0, first.output

    same = invoke(["train", str(store), str(run), "--resume"])  # no flag retyped
    assert same.exit_code == 0, same.output
    text = flat(same.output)
    assert f"resuming from {run / 'checkpoints' / 'step-00000003.pt'} with its settings" in text
    assert "is already at step 3 of 3: nothing to train" in text

    longer = invoke(cli_args("train", store, run, resume=True, steps=6))
    assert longer.exit_code == 0, longer.output
    text = flat(longer.output)
    assert "other settings" not in text and "6 steps, last train loss" in text
    assert "warm-up 5 steps, cosine decay to 0.0 x lr 0.003" in text  # the run's own schedule
    config = trained_config(run)
    assert (
        config["warmup_steps"],
        config["lr"],
        config["batch_size"],
        config["ttt_steps"],
        config["draft_vocab_size"],
        config["save_every"],
        config["total_steps"],
    ) == (5, 0.003, 4, 2, 96, 3, 6)

    again = invoke(cli_args("train", store, run, resume=True, warmup_steps=5, steps=9))
    assert again.exit_code == 0, again.output  # a flag given with the checkpoint's value is fine


def test_resume_refuses_only_the_settings_given_that_differ(store, tmp_path):
    run = tmp_path / "run"
    assert invoke(["train", str(store), str(run), *FIRST, "--steps", "3"]).exit_code == 0
    other = invoke(cli_args("train", store, run, resume=True, warmup_steps=100, steps=6))
    assert other.exit_code == 1
    text = flat(other.output)
    assert (
        "this checkpoint was trained with other settings (--warmup-steps 5 -> 100); leave them out to "
        "resume with the checkpoint's values" in text
    )
    assert "--lr" not in text and "--batch-size" not in text  # not given: taken, not compared
    config = tmp_path / "cfg.json"
    config.write_text(json.dumps({"seed": 1}))
    keyed = invoke(cli_args("train", store, run, resume=True, config=config))
    assert keyed.exit_code == 1
    assert "other settings (--config key seed 0 -> 1)" in flat(keyed.output)


def test_resume_config_replaces_the_run_length_given(store, tmp_path):
    run = tmp_path / "run"
    assert invoke(["train", str(store), str(run), *FIRST, "--epochs", "1"]).exit_code == 0
    kept = resume_config(run, {})
    assert (kept.epochs, kept.total_steps, kept.warmup_steps, kept.lr) == (1, None, 5, 0.003)
    steps = resume_config(run, {"total_steps": 60})
    assert (steps.epochs, steps.total_steps, steps.warmup_steps) == (None, 60, 5)
    assert resume_config(tmp_path / "empty", {"lr": 0.1}) == TrainConfig(lr=0.1)
    cli = invoke(cli_args("train", store, run, resume=True, steps=60))  # checkpoint has epochs 1
    assert cli.exit_code == 0, cli.output
    assert "both set" not in flat(cli.output) and "60 steps, last train loss" in flat(cli.output)


def test_train_errors_name_the_flags_given(store, tmp_path):
    both = invoke(cli_args("train", store, tmp_path / "run", steps=5, epochs=1))
    assert both.exit_code == 2  # a usage error, as the bad --config below
    text = flat(both.output)
    assert (
        "error: --steps 5 and --epochs 1 both set: give one run length (neither = one epoch)"
        in text
    )
    assert "--config" not in text
    run = tmp_path / "run2"
    assert invoke(["train", str(store), str(run), *FIRST, "--steps", "3"]).exit_code == 0
    again = invoke(["train", str(store), str(run), *FIRST, "--steps", "3"])
    assert again.exit_code == 1
    text = flat(again.output)
    assert "already holds checkpoints (step-00000003.pt): pass --resume to continue its run" in text
    assert "resume=True" not in text
    config = tmp_path / "bad.json"
    config.write_text('{"lr": "a\tb"}')  # a raw tab inside a string: "Invalid control character at"
    bad = invoke(["train", str(store), str(tmp_path / "run3"), "--config", str(config)])
    assert bad.exit_code == 2
    assert "not JSON (Invalid control character at line 1 column" in flat(bad.output)
    assert " at at " not in flat(bad.output)


def test_train_help_shows_every_default_and_the_device():
    text = flat(invoke(["train", "--help"]).output)
    defaults = TrainConfig()
    assert defaults.lr == 1e-4 and defaults.max_length == 2048
    assert (
        "--lr <float> Peak learning rate, after warm-up (1e-4: suits long runs on large data"
        in text
    )
    assert "Truncate samples to this many tokens. [default: 2048]" in text
    assert "neither = one epoch" in text and "(neither --steps nor --epochs = one epoch)" in text
    assert (
        "The device is chosen automatically: the GPU when torch sees one (under torchrun, each rank's "
        "LOCAL_RANK GPU), else the CPU."
    ) in text
    assert (
        defaults.keep_checkpoints == 2
        and "the newest 2 are kept (--config key keep_checkpoints)" in text
    )


def test_resume_compares_the_values_the_defaults_resolved_to(store, tmp_path):
    """A run started without --draft-vocab-size / --aux-layers stores the values it used (the
    target's 128 rows, the store's layers 1,2,3): re-passing them resumes, another value is
    refused naming the effective one (it said "None -> 96")."""
    run = tmp_path / "run"
    first = invoke(["train", str(store), str(run), "--batch-size", "4", "--steps", "2"])
    assert first.exit_code == 0, first.output
    config = trained_config(run)
    assert (config["draft_vocab_size"], config["aux_layers"]) == (128, [1, 2, 3])
    same = ["--draft-vocab-size", "128", "--aux-layers", "1,2,3", "--steps", "3"]
    again = invoke(["train", str(store), str(run), "--resume", *same])
    assert again.exit_code == 0, again.output
    other = invoke(["train", str(store), str(run), "--resume", "--draft-vocab-size", "96"])
    assert other.exit_code == 1
    assert "other settings (--draft-vocab-size 128 -> 96)" in flat(other.output)


def test_an_old_checkpoint_holding_unresolved_defaults_resumes(store, tmp_path):
    """Checkpoints of an older specdraft hold None for both: resolved as this run resolves them
    (said in one line), then compared."""
    run = tmp_path / "run"
    assert (
        invoke(["train", str(store), str(run), "--batch-size", "4", "--steps", "2"]).exit_code == 0
    )
    path = checkpoint_paths(run)[-1]
    state = torch.load(path, map_location="cpu", weights_only=False)
    state["config"].update(draft_vocab_size=None, aux_layers=None)
    torch.save(state, path)
    given = ["--draft-vocab-size", "128", "--aux-layers", "1,2,3", "--steps", "3"]
    resumed = invoke(["train", str(store), str(run), "--resume", *given])
    assert resumed.exit_code == 0, resumed.output
    assert (
        f"{path} records the default of --draft-vocab-size, --aux-layers unresolved (an older "
        "specdraft): taken as --draft-vocab-size 128, --aux-layers 1,2,3, the default on this data"
    ) in flat(resumed.output)
    assert trained_config(run)["draft_vocab_size"] == 128
    newest = checkpoint_paths(run)[-1]
    state = torch.load(newest, map_location="cpu", weights_only=False)
    state["config"].update(draft_vocab_size=None)
    torch.save(state, newest)
    other = invoke(["train", str(store), str(run), "--resume", "--draft-vocab-size", "96"])
    assert other.exit_code == 1 and "(--draft-vocab-size 128 -> 96)" in flat(other.output)
