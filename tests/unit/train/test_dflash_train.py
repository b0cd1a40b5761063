"""`specdraft train --method dflash` (specdraft/train/dflash_train.py) on the tiny seeded target's
capture store that the EAGLE-3 training tests use (conftest's `store`): the loss falls, an interrupted run resumes to the same weights bit for bit, the
method is recorded and a resume may not change it."""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from specdraft.checkpoint import checkpoint_paths
from specdraft.cli import app
from specdraft.data.render import Sample
from specdraft.errors import SettingsMismatch
from specdraft.targets import load_target
from specdraft.train.config import TrainConfig
from specdraft.train.errors import BadTrainSetting
from specdraft.train.loop import train
from specdraft.train.run_dir import checkpoint_config
from specdraft.train.sources import OnlineData
from specdraft.train.store_data import StoreData
from tests.support.engine_helpers import one_thread  # noqa: F401 (autouse: one torch thread)

REPO = Path(__file__).resolve().parents[3]
VOCAB = 128
AUX = (1, 2, 3)
DRAFT = {"mask_token_id": VOCAB - 1, "num_hidden_layers": 1}


def config(**kw) -> TrainConfig:
    dflash = dict(method="dflash", block_size=4, num_anchors=6, draft_overrides=DRAFT)
    schedule = dict(lr=3e-3, warmup_steps=2, total_steps=20, batch_size=8)
    return TrainConfig(**{**dflash, **schedule, "val_fraction": 0.0, "save_every": 5, **kw})


def train_losses(run: Path) -> list[float]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [r["loss"] for r in map(json.loads, lines) if r["split"] == "train"]


def test_the_cli_trains_a_dflash_drafter_whose_loss_falls(store, tmp_path):
    overrides = {**DRAFT, "num_hidden_layers": 2}
    (tmp_path / "cfg.json").write_text(
        json.dumps({"draft_overrides": overrides, "num_anchors": 12})
    )
    args = ["train", str(store), str(tmp_path / "run"), "--method", "dflash", "--block-size", "4"]
    args += ["--steps", "40", "--batch-size", "8", "--lr", "3e-3", "--warmup-steps", "2"]
    result = CliRunner().invoke(app, [*args, "--config", str(tmp_path / "cfg.json")])
    assert result.exit_code == 0, result.output
    losses = train_losses(tmp_path / "run")
    last = sum(losses[-5:]) / 5  # below uniform guessing, ln 128 = 4.85, and well below the start
    assert len(losses) == 40 and last < 0.8 * losses[0] and last < math.log(VOCAB) - 0.5, losses
    draft = tmp_path / "run" / "draft"
    written = json.loads((draft / "config.json").read_text())
    assert written["architectures"] == ["DFlashDraftModel"]
    assert written["dflash_config"] == {
        "block_size": 4,
        "mask_token_id": VOCAB - 1,
        "target_layer_ids": [0, 1, 2],
    }
    assert "fc.weight" in load_file(str(draft / "model.safetensors"))
    manifest = json.loads((draft / "specdraft_manifest.json").read_text())
    assert manifest["extra"] == {"method": "dflash"} and manifest["aux_layers"] == list(AUX)
    record = manifest["training"]["train"]  # the blocks' acceptance, as doctor replays it
    assert record["blocks"] > 0 and len(record["block_acceptance"]) == 3
    assert record["block_tau"] == pytest.approx(1 + sum(record["block_acceptance"]))
    assert record["replayed_rounds"] == 0  # an engine's rounds are walked at validation only
    validation = manifest["training"]["validation"]
    assert validation["replayed_rounds"] > 0 and validation["blocks"] > 0
    # both printed, each saying what it counts
    assert "anchors sampled uniformly from the validation text" in result.output
    assert "chain engine's rounds at T = 0 walked over the validation text" in result.output
    export = ["export", str(draft), str(tmp_path / "out"), "--engine", "sglang"]
    exported = CliRunner().invoke(app, export)  # the trained drafter goes on to an engine
    assert exported.exit_code == 0, exported.output
    assert "--speculative-algorithm DFLASH" in exported.output
    assert "--speculative-num-draft-tokens 4" in exported.output
    launch = "python -m sglang.launch_server --model-path T --speculative-algorithm DFLASH"
    doctor = ["doctor", str(tmp_path / "out"), "--target", str(store.parent / "target")]
    checked = CliRunner().invoke(app, [*doctor, "--engine-args", launch, "--json"])
    assert checked.exit_code == 0, checked.output  # the trained export passes its target
    verdicts = {f["check"]: f["verdict"] for f in json.loads(checked.output)["findings"]}
    assert verdicts["target_matches_training"] == verdicts["block_size_matches_engine"] == "pass"
    assert verdicts["target_layers_as_engines_read"] == "pass"


