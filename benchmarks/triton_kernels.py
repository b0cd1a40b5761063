"""specdraft's Triton decode kernels against cuBLAS / SDPA, on Llama-3.1-8B shapes, inside CUDA graphs.

Each timing replays a CUDA graph of 16 back-to-back calls (as a decode step runs them) and
divides by 16. The 16 calls cycle over enough weight copies (>= 200 MB) that none is read from
L2. Prints one JSON line per projection (microseconds and TB/s of weight bytes) and per
attention shape (microseconds), each with the Triton kernel's relative error against float32:
- `linear` (GEMV for 1 row, thin tensor-core GEMM for 16) vs `F.linear` (cuBLAS);
- `attention` (split-KV, bool mask) vs `F.scaled_dot_product_attention` with the additive mask
  the torch path passes, on a 1k-token cache (1280 slots) for 1 and 16 query tokens.

    python benchmarks/triton_kernels.py          # CUDA GPU with Triton
    python benchmarks/triton_kernels.py --tiny   # smoke test: tiny shapes, float32, on the CPU
                                                 # in Triton's interpreter (TRITON_INTERPRET=1)

In --tiny mode on the CPU the timings are wall-clock times of the interpreter (meaningless);
the relative errors still check the kernels. Measurements so far: benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

if (
    "--tiny" in sys.argv[1:] and not torch.cuda.is_available()
):  # before anything imports Triton's kernels
    os.environ["TRITON_INTERPRET"] = "1"

from engine_speed import graphed  # benchmarks/, the script's directory

from specdraft.engine.fast_model import causal_mask
from specdraft.engine.kernels.attention_ops import attention
from specdraft.engine.kernels.linear_ops import linear

PROJECTIONS = {
    "qkv_proj": (6144, 4096),
    "o_proj": (4096, 4096),
    "gate_up_proj": (28672, 4096),
    "down_proj": (4096, 14336),
    "lm_head": (128256, 4096),
}
TINY_PROJECTIONS = {"qkv_proj": (96, 64), "o_proj": (64, 64), "down_proj": (64, 128)}
CALLS = 16


@dataclass(frozen=True)
class Setup:
    """Where and how the kernels run: CUDA graphs in bf16, or the CPU interpreter in float32."""

    device: str
    dtype: torch.dtype
    projections: dict[str, tuple[int, int]]
    heads: tuple[int, int, int]  # query heads, kv heads, head_dim
    slots: int  # cache slots; the prefix is slots - 256 (1024 of 1280 on CUDA)
    min_weight_bytes: float  # weight copies cycled so that none stays in L2
    calls: int
    iters: int


CUDA_SETUP = Setup("cuda", torch.bfloat16, PROJECTIONS, (32, 8, 128), 1280, 200e6, CALLS, 20)
TINY_SETUP = Setup("cpu", torch.float32, TINY_PROJECTIONS, (4, 2, 16), 320, 0, 2, 2)


def time_us(setup: Setup, fn, calls: int = 1) -> float:
    """Median microseconds per call of fn (which makes `calls` calls): replayed as a CUDA graph
    on CUDA, wall-clock on the CPU."""
    if setup.device == "cuda":
        return graph_us(fn, calls, setup.iters)
    times = []
    for _ in range(setup.iters):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e6 / calls)
    return statistics.median(times)


def graph_us(fn, calls: int = 1, iters: int = 20) -> float:
    """Median microseconds per call of fn (which makes `calls` calls), replayed as a CUDA graph."""
    replay = graphed(fn)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(iters):
        start.record()
        replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / calls)
    return sorted(times)[len(times) // 2]


def bench_projection(setup: Setup, n: int, k: int) -> dict:
    """cuBLAS and Triton time per call for x [M, k] @ W[n, k].T, M = 1 and 16."""
    device, dtype, size = setup.device, setup.dtype, setup.dtype.itemsize
    copies = max(2, int(setup.min_weight_bytes // (n * k * size)) + 1)
    weights = [torch.randn(n, k, device=device, dtype=dtype) * 0.02 for _ in range(copies)]
    calls = [weights[i % copies] for i in range(setup.calls)]
    gigabytes = n * k * size / 1e9
    row = {}
    for m in (1, 16):
        x = torch.randn(m, k, device=device, dtype=dtype)
        ref = F.linear(x.float(), weights[0].float())
        err = ((linear(x, weights[0]).float() - ref).norm() / ref.norm()).item()
        for name, fn in (("cublas", F.linear), ("triton", linear)):
            us = time_us(setup, lambda fn=fn, x=x: [fn(x, w) for w in calls], calls=setup.calls)
            row[f"{name}_m{m}"] = {"us": round(us, 2), "tb_s": round(gigabytes / us * 1e3, 2)}
        row[f"triton_m{m}_rel_err"] = err
    return row


def bench_attention(setup: Setup, t: int) -> dict:
    """Triton split-KV attention vs SDPA (additive mask, GQA), Llama-3.1-8B heads on CUDA, in us."""
    (num_heads, num_kv_heads, head_dim), slots = setup.heads, setup.slots
    device, dtype, prefix = setup.device, setup.dtype, setup.slots - 256
    q = torch.randn(t, num_heads, head_dim, device=device, dtype=dtype)
    k_cache = torch.randn(1, num_kv_heads, slots, head_dim, device=device, dtype=dtype)
    v_cache = torch.randn_like(k_cache)
    mask = causal_mask(prefix, t, slots, device=device).contiguous()
    new_slots = torch.arange(prefix, prefix + t, device=device)
    bias = torch.zeros_like(mask, dtype=q.dtype).masked_fill_(~mask, float("-inf"))
    q_heads = q.view(1, t, num_heads, head_dim).transpose(1, 2)
    ref = F.scaled_dot_product_attention(
        q_heads.float(), k_cache.float(), v_cache.float(), attn_mask=mask, enable_gqa=True
    ).transpose(1, 2)[0]
    err = (
        (attention(q, k_cache, v_cache, mask, new_slots).float() - ref).norm() / ref.norm()
    ).item()
    return {
        "sdpa_us": round(
            time_us(
                setup,
                lambda: F.scaled_dot_product_attention(
                    q_heads, k_cache, v_cache, attn_mask=bias, enable_gqa=True
                ),
            ),
            2,
        ),
        "triton_us": round(
            time_us(setup, lambda: attention(q, k_cache, v_cache, mask, new_slots)), 2
        ),
        "triton_rel_err": err,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--tiny",
        action="store_true",
        help="smoke test: tiny shapes, on the CPU in Triton's interpreter unless CUDA is there",
    )
    args = parser.parse_args()
    setup = CUDA_SETUP
    if args.tiny:  # on the CPU, TRITON_INTERPRET=1 was set before the imports (above)
        on_cuda = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"
        setup = replace(TINY_SETUP, device="cuda", dtype=torch.bfloat16) if on_cuda else TINY_SETUP
    torch.manual_seed(0)
    name = torch.cuda.get_device_name() if setup.device == "cuda" else "cpu (Triton interpreter)"
    print(json.dumps({"device": name, "torch": torch.__version__}), flush=True)
    for name, (n, k) in setup.projections.items():
        print(json.dumps({name: bench_projection(setup, n, k)}), flush=True)
    for t in (1, 16):
        print(json.dumps({f"attention_{t}_tokens": bench_attention(setup, t)}), flush=True)


if __name__ == "__main__":
    main()
