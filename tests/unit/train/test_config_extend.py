"""`specdraft train --resume` with a new run length, and train errors that name the flags users type.

Same tiny seeded target and synthetic store as tests/unit/train/test_loop.py.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from specdraft.checkpoint import checkpoint_paths
from specdraft.train.config import TrainConfig, lr_lambda
from specdraft.train.loop import train
from specdraft.train.settings import FLAG_OF_FIELD
from tests.support.cli import cli_args, cli_options, flat, invoke
from tests.support.train_world import one_thread, read_metrics, small_config  # noqa: F401

ARGS = cli_options(
    batch_size=4, ttt_steps=2, draft_vocab_size=96, save_every=3, warmup_steps=2, lr="0.003"
)


def train_cli(store, run, *extra: str):
    return invoke(["train", str(store), str(run), *ARGS, *extra])


def test_resume_with_more_steps_extends_the_run_from_its_checkpoint(store, tmp_path):
    """6 steps, then --resume --steps 12: steps 7..12 run on top of step 6 (the first 6 records
    are kept as written), the lr follows the schedule recomputed for 12 steps (under the old
    one step 7 would run at lr 0), and the manifest records the new total and the extension."""
    run = tmp_path / "run"
    first = train_cli(store, run, "--steps", "6")
    assert first.exit_code == 0, first.output
    first_records = read_metrics(run)
    assert [p.name for p in checkpoint_paths(run)] == ["step-00000003.pt", "step-00000006.pt"]

    more = train_cli(store, run, "--steps", "12", "--resume")
    assert more.exit_code == 0, more.output
    text = flat(more.output)
    assert f"resuming from {run / 'checkpoints' / 'step-00000006.pt'}" in text
    new_lr = 0.003 * lr_lambda(6, 2, 12, 0.0)
    assert (
        f"note: run length 6 -> 12 steps: the learning-rate schedule (warm-up 2 steps, cosine decay to 0.0 x "
        f"lr 0.003) is recomputed for 12 steps; step 7 runs at lr {new_lr:.3g} (the old schedule: 0)"
    ) in text
    assert "12 steps, last train loss" in text

    records = read_metrics(run)
    train_records = [r for r in records if r["split"] == "train"]
    assert [r["step"] for r in train_records] == list(range(1, 13))
    assert records[: len(first_records)] == first_records  # steps 1..6 not re-run
    assert [p.name for p in checkpoint_paths(run)] == ["step-00000009.pt", "step-00000012.pt"]
    lrs = {r["step"]: r["lr"] for r in train_records}
    assert lrs[6] == pytest.approx(0.003 * lr_lambda(5, 2, 6, 0.0))  # the first run's schedule
    for step in range(7, 13):  # record of step s: the lr it ran at, schedule step s - 1
        assert lrs[step] == pytest.approx(0.003 * lr_lambda(step - 1, 2, 12, 0.0)), step
    assert lrs[7] > 0.001

    manifest = json.loads((run / "draft" / "specdraft_manifest.json").read_text())
    training = manifest["training"]
    assert training["steps"] == 12 and training["config"]["total_steps"] == 12
    assert training["extensions"] == [{"step": 6, "from_total_steps": 6, "to_total_steps": 12}]
    assert training["train"]["step"] == 12


def test_an_extended_run_resumes_bit_identical(store, tmp_path):
    """The extended schedule lives in the checkpoints: resuming the extended run from its step-9
    checkpoint ends with the same weights and losses as the uninterrupted extended run."""
    cfg = small_config(total_steps=6, save_every=3, eval_every=3, val_fraction=0.1)
    train(cfg, store, tmp_path / "a", progress=False)
    longer = TrainConfig.from_dict({**cfg.to_dict(), "total_steps": 12})
    straight = train(longer, store, tmp_path / "a", resume=True, progress=False)
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    (tmp_path / "b" / "checkpoints" / "step-00000012.pt").unlink()
    notes = []
    again = train(longer, store, tmp_path / "b", resume=True, progress=False, on_note=notes.append)
    assert notes == []  # step 9 was written by a 12-step run: nothing to recompute
    a = load_file(str(straight.draft_dir / "model.safetensors"))
    b = load_file(str(again.draft_dir / "model.safetensors"))
    for key in a:
        assert torch.equal(a[key], b[key]), key
    assert read_metrics(tmp_path / "a") == read_metrics(tmp_path / "b")
    manifest = json.loads((again.draft_dir / "specdraft_manifest.json").read_text())
    assert manifest["training"]["extensions"] == [
        {"step": 6, "from_total_steps": 6, "to_total_steps": 12}
    ]


def test_resume_refuses_a_run_length_below_the_checkpoint_and_names_changed_flags(store, tmp_path):
    run = tmp_path / "run"
    assert train_cli(store, run, "--steps", "6").exit_code == 0
    shorter = train_cli(store, run, "--steps", "4", "--resume")
    assert shorter.exit_code == 1
    assert (
        f"error: {run / 'checkpoints' / 'step-00000006.pt'} is at step 6, past this run's 4 steps: pass "
        "--steps 6 or more"
    ) in flat(shorter.output)
    other = invoke(
        ["train", str(store), str(run), *ARGS[:-2], "--lr", "0.001", "--steps", "12", "--resume"]
    )
    assert other.exit_code == 1
    text = flat(other.output)
    assert "this checkpoint was trained with other settings (--lr 0.003 -> 0.001)" in text
    assert "only the run length, --steps / --epochs, may change, as may --grad-accum-steps" in text
    assert "TrainConfig" not in text


@pytest.mark.parametrize(
    "values, message, code",
    [
        ({"batch_size": 0}, "error: --batch-size 0: must be positive", 2),
        ({"eval_every": 0}, "error: --config key eval_every 0: must be positive", 2),
        ({"val_fraction": 1.5}, "error: --config key val_fraction 1.5: must be in [0, 1)", 2),
        ({"warmup_steps": -1}, "error: --warmup-steps -1: must be >= 0", 2),
        (
            {"batch_size": 1000},
            "training samples are fewer than one batch of --batch-size 1000: lower --batch-size",
            1,
        ),
        (
            {"batch_size": 6, "grad_accum_steps": 4},
            "error: --batch-size 6 does not split into 1 rank(s) x "
            "--grad-accum-steps 4 micro-batches: use a multiple of 4 "
            "or --grad-accum-steps 3",
            1,
        ),
        (
            {"precision": "bf16"},
            "error: --precision bf16 autocasts on CUDA only; use --precision fp32 on the CPU",
            1,
        ),
    ],
)
def test_train_errors_name_the_flags_users_type(store, tmp_path, values, message, code):
    """A bad value from --config (flags are range-checked by typer first) is named by its flag,
    or by its --config key when train has no flag for it; never as TrainConfig.<field>. A value
    TrainConfig refuses is a usage error (exit 2); one refused for the data or the machine, 1."""
    config = tmp_path / "cfg.json"
    config.write_text(json.dumps(values))
    result = invoke(cli_args("train", store, tmp_path / "run", config=config, steps=2))
    assert result.exit_code == code, result.output
    assert message in flat(result.output) and "TrainConfig" not in result.output


def test_every_flag_errors_name_is_a_train_option():
    """FLAG_OF_FIELD (what errors call a field) stays in step with `specdraft train`'s options."""
    assert set(FLAG_OF_FIELD) <= set(TrainConfig.__dataclass_fields__)
    options = flat(invoke(["train", "--help"]).output)
    for flag in FLAG_OF_FIELD.values():
        assert f"{flag} " in options, flag