def test_an_interrupted_run_resumes_to_the_same_weights(store, tmp_path):
    """SIGTERM during step 7 (no --save-every step) checkpoints step 7 and stops, as for EAGLE-3;
    the resumed run ends with the uninterrupted run's weights and losses, bit for bit."""
    straight = train(config(), store, tmp_path / "straight", progress=False)

    def stop(step: int) -> None:
        if step == 7:
            signal.raise_signal(signal.SIGTERM)

    run = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        train(config(), store, run, progress=False, on_step=stop)
    assert [p.name for p in checkpoint_paths(run)] == ["step-00000005.pt", "step-00000007.pt"]
    assert checkpoint_config(checkpoint_paths(run)[-1])["method"] == "dflash"
    with pytest.raises(SettingsMismatch, match="--method 'dflash' -> 'eagle3'"):
        train(config(method="eagle3"), store, run, resume=True, progress=False)
    refused = CliRunner().invoke(
        app, ["train", str(store), str(run), "--resume", "--method", "eagle3"]
    )
    assert refused.exit_code == 1 and "Traceback" not in refused.output, refused.output
    assert "--method 'dflash' -> 'eagle3'" in refused.output
    resumed = train(config(), store, run, resume=True, progress=False)
    a = load_file(str(straight.draft_dir / "model.safetensors"))
    b = load_file(str(resumed.draft_dir / "model.safetensors"))
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key
    assert train_losses(run) == train_losses(tmp_path / "straight")
    again = train(config(), store, run, resume=True, progress=False)  # rewrites its drafter
    assert load_file(str(again.draft_dir / "model.safetensors")).keys() == a.keys()


def test_a_target_without_a_spare_embedding_row_needs_a_mask_token(store, tmp_path):
    with pytest.raises(BadTrainSetting, match='draft_overrides {"mask_token_id": ID}'):
        train(config(draft_overrides={}), store, tmp_path / "run", progress=False)


def test_online_training_computes_what_the_store_does(store, tmp_path):
    target = load_target(store.parent / "target")
    rows = StoreData(store).store
    samples = [
        Sample(rows[i]["input_ids"].tolist(), rows[i]["loss_mask"].tolist())
        for i in range(len(rows))
    ]
    offline = train(config(total_steps=3), store, tmp_path / "off", progress=False)
    data = OnlineData(target, samples, AUX)
    online = train(config(total_steps=3), data, tmp_path / "on", progress=False)
    assert online.train_loss == pytest.approx(offline.train_loss, rel=1e-5)


@pytest.mark.skipif(shutil.which("torchrun") is None, reason="torchrun not on PATH")
def test_two_ranks_with_micro_batches_match_one_process(store, tmp_path):
    """torchrun --nproc-per-node 2 (gloo, FSDP2, 2 micro-batches per rank) draws the same anchors
    and gives the same losses and weights as one process (to rounding)."""
    cfg = config(total_steps=4, grad_accum_steps=2)
    (tmp_path / "cfg.json").write_text(json.dumps(cfg.to_dict()))
    two = tmp_path / "two"
    args = [
        "-m",
        "specdraft.cli",
        "train",
        str(store),
        str(two),
        "--config",
        str(tmp_path / "cfg.json"),
    ]
    proc = subprocess.run(
        ["torchrun", "--standalone", "--nproc-per-node", "2", *args],
        cwd=REPO,
        env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    one = train(config(total_steps=4), store, tmp_path / "one", progress=False)
    assert train_losses(two) == pytest.approx(train_losses(tmp_path / "one"), rel=1e-4)
    w1 = load_file(str(one.draft_dir / "model.safetensors"))
    w2 = load_file(str(two / "draft" / "model.safetensors"))
    for key in w1:
        torch.testing.assert_close(w1[key], w2[key], rtol=1e-3, atol=1e-4)
