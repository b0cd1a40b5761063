"""The processes of a training run: this rank's place (`Ranks`, from torchrun's environment) and
the signals that stop a run cleanly at a step boundary (`interrupt_flag`).

Under torchrun (torch.distributed.elastic, torch 2.13): workers are started in sessions of
their own (SubprocessHandler: start_new_session), so a terminal's Ctrl-C reaches torchrun
only. Its agent catches SIGINT, SIGTERM, SIGHUP and SIGQUIT (TORCHELASTIC_SIGNALS_TO_HANDLE)
and sends that signal to every worker's process group (SubprocessContext._close), so a
worker sees SIGINT for Ctrl-C and SIGTERM when torchrun itself is terminated. Then it waits
--shutdown-timeout seconds (TORCH_ELASTIC_SHUTDOWN_TIMEOUT, default 30) for all workers
together and SIGKILLs those left: the rest of the step, its evaluation and the checkpoint
must fit in that time (a killed write leaves the previous checkpoint). A second Ctrl-C to
torchrun, during that wait, makes it send SIGTERM.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Ranks:
    """This process's place in the run: rank, world size, device."""

    rank: int
    world: int
    device: torch.device
    owns_group: bool
    last_barrier: list[Any] = field(default_factory=list, repr=False)  # see barrier()

    @property
    def main(self) -> bool:
        return self.rank == 0

    def sum(self, t: torch.Tensor) -> torch.Tensor:
        """Sum over ranks (a copy; identity on one process)."""
        t = t.detach().clone()
        if self.world > 1:
            t = t.to(self.device)
            dist.all_reduce(t)
        return t

    def barrier(self) -> None:
        """Wait for every rank (no-op on one process).

        The barrier's Work is kept until the next barrier, so that this thread frees it: a
        gloo barrier holds the collectives before it, and freeing their tensors takes the GIL,
        which a gloo worker thread cannot get once Python is exiting (the process then aborts:
        "terminate called without an active exception", after a 2-rank CPU run's last barrier).
        """
        if self.world > 1:
            work = dist.barrier(async_op=True)
            work.wait()
            self.last_barrier[:] = [work]


def resolve_device(device: str, local_rank: int = 0) -> torch.device:
    """ "auto" -> cuda (this rank's GPU) when available, else cpu; "cuda" -> cuda:local_rank."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    return torch.device("cuda", local_rank) if dev.type == "cuda" and dev.index is None else dev


def setup_dist(device: str) -> Ranks:
    """Rank, world size and device from torchrun's environment; joins the process group."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    dev = resolve_device(device, local)
    owns = world > 1 and not dist.is_initialized()
    if owns:
        if dev.type == "cuda":
            torch.cuda.set_device(dev)
        dist.init_process_group("nccl" if dev.type == "cuda" else "gloo")
    return Ranks(rank, world, dev, owns)


class StopRequest:
    """The first SIGINT or SIGTERM as a flag (`on_signal` only records it); the second puts the
    previous handlers back and re-raises the signal: KeyboardInterrupt (SIGINT) or the default
    exit (SIGTERM), at once."""

    def __init__(self, ranks: Ranks) -> None:
        self.ranks = ranks
        self.caught: list[int] = []
        self.previous: dict[int, Any] = {}

    def install(self) -> None:
        """Handle SIGINT and SIGTERM here, in the main thread only (elsewhere nothing is caught);
        a handler installed outside Python (getsignal None) and a signal the process was started
        ignoring (SIG_IGN: a shell's background job ignores SIGINT) are left alone."""
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in (signal.SIGINT, signal.SIGTERM):
            if signal.getsignal(signum) not in (None, signal.SIG_IGN):
                self.previous[signum] = signal.signal(signum, self.on_signal)

    def restore(self) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)
        self.previous.clear()

    def on_signal(self, signum: int, frame: Any) -> None:
        if self.caught:  # the second: abort as without this handler
            self.restore()
            signal.raise_signal(signum)
            return
        self.caught.append(signum)

    def interrupted(self) -> bool:
        """Whether a stop was requested: on one process the flag; on several ranks, whether any
        rank was signalled (one int all-reduced with MAX on the group's device), a collective."""
        if self.ranks.world == 1:
            return bool(self.caught)
        flag = torch.tensor([int(bool(self.caught))], device=self.ranks.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())


@contextlib.contextmanager
def interrupt_flag(ranks: Ranks):
    """Turn the first SIGINT (Ctrl-C) or SIGTERM (what schedulers and `kill` send first) into a
    request to stop; yields interrupted(), which the training loop calls at each step boundary,
    after the step's metrics and any checkpoint are written. On one process it reads the flag;
    on several ranks it is true on all of them when any rank was signalled (one int all-reduced
    with MAX on the group's device, beside the step's own syncs). The caller then checkpoints
    that step (a collective on several ranks) and raises KeyboardInterrupt. The handler only
    sets the flag, so no torch call, collective, metrics line or checkpoint write is cut short:
    a KeyboardInterrupt raised inside a torch call can surface as another exception. How the
    signals reach the workers of torchrun, and in what time they must stop: the module doc.

    A second SIGINT or SIGTERM puts the previous handlers back and re-raises the signal:
    KeyboardInterrupt (SIGINT) or the default exit (SIGTERM), at once, unsaved (checkpoint
    writes are atomic: the previous checkpoint stays). Handlers live in the main thread only;
    elsewhere nothing is caught (but the ranks still agree). On exit the previous handlers are
    back."""
    stop = StopRequest(ranks)
    stop.install()
    try:
        yield stop.interrupted
    finally:
        stop.restore()
