"""GPU time of a CUDA graph's replay, shared by the GPU benchmarks (no __main__: a helper)."""

from __future__ import annotations

import statistics

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
