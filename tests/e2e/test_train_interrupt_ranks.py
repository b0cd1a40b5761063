"""Ctrl-C under torchrun: the ranks checkpoint the step they agree on, and --resume goes on from it.

A terminal's Ctrl-C sends SIGINT to torchrun's process group; torchrun (its elastic agent)
passes it on to each worker and SIGKILLs those still alive after its shutdown timeout (30 s).
"""

from __future__ import annotations

import os
import signal
import subprocess

import pytest
import torch

from specdraft.checkpoint import checkpoint_paths
from specdraft.train import dist
from tests.support.train_world import (
    ONE_THREAD_ENV,
    REPO,
    assert_resumes_to_the_end,
    long_run_config,
    needs_torchrun,
    train_module_args,
    wait_for_steps,
)

STEPS = 30


@needs_torchrun
def test_ctrl_c_under_torchrun_checkpoints_the_current_step_and_resume_finishes(store, tmp_path):
    """Ctrl-C (SIGINT to torchrun's process group) after a few steps of a 2-rank run: both
    ranks write a sharded checkpoint of the step they agree on (step 3 or later; no --save-every
    step), say so and exit within seconds; --resume continues from it to the last step (~14 s)."""
    cfg = long_run_config(tmp_path, STEPS)
    run, out = tmp_path / "run", tmp_path / "out.txt"
    command = [
        "torchrun",
        "--standalone",
        "--nproc-per-node",
        "2",
        *train_module_args(store, run, cfg),
    ]
    env = {**ONE_THREAD_ENV, "PYTHONPATH": str(REPO)}
    with out.open("w") as log:
        proc = subprocess.Popen(
            command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )  # its own process group, as a terminal's job
    try:
        wait_for_steps(run, proc, 3, timeout=60)
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=25)  # well within torchrun's 30 s before it SIGKILLs the workers
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    output = out.read_text()
    assert proc.returncode != 0, output[-3000:]
    saved = checkpoint_paths(run)
    assert len(saved) == 1, output[-3000:]
    step = int(saved[0].name.removeprefix("step-"))
    assert 3 <= step < STEPS and saved[0].is_dir() and len(list(saved[0].glob("*.distcp"))) == 2, (
        saved
    )
    assert f"interrupted; newest checkpoint: {saved[0]}" in output, output[-3000:]
    assert not list((run / "checkpoints").glob(".*"))  # no temp directory left
    assert not (run / "draft").exists()

    assert_resumes_to_the_end(command, env, run, saved[0], STEPS)


def test_on_several_ranks_a_first_signal_is_only_noted_and_a_second_aborts_at_once():
    """SIGTERM (as torchrun sends on shutdown) raises nothing; a second signal, here SIGINT,
    raises KeyboardInterrupt where the rank is; the handlers from before are back after."""
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    ranks = dist.Ranks(rank=0, world=2, device=torch.device("cpu"), owns_group=False)
    with pytest.raises(KeyboardInterrupt):
        with dist.interrupt_flag(ranks):
            signal.raise_signal(signal.SIGTERM)
            signal.raise_signal(signal.SIGINT)
            pytest.fail("the second signal did not abort")
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before
