"""Ctrl-C (SIGINT) and SIGTERM in one training process take effect at a step boundary only:
the step in progress, its metrics line and any checkpoint being written finish whole, then the
step is checkpointed and KeyboardInterrupt raised; a second signal aborts at once, unsaved."""

from __future__ import annotations

import signal

import pytest
import torch
from safetensors.torch import load_file

import specdraft.train.run_dir as run_dir
from specdraft.checkpoint import checkpoint_paths
from specdraft.train import dist
from specdraft.train.loop import train
from specdraft.train.trainer import Trainer
from tests.support.train_world import read_metrics, small_config, world  # noqa: F401 (fixture)

STEPS = 20


def signal_inside(monkeypatch, owner, name: str, at_step: int, signums: tuple[int, ...]) -> None:
    """Replace owner.name by a wrapper that raises `signums` in this process while the original
    runs at `at_step` (the trainer's step before the call), then calls it."""
    original = getattr(owner, name)
    state = {"step": 0}

    def wrapper(*args, **kwargs):
        if state["step"] == at_step:
            for signum in signums:
                signal.raise_signal(signum)
        return original(*args, **kwargs)

    def tracked_step(self, sample_ids):
        state["step"] = self.step
        return train_step(self, sample_ids)

    train_step = Trainer.train_step
    monkeypatch.setattr(Trainer, "train_step", tracked_step)
    monkeypatch.setattr(owner, name, wrapper)


def train_steps(run) -> list[int]:
    return [r["step"] for r in read_metrics(run) if r["split"] == "train"]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_inside_a_step_lets_it_finish_then_checkpoints_it(
    world, tmp_path, monkeypatch, signum
):  # noqa: F811
    """The signal arrives inside step 4's backward pass (a torch call): the step ends, its
    metrics line is written, step-4.pt is saved (no --save-every step), KeyboardInterrupt."""
    _, _, store = world
    cfg = small_config(total_steps=STEPS, save_every=1000, val_fraction=0.0)
    signal_inside(monkeypatch, Trainer, "accumulate", at_step=3, signums=(signum,))
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt):
        train(cfg, store, tmp_path / "run", progress=False)
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before
    assert [p.name for p in checkpoint_paths(tmp_path / "run")] == ["step-00000004.pt"]
    assert train_steps(tmp_path / "run") == [1, 2, 3, 4]


def test_a_signal_during_a_checkpoint_write_stops_after_it_and_resume_is_exact(
    world, tmp_path, monkeypatch
):  # noqa: F811
    """SIGTERM while step 10's --save-every checkpoint is being written: the write finishes (a
    loadable step-10.pt, no second one), training stops there, every step's metrics line is
    written once, and --resume ends with the weights of a run never interrupted."""
    _, _, store = world
    cfg = small_config(total_steps=STEPS, save_every=10, eval_every=5)
    straight = train(cfg, store, tmp_path / "straight", progress=False)

    run = tmp_path / "run"
    signal_inside(monkeypatch, run_dir, "write_checkpoint", at_step=9, signums=(signal.SIGTERM,))
    with pytest.raises(KeyboardInterrupt):
        train(cfg, store, run, progress=False)
    saved = checkpoint_paths(run)
    assert [p.name for p in saved] == ["step-00000010.pt"]
    assert torch.load(saved[0], map_location="cpu", weights_only=False)["step"] == 10
    assert train_steps(run) == list(range(1, 11))
    assert not (run / "draft").exists()

    monkeypatch.undo()
    resumed = train(cfg, store, run, resume=True, progress=False)
    assert train_steps(run) == list(range(1, STEPS + 1))
    a = load_file(str(straight.draft_dir / "model.safetensors"))
    b = load_file(str(resumed.draft_dir / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_second_signal_aborts_at_once_unsaved(world, tmp_path, monkeypatch):  # noqa: F811
    """Two SIGINTs inside step 4: the second raises KeyboardInterrupt where the process is;
    step 4 is neither logged nor saved, and the handlers from before are back."""
    _, _, store = world
    cfg = small_config(total_steps=STEPS, save_every=1000, val_fraction=0.0)
    signal_inside(
        monkeypatch, Trainer, "accumulate", at_step=3, signums=(signal.SIGINT, signal.SIGINT)
    )
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt):
        train(cfg, store, tmp_path / "run", progress=False)
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before
    assert checkpoint_paths(tmp_path / "run") == []
    assert train_steps(tmp_path / "run") == [1, 2, 3]


def test_on_one_process_a_first_signal_is_only_noted():
    """interrupt_flag on one process: SIGTERM then SIGINT raise nothing on the first; the flag
    reads true; the second aborts with KeyboardInterrupt; the handlers from before are back."""
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    ranks = dist.Ranks(rank=0, world=1, device=torch.device("cpu"), owns_group=False)
    with pytest.raises(KeyboardInterrupt):
        with dist.interrupt_flag(ranks) as interrupted:
            assert not interrupted()
            signal.raise_signal(signal.SIGTERM)
            assert interrupted()
            signal.raise_signal(signal.SIGINT)
            pytest.fail("the second signal did not abort")
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


def test_a_signal_the_process_was_started_ignoring_stays_ignored(monkeypatch):
    """A run started as a shell's background job (SIGINT ignored): SIGINT neither stops it nor is
    noted; SIGTERM still is."""
    monkeypatch.setattr(
        signal, "getsignal", lambda s: signal.SIG_IGN if s == signal.SIGINT else signal.SIG_DFL
    )
    installed = []
    monkeypatch.setattr(signal, "signal", lambda s, h: installed.append(s))
    ranks = dist.Ranks(rank=0, world=1, device=torch.device("cpu"), owns_group=False)
    with dist.interrupt_flag(ranks):
        pass
    assert signal.SIGINT not in installed and signal.SIGTERM in installed
