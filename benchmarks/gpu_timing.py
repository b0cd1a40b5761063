"""GPU time of a CUDA graph's replay (`replay_ms`) and wall time of an eager call (`wall_ms`),
shared by the GPU benchmarks (no __main__: a helper)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch


def replay_ms(graph: torch.cuda.CUDAGraph, iters: int, warmup: int = 0) -> float:
    """Median GPU time of one replay in milliseconds (CUDA events around the replay alone: no
    input staging, no host time before the first kernel starts), after `warmup` untimed replays."""
    for _ in range(warmup):
        graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(iters):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def wall_ms(fn: Callable[[], object], iters: int, warmup: int = 0) -> float:
    """Median wall time of one fn() call in milliseconds, the device synchronised before and after
    each call (on CUDA: launches and kernels alike, as an eager caller waits for them), after
    `warmup` untimed calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        sync()
        start = time.perf_counter()
        fn()
        sync()
        times.append(1e3 * (time.perf_counter() - start))
    return statistics.median(times)


def sync() -> None:
    """Wait for the queued CUDA work (no-op without CUDA)."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()
