"""The trainer's tiny world: a seeded tiny Llama target whose lm_head is scaled up (peaked
next-token distributions, so that its argmax is a function of the context a drafter can learn),
synthetic samples (random prompt tokens, then a supervised answer repeating a short random
pattern) and their fp32 capture store on layers AUX; a small TrainConfig, the run's metrics, and
the helpers of the interrupt tests."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import torch

from specdraft.capture.store import StoreSettings
from specdraft.capture.write import write_store
from specdraft.data.render import Sample
from specdraft.targets import load_target
from specdraft.train.config import TrainConfig
from specdraft.train.store_data import StoreData
from specdraft.train.trainer import Trainer
from tests.support.paths import REPO
from tests.support.threads import one_thread  # noqa: F401 (a fixture, imported from here)
from tests.support.tiny_models import tiny_config

VOCAB = 128


AUX = (1, 2, 3)


def make_samples(n: int, seed: int = 0) -> list[Sample]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        prompt = torch.randint(
            1, VOCAB, (int(torch.randint(3, 6, (1,), generator=g)),), generator=g
        )
        pattern = torch.randint(1, 40, (int(torch.randint(2, 5, (1,), generator=g)),), generator=g)
        answer = pattern.repeat(10)[: int(torch.randint(16, 28, (1,), generator=g))]
        out.append(Sample(prompt.tolist() + answer.tolist(), [0] * len(prompt) + [1] * len(answer)))
    return out


def make_target(path: Path):
    target = load_target(
        tiny_config("llama", num_layers=4, hidden_size=32, vocab_size=VOCAB), seed=0
    )
    with torch.no_grad():
        target.lm_head.weight.mul_(8.0)  # peaked distributions (max prob ~0.06 -> well above 1/V)
    target.model.save_pretrained(path)
    return target


# subprocesses get one thread too (the same thread count: the same float reductions)
ONE_THREAD_ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def make_world(root: Path):
    """(target, samples, store path): the tiny target saved under root/target, 200 samples, and
    their fp32 capture store root/store on layers AUX."""
    target = make_target(root / "target")
    samples = make_samples(200)
    return target, samples, write_fp32_store(target, samples, root, AUX, shard_tokens=2048)


def write_fp32_store(target, samples, root: Path, layers, shard_tokens: int) -> Path:
    """root/store: the fp32 capture store of `samples` on `layers` of `target`, saved as
    root/target (the store's index names it)."""
    settings = StoreSettings(layers, dtype=torch.float32, shard_tokens=shard_tokens)
    extra = {"target_path": str(root / "target")}
    write_store(target, samples, root / "store", settings, extra=extra)
    return root / "store"


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """(target, samples, store path) shared by the tests of this module."""
    return make_world(tmp_path_factory.mktemp("train"))


def small_config(**kw) -> TrainConfig:
    schedule = dict(lr=3e-3, warmup_steps=10, total_steps=40, batch_size=8)
    evaluation = dict(val_fraction=0.1, eval_every=20, save_every=10)
    drafter = dict(ttt_steps=3, draft_vocab_size=96)
    return TrainConfig(**{**schedule, **drafter, **evaluation, **kw})


def read_metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


needs_torchrun = pytest.mark.skipif(shutil.which("torchrun") is None, reason="torchrun not on PATH")


def loaded_state(cfg: TrainConfig, store: Path, checkpoint: Path, ranks=None) -> dict:
    """A fresh Trainer on `ranks` (default: one process) after loading `checkpoint`: its step and
    full (gathered) model and optimizer state."""
    trainer = Trainer(cfg, StoreData(store), ranks)
    if checkpoint.is_dir():
        trainer.load_sharded_state(checkpoint)
    else:
        trainer.load_state(
            torch.load(checkpoint, map_location="cpu", weights_only=False), checkpoint
        )
    state = trainer.state()
    return {"step": trainer.step, "model": state["model"], "optimizer": state["optimizer"]}


def wait_for_steps(run, proc: subprocess.Popen, steps: int, timeout: float) -> None:
    """Poll rank 0's metrics.jsonl until it records `steps` training steps."""
    end = time.monotonic() + timeout
    while time.monotonic() < end and proc.poll() is None:
        log = run / "metrics.jsonl"
        lines = log.read_text().splitlines() if log.exists() else []
        if sum('"split": "train"' in line for line in lines) >= steps:
            return
        time.sleep(0.05)
    raise AssertionError(
        f"no {steps} steps in {run} after {timeout} s (torchrun exit code {proc.poll()})"
    )


def assert_resumes_to_the_end(command: list[str], env: dict, run, checkpoint, steps: int) -> None:
    """`command --resume` continues from `checkpoint` to step `steps`, each step logged once, and
    writes the final drafter."""
    resumed = subprocess.run(
        [*command, "--resume"], cwd=REPO, env=env, capture_output=True, text=True, timeout=110
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resuming from {checkpoint}" in resumed.stdout
    assert [r["step"] for r in read_metrics(run)] == list(
        range(1, steps + 1)
    )  # one run's log, each step once
    manifest = json.loads((run / "draft" / "specdraft_manifest.json").read_text())
    assert manifest["training"]["steps"] == steps


def long_run_config(tmp_path: Path, steps: int) -> Path:
    """tmp_path/cfg.json: `small_config` for `steps` steps, without validation and without a
    --save-every checkpoint before the end (a checkpoint found mid-run is the interrupt's)."""
    cfg = tmp_path / "cfg.json"
    cfg.write_text(
        json.dumps(small_config(total_steps=steps, save_every=1000, val_fraction=0.0).to_dict())
    )
    return cfg


def train_module_args(store: Path, run: Path, cfg: Path) -> list[str]:
    """`-m specdraft.cli train STORE RUN --config CFG`, after python's or torchrun's own options."""
    return ["-m", "specdraft.cli", "train", str(store), str(run), "--config", str(cfg)]
