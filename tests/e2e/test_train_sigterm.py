"""SIGTERM (what a scheduler or `kill` sends first) to a single-process `specdraft train`: it
checkpoints the current step as Ctrl-C does, and --resume goes on from it."""

from __future__ import annotations

import signal
import subprocess
import sys

from specdraft.checkpoint import checkpoint_paths
from tests.support.train_world import (
    ONE_THREAD_ENV,
    REPO,
    assert_resumes_to_the_end,
    long_run_config,
    train_module_args,
    wait_for_steps,
)

STEPS = 30


def test_sigterm_to_one_process_checkpoints_the_current_step_and_resume_finishes(store, tmp_path):
    """SIGTERM after a few steps: the run writes step-N.pt of the step it was on (no --save-every
    step), prints the resume hint and exits 130 as for Ctrl-C; --resume runs to the last step."""
    cfg = long_run_config(tmp_path, STEPS)
    run, out = tmp_path / "run", tmp_path / "out.txt"
    command = [sys.executable, *train_module_args(store, run, cfg)]
    env = {**ONE_THREAD_ENV, "PYTHONPATH": str(REPO)}
    with out.open("w") as log:
        proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for_steps(run, proc, 3, timeout=60)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    output = out.read_text()
    assert proc.returncode == 130, output[-3000:]
    saved = checkpoint_paths(run)
    assert len(saved) == 1, output[-3000:]
    step = int(saved[0].name.removeprefix("step-").removesuffix(".pt"))
    assert 3 <= step < STEPS and saved[0].is_file(), saved
    assert f"interrupted; newest checkpoint: {saved[0]}" in output, output[-3000:]
    assert not (run / "draft").exists()

    assert_resumes_to_the_end(command, env, run, saved[0], STEPS)
