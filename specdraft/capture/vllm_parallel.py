"""Data-parallel capture through vLLM (`specdraft capture --engine vllm --data-parallel-size M`).

One independent vLLM engine per rank, each in a process of its own (multiprocessing, spawn),
each on its own devices, each capturing a disjoint set of shards and writing their files
(atomically, `write.save_shard`); this process starts them, counts their tokens and alone
writes index.json (`write_store`'s on_shard) as each rank reports a shard in place. A store
captured with M ranks is therefore the store captured with one: same shard plan, same files.

Why independent engines and not vLLM's data-parallel environment (VLLM_DP_RANK / VLLM_DP_SIZE /
VLLM_DP_MASTER_PORT, vllm 0.32.0 examples/offline_inference/data_parallel.py): that mode keeps
the ranks in lockstep (a rank without requests runs dummy batches, v1/engine/llm_engine.py),
which only expert parallelism across ranks needs, and vLLM refuses it for dense models
(config/parallel.py: "Offline data parallel mode is not supported/useful for dense models").
A capture needs no communication between ranks: each request's states are complete in its
own engine, where tensor-parallel rank 0 writes them (`capture.vllm_connector`).

Devices: rank r takes devices r*TP .. (r+1)*TP-1 of the visible ones, vLLM's own rule
(v1/engine/utils.py get_physical_gpu_ids_for_local_dp_rank), through the platform's
device-control variable (CUDA_VISIBLE_DEVICES on NVIDIA and ROCm). On vLLM's CPU build, where
a device is a NUMA node, rank r takes the r-th equal slice of this process's CPU cores
(OMP_NUM_THREADS for an in-process engine, VLLM_CPU_OMP_THREADS_BIND, one list per TP worker,
for an engine process).
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from specdraft.capture.store import CaptureError, StoreSettings
from specdraft.capture.vllm import VllmCapture
from specdraft.capture.write import ShardJob, save_shard

POLL_S = 1.0  # how often the parent looks for a rank that died without a word
STOP_S = 60.0  # how long a rank may take to shut its engine down before it is killed


def assign(jobs: list[ShardJob], size: int) -> list[list[ShardJob]]:
    """The jobs of each rank: the j-th missing shard goes to rank j % size (deterministic given
    the store; on a resume the missing shards are spread over all ranks again)."""
    return [jobs[rank::size] for rank in range(size)]


def rank_environments(size: int, tp: int) -> list[dict[str, str]]:
    """The environment variables of each rank's process (module doc, Devices). Raises
    CaptureError when fewer than size * tp devices (CPU build: cores) are visible."""
    from vllm.platforms import current_platform

    need = f"--data-parallel-size {size} x --tensor-parallel-size {tp} needs {size * tp}"
    if current_platform.is_cpu():
        cores = sorted(os.sched_getaffinity(0))
        if len(cores) < size * tp:
            raise CaptureError(
                f"{need} CPU cores for vLLM's CPU build; this process may use {len(cores)}"
            )
        per_rank = len(cores) // size
        envs = []
        for rank in range(size):
            mine = cores[rank * per_rank : (rank + 1) * per_rank]
            workers = [mine[w * (per_rank // tp) : (w + 1) * (per_rank // tp)] for w in range(tp)]
            envs.append(
                {
                    "OMP_NUM_THREADS": str(per_rank),
                    "VLLM_CPU_OMP_THREADS_BIND": "|".join(",".join(map(str, w)) for w in workers),
                }
            )
        return envs
    var = current_platform.device_control_env_var
    visible = _visible_devices(var)
    if len(visible) < size * tp:
        raise CaptureError(
            f"{need} devices; {len(visible)} are visible ({var}={os.environ.get(var, '')!r})"
        )
    return [{var: ",".join(visible[rank * tp : (rank + 1) * tp])} for rank in range(size)]


def _visible_devices(var: str) -> list[str]:
    """The device ids `var` lists, or all the devices torch counts when it is unset."""
    if os.environ.get(var):
        return [d.strip() for d in os.environ[var].split(",") if d.strip()]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]


class DataParallelCapture:
    """`write_store`'s run_shards for M vLLM engines: `DataParallelCapture(engine, envs).run`.

    engine: a `VllmCapture` not started (each rank starts its own copy). envs: one dict of
    environment variables per rank (`rank_environments`; the size is its length).
    """

    def __init__(self, engine: VllmCapture, envs: list[dict[str, str]]):
        self.engine, self.envs = engine, envs

    def run(
        self, jobs: list[ShardJob], out_dir: Path, settings: StoreSettings, on_tokens, on_shard
    ) -> None:
        """Capture `jobs` over the ranks; on_tokens(n) and on_shard(entry) run here, as the ranks
        report. Raises CaptureError naming the first rank that failed, with its one-line reason
        (the other ranks are stopped; the shards already reported stay in the index)."""
        context = multiprocessing.get_context("spawn")
        messages = context.Queue()
        processes: dict[int, multiprocessing.Process] = {}
        left: dict[int, int] = {}  # shards each rank has still to report
        finished = False
        try:
            for rank, mine in enumerate(assign(jobs, len(self.envs))):
                if mine:
                    processes[rank] = context.Process(
                        target=_rank_main,
                        name=f"specdraft-capture-dp{rank}",
                        args=(rank, self.engine, mine, out_dir, settings, messages),
                    )
                    with _environment(self.envs[rank]):
                        processes[rank].start()
                    left[rank] = len(mine)
            while any(left.values()):
                kind, rank, value = _next_message(messages, processes, left)
                if kind == "tokens":
                    on_tokens(value)
                elif kind == "shard":
                    on_shard(value)
                    left[rank] -= 1
                else:
                    raise CaptureError(f"data-parallel rank {rank} of {len(self.envs)}: {value}")
            finished = True
        finally:
            _stop(list(processes.values()), finished)
            messages.close()


def _next_message(messages, processes: dict, left: dict) -> tuple[str, int, object]:
    """The next (kind, rank, value) a rank sent: ("tokens", rank, n), ("shard", rank, index
    entry) or ("error", rank, one line); an error too for a rank that exited with shards left
    and said nothing (killed, e.g. out of memory)."""
    while True:
        try:
            return messages.get(timeout=POLL_S)
        except queue.Empty:
            for rank, process in processes.items():
                if left[rank] and process.exitcode is not None:
                    return (
                        "error",
                        rank,
                        f"its process exited with code {process.exitcode}, {left[rank]} of its "
                        "shards not captured (killed? out of memory?); re-run the same command to resume",
                    )


def _stop(processes: list, finished: bool) -> None:
    """Wait for the ranks to exit (finished: each closes its engine and exits by itself; else
    SIGTERM, on which each closes its engine); kill any still there after STOP_S."""
    for process in processes:
        if not finished and process.exitcode is None:
            process.terminate()
    for process in processes:
        process.join(STOP_S)
        if process.exitcode is None:
            process.kill()
            process.join()


@contextmanager
def _environment(env: dict[str, str]) -> Iterator[None]:
    """os.environ with `env` set, for the start of a spawned process (which inherits it)."""
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _exit(signum: int, _frame) -> None:
    raise SystemExit(128 + signum)


def _rank_main(
    rank: int,
    engine: VllmCapture,
    jobs: list[ShardJob],
    out_dir: Path,
    settings: StoreSettings,
    messages,
) -> None:
    """A rank's process: start its engine, capture and save its shards, report each; any error
    as ("error", rank, one line). The rank leaves the terminal's process group, so Ctrl-C reaches
    the parent alone, which stops the ranks: SIGTERM closes the engine (its engine processes and
    request files) before exiting; once closing, SIGTERM is ignored (the parent kills a rank
    still there after STOP_S)."""
    os.setsid()
    signal.signal(signal.SIGTERM, _exit)
    try:
        try:
            engine.start(out_dir)
            for job in jobs:
                tensors = engine.capture_shard(
                    job.samples, settings, lambda n: messages.put(("tokens", rank, n))
                )
                messages.put(("shard", rank, save_shard(out_dir, job, tensors)))
        finally:
            signal.signal(
                signal.SIGTERM, signal.SIG_IGN
            )  # closing already: a stop must not cut it short
            engine.close()
    except Exception as e:  # noqa: BLE001 - the rank's reason goes to the parent as one line
        reason = " ".join(str(e).split())
        messages.put(
            (
                "error",
                rank,
                reason if isinstance(e, CaptureError) else f"{type(e).__name__}: {reason}",
            )
        )
