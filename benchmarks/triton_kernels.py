"""specdraft's Triton decode kernels against cuBLAS / SDPA, on Llama-3.1-8B shapes, inside CUDA graphs.

Each timing replays a CUDA graph of 16 back-to-back calls (as a decode step runs them) and
divides by 16. The 16 calls cycle over enough weight copies (>= 200 MB) that none is read from
L2. Prints one JSON line per projection (microseconds and TB/s of weight bytes) and per
attention shape (microseconds):
- `linear` (GEMV for 1 row, thin tensor-core GEMM for 16) vs `F.linear` (cuBLAS);
- `attention` (split-KV, bool mask) vs `F.scaled_dot_product_attention` with the additive mask
  the torch path passes, on a 1k-token cache (1280 slots) for 1 and 16 query tokens.

    python benchmarks/triton_kernels.py      # CUDA GPU with Triton

Measured on one H200 (torch 2.11, Triton 3.6, 2026-11-30), us for 1 row / 16 rows:
  qkv_proj 4096->6144    cuBLAS 16.5 / 16.0   Triton 12.3 / 16.2
  o_proj   4096->4096    cuBLAS 13.4 / 13.7   Triton  8.5 / 10.9
  gate|up  4096->28672   cuBLAS 55.8 / 57.0   Triton 51.6 / 68.8
  down     14336->4096   cuBLAS 31.5 / 32.4   Triton 28.6 / 29.8
  lm_head  4096->128256  cuBLAS 243 / 247     Triton  226 / 249
(1 row: 4.0-4.65 TB/s.) Attention varied more between runs: 1 token SDPA 8.8-17.1 us, Triton
6.6-17.7; 16 tokens SDPA 31.9-37.0, Triton 10.0-19.0 (in a decode step: 7 us a layer, split +
combine, against cuDNN's 8.4). Relative errors against float32: 1.7e-3 (bf16 rounding).
"""

from __future__ import annotations

import json

import torch
import torch.nn.functional as F

from engine_speed import graphed  # benchmarks/, the script's directory

from specdraft.engine.fast_model import causal_mask
from specdraft.engine.kernels.triton_ops import attention, linear

PROJECTIONS = {"qkv_proj": (6144, 4096), "o_proj": (4096, 4096), "gate_up_proj": (28672, 4096),
               "down_proj": (4096, 14336), "lm_head": (128256, 4096)}
CALLS = 16


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


def bench_projection(n: int, k: int) -> dict:
    """cuBLAS and Triton time per call for x [M, k] @ W[n, k].T, M = 1 and 16."""
    copies = max(2, int(200e6 // (n * k * 2)) + 1)
    weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
    calls = [weights[i % copies] for i in range(CALLS)]
    gigabytes = n * k * 2 / 1e9
    row = {}
    for m in (1, 16):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        ref = F.linear(x.float(), weights[0].float())
        err = ((linear(x, weights[0]).float() - ref).norm() / ref.norm()).item()
        for name, fn in (("cublas", F.linear), ("triton", linear)):
            us = graph_us(lambda: [fn(x, w) for w in calls], calls=CALLS)
            row[f"{name}_m{m}"] = {"us": round(us, 2), "tb_s": round(gigabytes / us * 1e3, 2)}
        row[f"triton_m{m}_rel_err"] = err
    return row


def bench_attention(t: int, slots: int = 1280, prefix: int = 1024) -> dict:
    """Triton split-KV attention vs SDPA (additive mask, GQA), Llama-3.1-8B heads, in us."""
    q = torch.randn(t, 32, 128, device="cuda", dtype=torch.bfloat16)
    k_cache = torch.randn(1, 8, slots, 128, device="cuda", dtype=torch.bfloat16)
    v_cache = torch.randn_like(k_cache)
    mask = causal_mask(prefix, t, slots, device="cuda").contiguous()
    new_slots = torch.arange(prefix, prefix + t, device="cuda")
    bias = torch.zeros_like(mask, dtype=q.dtype).masked_fill_(~mask, float("-inf"))
    q_heads = q.view(1, t, 32, 128).transpose(1, 2)
    ref = F.scaled_dot_product_attention(q_heads.float(), k_cache.float(), v_cache.float(), attn_mask=mask,
                                         enable_gqa=True).transpose(1, 2)[0]
    err = ((attention(q, k_cache, v_cache, mask, new_slots).float() - ref).norm() / ref.norm()).item()
    return {"sdpa_us": round(graph_us(lambda: F.scaled_dot_product_attention(
                q_heads, k_cache, v_cache, attn_mask=bias, enable_gqa=True)), 2),
            "triton_us": round(graph_us(lambda: attention(q, k_cache, v_cache, mask, new_slots)), 2),
            "triton_rel_err": err}


def main() -> None:
    torch.manual_seed(0)
    print(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__}), flush=True)
    for name, (n, k) in PROJECTIONS.items():
        print(json.dumps({name: bench_projection(n, k)}), flush=True)
    for t in (1, 16):
        print(json.dumps({f"attention_{t}_tokens": bench_attention(t)}), flush=True)


if __name__ == "__main__":
    main()
