"""Speed under load on the shell (issue #37 item 6): pycode-25m and its drafter embedded in
Llama-3-8B shapes (shell_target.py), B sequences at a time through the engine's batching path
(`engine.batch.BatchScheduler`), CUDA bf16. One JSON line per measurement ("part" names it),
appended to --out too; each part is guarded: a failure prints {"part": ..., "error": ...} and
the rest runs.

1. forward (ms): for each B in --batch-sizes and T in --tokens, every row at its own cached
   length (row b at --cached + b positions), the target forward as the engine issues it: at
   B = 1 the batch-1 engine's verify (`engine_ms`: its CUDA graph's GPU time through the Triton
   kernels, `shell_target.verify_ms`; eager wall time off CUDA), at every B the batching path's
   `BatchRunner.verify_batch` (`batch_runner_ms`: wall time from the host inputs to the logits,
   device synchronised, as a batched round waits for it: the Triton kernels up to 64 rows
   (B x T), torch ops past them, the layers compiled on CUDA unless --eager; with --graphs replayed as one CUDA graph per (B, T),
   `batch_graphs.GraphedRows`, in parts 2-3 too). Against `reference_ms`: a plain torch
   stack at the same shape (`plain_stack`: the same weights through F.linear and one
   F.scaled_dot_product_attention per layer over the same cache rows, the query heads of a KV
   head stacked so that no K/V is repeated, each row masked to its own length over the widest
   row's slots rounded up to 8; not compiled), captured and replayed as one CUDA graph so that
   launches cost nothing (its GPU time; eager wall time off CUDA). `batch_runner_first_call_ms`:
   the first call at the shape (a compile, or capture, when the shape is new). rows = B * T;
   `engine_over_reference`; `roofline_ms` = (weight bytes + the B rows' K/V bytes) / the
   measured copy bandwidth.
2. plain (tokens/s): batched plain decoding (no drafter) of B prompts at a time
   (`tune_load.LoadBench.run_batch` at K = 0: every sequence's tokens after its first over the
   wall seconds after the batch's prefill), `roofline_pct` = tokens/s over B x bandwidth /
   (weight bytes + B x the K/V bytes of a row at its mean length, prompt + new tokens / 2).
   Prompts: --prompt-tokens consecutive tokens of the drafter's held-out prompts (--prompt-file;
   prompt i starts at text i and runs on through the next texts), so the cache holds ~512
   positions as in part 1.
3. speculative: chains K = 1..--max-k at each B (`tune_load.measure_level`, the runs of tune
   --concurrency; the plain runs are part 2's): tokens/s, tau, speedup over part 2; tune's cost
   model (`tune_load.LoadModel`, fitted over the measured batch sizes) predicted beside each;
   the bound: tau(K) measured x forward(B, 1) / forward(B, K + 1), drafting taken as free, with
   the engine's costs of part 1 (`bound_engine`) and the cheaper of engine and reference at each
   shape (`bound_best`; a T between measured ones interpolated linearly). Per B the best K
   (`best_k`, by measured speedup), tune's choice (`chosen_k`: demo's rule, K = 0 unless a K
   beats plain by --min-speedup), and the measured speedup over each bound. Then the schedule
   (`BatchSchedule` of the chosen K per B, `load_schedule.schedule_rows`) run once at each B by
   the drafter's engine (K = 0: `batch.CatchUp` rounds): speedup over part 2 (goal >= 0.97x).
The last line is {"summary": ...}: the seconds each part took and the goals of issue #37.

    python benchmarks/batch_speed.py --model ../shared/models/pycode-25m --out batch.jsonl
    python benchmarks/batch_speed.py --model M --draft D --batch-sizes 1,8,64 --parts forward
    python benchmarks/batch_speed.py --model M --tiny        # CPU float32, a tiny shell, seconds

--draft defaults to the committed EAGLE-3 drafter (tests/assets/pycode25m_draft/draft). The
default run (7 batch sizes, 64 new tokens, K 1..7, one timing round) aims at under 300 s on one
H200, the compiles of new shapes included (the summary line gives each part's seconds); fewer
--batch-sizes, --new-tokens or --max-k shorten it. Every scheduler has the cache rows of the
largest B (torch.compile treats the cache as a static-shaped buffer: a new row count would
compile every layer shape again), and the benchmark raises torch.compile's recompile limit to
64 rather than let a layer fall back to eager after 8 shapes. Run it with the checkout on
PYTHONPATH. Results: benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from gpu_timing import replay_ms, wall_ms  # benchmarks/, the script's directory
from shell_target import (  # benchmarks/
    ASSETS,
    SHAPES,
    build_pair,
    copy_bandwidth_gbs,
    load_prompts,
    verify_ms,
    weight_bytes,
)
from torch import Tensor

from specdraft.bench.load_schedule import schedule_rows
from specdraft.bench.tune_bench import WARMUP_TOKENS
from specdraft.bench.tune_load import Level, LoadBench, fit_levels, measure_level, median_run
from specdraft.bench.tune_model import TuneConfig, decode_tokens_per_s
from specdraft.draft import apply_rope, rms_norm
from specdraft.engine.batch import BatchScheduler
from specdraft.engine.batch_target import batch_causal_mask
from specdraft.engine.fast_model import FastTarget, rope_cos_sin
from specdraft.engine.graphs import capture_graph
from specdraft.engine.round import Proposal
from specdraft.engine.schedule import BatchSchedule
from specdraft.engine.spec_config import SpecConfig
from specdraft.engine.speculate import SpeculativeEngine

PARTS = ("forward", "plain", "speculative", "schedule")
TINY = {  # --tiny: the CPU smoke run
    "shape": "tiny",
    "batch_sizes": "1,2",
    "tokens": "1,2",
    "cached": 8,
    "prompt_tokens": 8,
    "new_tokens": 4,
    "max_k": 2,
    "iters": 2,
}
GOALS = {"plain_roofline_pct_b16": 85.0, "plain_roofline_pct_b64": 75.0, "schedule_speedup": 0.97}


class Reporter:
    """Prints one JSON line per record (and appends it to `out`); keeps the seconds per part."""

    def __init__(self, out: Path | None) -> None:
        self.out, self.seconds = out, {}

    def emit(self, record: dict) -> None:
        """Print a record as one JSON line (and append it to out)."""
        line = json.dumps(record, default=str)
        print(line, flush=True)
        if self.out is not None:
            with self.out.open("a") as f:
                f.write(line + "\n")

    def guarded(self, part: str, fn, *args):
        """fn(*args), its seconds kept under `part`; a failure is reported as {"part": part,
        "error": ...} and gives None, so the other parts still run."""
        start = time.perf_counter()
        try:
            return fn(*args)
        except Exception as e:  # noqa: BLE001 (report it and run the other parts)
            self.emit({"part": part, "error": f"{type(e).__name__}: {e}"})
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            return None
        finally:
            self.seconds[part] = self.seconds.get(part, 0.0) + time.perf_counter() - start


@dataclass
class Setup:
    """What every part runs on: the shell pair's two engines (plain: no drafter; spec: chains
    of the max K), the prompts, the options, the weight and K/V bytes and the copy bandwidth."""

    plain: SpeculativeEngine
    spec: SpeculativeEngine
    prompts: list[list[int]]
    args: argparse.Namespace
    weight_bytes: int
    kv_bytes_per_position: int  # one row's K/V of one cached position, every layer
    bandwidth_gbs: float

    @property
    def target(self) -> FastTarget:
        return self.spec.target

    def roofline_ms(self, lengths: list[int]) -> float:
        """Milliseconds to read every weight once and the K/V of rows of these lengths."""
        total = self.weight_bytes + self.kv_bytes_per_position * sum(lengths)
        return 1e3 * total / (self.bandwidth_gbs * 1e9)


# ---- the prompts -------------------------------------------------------------------------------
def window_prompts(model_dir: Path, path: Path, tokens: int) -> list[list[int]]:
    """One prompt per text of `path` (JSON lines with "text"): `tokens` consecutive ids starting
    at text i and running on through texts i + 1, ... (cyclically)."""
    texts = load_prompts(model_dir, 1 << 30, tokens=1 << 30, path=path)
    stream = [i for ids in texts for i in ids]
    if not stream:
        raise SystemExit(f"--prompt-file {path}: no text to take prompts from")
    offsets = [sum(map(len, texts[:i])) for i in range(len(texts))]
    reps = -(-tokens // len(stream)) + 1
    cycled = stream * reps
    return [cycled[start : start + tokens] for start in offsets]


# ---- part 1: the forward by shape --------------------------------------------------------------
@dataclass
class StackInputs:
    """The plain stack's inputs: ids, positions, slots [B, T] long; bias [B, 1, G*T, W] in the
    model dtype (0 where a query attends, -inf elsewhere; the G query heads of a KV head
    stacked, head-major), W the slots attended."""

    ids: Tensor
    positions: Tensor
    slots: Tensor
    bias: Tensor


def stack_inputs(target: FastTarget, starts: list[int], t: int) -> StackInputs:
    """Row b's T tokens at slots starts[b].. (positions the same), each seeing its row's slots up
    to itself, over the widest row's slots rounded up to 8 (at most max_seq_len)."""
    device, args = target.output.weight.device, target.args
    start = torch.tensor(starts, device=device)
    slots = start[:, None] + torch.arange(t, device=device)
    width = min(-(-(max(starts) + t) // 8) * 8, target.max_seq_len)
    mask = batch_causal_mask(start, t, width)  # [B, 1, T, W]
    groups = args.num_heads // args.num_kv_heads
    bias = torch.zeros(mask.shape, dtype=target.output.weight.dtype, device=device)
    bias = bias.masked_fill_(~mask, float("-inf"))[:, :, None].expand(-1, -1, groups, -1, -1)
    ids = torch.randint(0, args.vocab_size, slots.shape, device=device)
    return StackInputs(ids, slots.clone(), slots, bias.reshape(len(starts), 1, groups * t, width))


def plain_stack(
    target: FastTarget, inputs: StackInputs, aux_layers: tuple[int, ...]
) -> tuple[Tensor, Tensor | None]:
    """The reference forward of part 1: `FastTarget.forward`'s function over its weights and
    cache (a Llama without q/k norms), written as a plain stack of F.linear, RMSNorm, RoPE, one
    SDPA per layer and the SwiGLU MLP. Writes each row's K/V at its slots; returns logits
    [B, T, V] float32 and the aux states [B, T, n_aux*H] (None without aux layers)."""
    x = F.embedding(inputs.ids, target.tok_embeddings.weight)
    cos, sin = rope_cos_sin(target.inv_freq, inputs.positions, x.dtype)
    streams = {0: x}
    for k, layer in enumerate(target.layers, start=1):
        x = x + stack_attention(layer, x, cos, sin, inputs)
        ffn = layer.feed_forward
        h = rms_norm(x, layer.ffn_norm.weight, layer.ffn_norm.eps)
        gate, up = F.linear(h, ffn.w13.weight).chunk(2, dim=-1)
        x = x + F.linear(F.silu(gate) * up, ffn.w2.weight)
        streams[k] = x
    logits = F.linear(rms_norm(x, target.norm.weight, target.norm.eps), target.output.weight)
    aux = torch.cat([streams[k] for k in aux_layers], dim=-1) if aux_layers else None
    return logits.float(), aux


def stack_attention(layer, x: Tensor, cos: Tensor, sin: Tensor, inputs: StackInputs) -> Tensor:
    """One layer's attention of the plain stack: q/k/v, RoPE, the new K/V scattered into the
    layer's cache rows, SDPA of the stacked query heads over the rows' slots, o_proj."""
    attn, (b, t, _) = layer.attention, x.shape
    if attn.q_norm is not None:
        raise ValueError("the plain stack covers targets without q/k norms (the Llama shell)")
    heads, kv_heads, d = attn.num_heads, attn.num_kv_heads, attn.head_dim
    h = rms_norm(x, layer.attention_norm.weight, layer.attention_norm.eps)
    qkv = F.linear(h, attn.wqkv.weight, attn.wqkv.bias).view(b, t, -1, d).transpose(1, 2)
    q, k, v = qkv.split([heads, kv_heads, kv_heads], dim=1)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    index = inputs.slots[:, None, :, None].expand(b, kv_heads, t, d)
    width, cache = inputs.bias.shape[-1], attn.kv_cache
    keys = cache.k_cache[:b].scatter_(2, index, k)[:, :, :width]
    values = cache.v_cache[:b].scatter_(2, index, v)[:, :, :width]
    stacked = q.reshape(b, kv_heads, (heads // kv_heads) * t, d)  # head h -> KV head h // G
    y = F.scaled_dot_product_attention(stacked, keys, values, attn_mask=inputs.bias)
    y = y.view(b, heads, t, d).transpose(1, 2).reshape(b, t, heads * d)
    return F.linear(y, attn.wo.weight, attn.wo.bias)


def reference_ms(
    target: FastTarget, aux_layers: tuple[int, ...], starts: list[int], t: int, iters: int
) -> float:
    """Part 1's reference: the plain stack at this shape, the median GPU time of its CUDA graph's
    replay (eager wall time off CUDA) over `iters`."""
    inputs = stack_inputs(target, starts, t)
    run = lambda: plain_stack(target, inputs, aux_layers)  # noqa: E731
    if target.output.weight.device.type != "cuda":
        return wall_ms(run, iters, warmup=1)
    graph, _ = capture_graph(run)
    ms = replay_ms(graph, iters, warmup=3)
    del graph
    return ms


def chains(target: FastTarget, b: int, t: int) -> list[Proposal]:
    """B proposals of T nodes as the batching path gets them: plain decoding's root on the CPU
    (T = 1), a drafted chain's tokens on the device (rows of one [B, T] tensor)."""
    vocab, device = target.args.vocab_size, target.output.weight.device
    tokens = torch.randint(0, vocab, (b, t), device="cpu" if t == 1 else device)
    return [Proposal(row, None, None, None, t - 1) for row in tokens]


def forward_part(setup: Setup, rep: Reporter) -> dict:
    """Part 1 (module docstring): one line per (B, T), each timing guarded on its own (a failed
    one is null with its error in the line); {(B, T): {"engine": ms, "reference": ms}} of those
    measured, for the bound."""
    args, engine, costs = setup.args, setup.spec, {}
    starts = {b: [args.cached + i for i in range(b)] for b in args.batch_sizes}
    batch1 = {}
    with torch.inference_mode():
        if 1 in starts:  # the batch-1 engine's own path, on its batch-1 cache
            engine.runner.reserve()
            batch1 = {t: timed(batch1_ms, engine, t, args.cached, args.iters) for t in args.tokens}
        runner = BatchScheduler(engine, max(starts), graphs=args.graphs).runner
        for b, t in ((b, t) for b in args.batch_sizes for t in args.tokens):
            line = forward_line(setup, runner, starts[b], t)
            if b == 1:
                line |= {"engine_ms": batch1[t][0], "engine_path": batch1_path(engine)}
                line |= {"engine_error": batch1[t][1]} if batch1[t][1] else {}
            ms = {"engine": line["engine_ms"], "reference": line["reference_ms"]}
            if ms["engine"] is not None and ms["reference"] is not None:
                line["engine_over_reference"] = ms["engine"] / ms["reference"]
            if ms["engine"] is not None:
                line["engine_over_roofline"] = ms["engine"] / line["roofline_ms"]
            rep.emit({k: v for k, v in line.items() if v is not None or k.endswith("_ms")})
            costs[b, t] = {key: v for key, v in ms.items() if v is not None}
    return costs


def timed(fn, *args) -> tuple[float | None, str | None]:
    """(fn(*args), None), or (None, the error) when it raises: one shape's failure is that
    shape's line, not the part's."""
    try:
        return fn(*args), None
    except Exception as e:  # noqa: BLE001 (reported in the shape's line)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return None, f"{type(e).__name__}: {e}"


def forward_line(setup: Setup, runner, starts: list[int], t: int) -> dict:
    """The batching path's and the reference's ms at one shape (part 1's line)."""
    target, b, iters = setup.target, len(starts), setup.args.iters
    proposals = chains(target, b, t)
    call = lambda: runner.verify_batch(proposals, starts)  # noqa: E731
    first, _ = timed(wall_ms, call, 1)  # a new shape's compile (and capture, --graphs) in it
    batched, batched_error = timed(wall_ms, call, iters, 2)
    reference, reference_error = timed(
        reference_ms, target, setup.spec.aux_layers, starts, t, iters
    )
    return {
        "part": "forward",
        "batch_size": b,
        "tokens": t,
        "rows": b * t,
        "cached": [starts[0], starts[-1]],
        "batch_runner_ms": batched,
        "batch_runner_first_call_ms": first,
        "batch_runner_error": batched_error,
        "engine_ms": batched,
        "engine_path": "BatchRunner.verify_batch" + (", CUDA graphs" if setup.args.graphs else ""),
        "reference_ms": reference,
        "reference_error": reference_error,
        "roofline_ms": setup.roofline_ms([s + t for s in starts]),
    }


def batch1_path(engine: SpeculativeEngine) -> str:
    """What `batch1_ms` times."""
    if engine.runner.graphed is None:
        return "batch-1 engine, eager torch"
    return f"batch-1 engine, CUDA graph ({engine.target_kernels})"


def batch1_ms(engine: SpeculativeEngine, t: int, cached: int, iters: int) -> float:
    """The batch-1 engine's verify of T tokens after `cached` ones: its CUDA graph's GPU time
    (`shell_target.verify_ms`) once compiled, else the eager `TargetRunner.verify`'s wall time."""
    if engine.runner.graphed is not None:
        return verify_ms(engine, t, cached)
    proposal = chains(engine.target, 1, t)[0]
    return wall_ms(lambda: engine.runner.verify(proposal, cached), iters, warmup=1)


# ---- parts 2 and 3: batched decoding -----------------------------------------------------------
class ShellLoadBench(LoadBench):
    """tune's `LoadBench` over the setup's two engines, built (and compiled) once."""

    def __init__(self, setup: Setup, cfg: TuneConfig) -> None:
        super().__init__(setup.target, setup.spec.draft, setup.prompts, cfg)
        self.setup, self.graphs = setup, setup.args.graphs
        self.rows = max(setup.args.batch_sizes)  # part 1's row count: the compiled shapes again

    def engine(self, spec: SpecConfig | None) -> SpeculativeEngine:
        """The drafter's engine (chains up to the max K) for a spec, else the plain one."""
        return self.setup.plain if spec is None else self.setup.spec


def plain_line(setup: Setup, level: Level) -> dict:
    """Part 2's line of one batch size: tokens/s and the share of the memory roofline."""
    args, b = setup.args, level.batch_size
    mean_length = args.prompt_tokens + args.new_tokens / 2
    roofline = 1e3 * b / setup.roofline_ms([mean_length] * b)
    run = median_run(level.plain_runs)
    return {
        "part": "plain",
        "batch_size": b,
        "tokens_per_s": level.plain_tps,
        "tokens_per_s_runs": [r.tokens_per_s for r in level.plain_runs],
        "round_ms": 1e3 * run.round_s,
        "roofline_tokens_per_s": roofline,
        "roofline_pct": 100 * level.plain_tps / roofline,
    }


def measure_levels(bench: ShellLoadBench, rep: Reporter, depth: int) -> list[Level]:
    """Plain decoding and K = 1..depth at each batch size (`tune_load.measure_level`), part 2's
    line as each size finishes; a size that fails is reported and left out."""
    levels = []
    for b in bench.setup.args.batch_sizes:
        chains = [SpecConfig.chain(k) for k in range(1, depth + 1)]
        measure = (bench, b, chains, bench.cfg.repeats, lambda: None)
        level = rep.guarded("plain_and_speculative", measure_level, *measure)
        if level is None:
            continue
        levels.append(level)
        line = plain_line(bench.setup, level)
        if b == 1:  # beside it, the batch-1 engine's own plain decoding
            tps = rep.guarded("plain_batch1_engine", batch1_decode, bench.setup)
            if tps is not None:
                line["batch1_engine_tokens_per_s"] = tps
                line["batch1_engine_roofline_pct"] = 100 * tps / line["roofline_tokens_per_s"]
        rep.emit(line)
    return levels


def batch1_decode(setup: Setup) -> float:
    """Decode tokens/s of the batch-1 engine's plain decoding (`SpeculativeEngine.generate`:
    once compiled, CUDA graphs with the host a step ahead) of the first prompt, after a short
    warm-up generation."""
    engine, prompt, n = setup.plain, setup.prompts[0], setup.args.new_tokens
    engine.generate(prompt, min(WARMUP_TOKENS, n))
    return decode_tokens_per_s(engine.generate(prompt, n).metrics)


def interpolated(costs: dict, b: int, t: int, key: str) -> float | None:
    """Part 1's cost at (B, T) under `key` ("engine", "reference" or "best": the cheaper of the
    two measured), linear in T between the nearest measured T on either side; None outside them."""

    def cost(tt: int) -> float | None:
        c = costs.get((b, tt), {})
        return (min(c.values()) if c else None) if key == "best" else c.get(key)

    measured = sorted(tt for bb, tt in costs if bb == b and cost(tt) is not None)
    below, above = [x for x in measured if x <= t], [x for x in measured if x >= t]
    if not below or not above:
        return None
    lo, hi = below[-1], above[0]
    if lo == hi:
        return cost(lo)
    return cost(lo) + (cost(hi) - cost(lo)) * (t - lo) / (hi - lo)


def bound(costs: dict, b: int, k: int, tau: float, key: str) -> float | None:
    """tau x forward(B, 1) / forward(B, K + 1), drafting free (None without the costs)."""
    plain, verify = interpolated(costs, b, 1, key), interpolated(costs, b, k + 1, key)
    return None if plain is None or verify is None else tau * plain / verify


def speculative_part(setup: Setup, levels: list[Level], costs: dict, rep: Reporter) -> dict:
    """Part 3 (module docstring): tune's model fitted and each level's K chosen (`fit_levels`),
    a line per (B, K) and one per B; {B: the best K's measured speedup over bound_best}."""
    model = fit_levels(levels, setup.args.max_k, setup.args.min_speedup)
    rep.emit({"part": "model_s", "a": model.a, "b": model.b, "plain": model.plain})
    of_bound = {}
    for level in levels:
        specs = sorted(level.candidates, key=lambda spec: spec.num_steps)
        lines = [spec_line(level, spec, costs) for spec in specs]
        for line in lines:
            rep.emit(line)
        best = max(lines, key=lambda line: line["speedup"])
        bounds = {
            key: max(lines, key=lambda line: line[key] or 0.0)
            for key in ("bound_engine", "bound_best")
        }
        summary = {
            "part": "speculative_best",
            "batch_size": level.batch_size,
            "best_k": best["k"],
            "best_speedup": best["speedup"],
            "chosen_k": level.chosen.num_steps if level.chosen else 0,
            **{key: {"k": line["k"], "speedup": line[key]} for key, line in bounds.items()},
        }
        for key, line in bounds.items():
            if line[key]:
                summary[f"speedup_over_{key}"] = best["speedup"] / line[key]
        of_bound[level.batch_size] = summary.get("speedup_over_bound_best")
        rep.emit(summary)
    return of_bound


def spec_line(level: Level, spec: SpecConfig, costs: dict) -> dict:
    """Part 3's line of one (B, K) (spec: the chain of K): measured, tune's model's prediction,
    the bounds."""
    cand, b, run = level.candidates[spec], level.batch_size, median_run(level.runs[spec])
    k = spec.num_steps
    forward = interpolated(costs, b, k + 1, "engine")
    return {
        "part": "speculative",
        "batch_size": b,
        "k": k,
        "tokens_per_s": cand.measured_tps,
        "tau": cand.measured_tau,
        "speedup": cand.speedup,
        "speedup_runs": [
            t / p for t, p in zip(cand.timing["tokens_per_s_runs"], plain_runs(level))
        ],
        "round_ms": 1e3 * run.round_s,
        "forward_ms": forward,
        "predicted_tau": cand.predicted_tau,
        "predicted_tokens_per_s": cand.predicted_tps,
        "predicted_speedup": cand.predicted_tps / level.plain_predicted_tps,
        "bound_engine": bound(costs, b, k, cand.measured_tau, "engine"),
        "bound_best": bound(costs, b, k, cand.measured_tau, "best"),
    }


def plain_runs(level: Level) -> list[float]:
    """Tokens/s of a level's plain runs, in timing-round order."""
    return [r.tokens_per_s for r in level.plain_runs]


def schedule_part(bench: ShellLoadBench, levels: list[Level], rep: Reporter) -> dict:
    """The schedule of the chosen K per B run once at each B (module docstring): a line each;
    {B: speedup over part 2}."""
    rows = schedule_rows(levels, bench.rows)  # to the schedulers' rows: a level may be missing
    schedule = BatchSchedule.of(rows)
    rep.emit({"part": "schedule", "num_speculative_tokens_per_batch_size": rows})
    speedups = {}
    for level in levels:
        b = level.batch_size
        k = schedule.num_steps(b)
        depth = SpecConfig.chain(bench.cfg.depth)  # the drafter's engine, K by the schedule
        run = rep.guarded("schedule", bench.run_batch, b, depth, schedule)
        if run is None:
            continue
        speedups[b] = run.tokens_per_s / level.plain_tps
        rep.emit(
            {
                "part": "schedule",
                "batch_size": b,
                "k": k,
                "tokens_per_s": run.tokens_per_s,
                "tau": run.metrics.accept_length,
                "speedup": speedups[b],
            }
        )
    return speedups


# ---- the run -----------------------------------------------------------------------------------
def build_setup(args: argparse.Namespace, rep: Reporter) -> Setup:
    """The shell pair on the device, its two engines (compiled on CUDA unless --eager), the
    prompts, the byte counts and the copy bandwidth; reported as the "setup" line."""
    start, cuda = time.perf_counter(), not args.tiny
    device, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    torch.manual_seed(0)
    pair = build_pair(args.model, args.draft, SHAPES[args.shape], device, dtype)
    target = pair.target
    longest = max(
        args.cached + max(args.batch_sizes) + max(args.tokens),
        args.prompt_tokens + args.new_tokens + args.max_k + 1,
    )
    max_seq_len, compile = -(-longest // 8) * 8, cuda and not args.eager
    if compile:  # (B, T) shapes, prefills: more than a recompile limit of 8 (module docstring)
        config = torch._dynamo.config
        name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
        setattr(config, name, max(getattr(config, name), 64))
    engines = [
        SpeculativeEngine(target, draft, spec, None, max_seq_len, device, compile=compile)
        for draft, spec in ((None, None), (pair.draft, SpecConfig.chain(args.max_k)))
    ]
    stack = target.kv_stack
    kv_bytes = stack.numel() * stack.element_size() // (target.max_batch_size * max_seq_len)
    bandwidth = copy_bandwidth_gbs(4 << 30 if cuda else 64 << 20, device)
    prompts = window_prompts(args.model, args.prompt_file, args.prompt_tokens)
    setup = Setup(*engines, prompts, args, weight_bytes(target), kv_bytes, bandwidth)
    rep.emit(
        {
            "part": "setup",
            "device": torch.cuda.get_device_name() if cuda else "cpu",
            "torch": torch.__version__,
            "shape": dataclasses.asdict(SHAPES[args.shape]),
            "draft": str(args.draft),
            "draft_config": pair.draft.cfg.to_dict(),
            "compile": compile,
            "target_kernels": engines[1].target_kernels,
            "max_seq_len": max_seq_len,
            "weight_bytes": setup.weight_bytes,
            "kv_bytes_per_position": kv_bytes,
            "copy_bandwidth_gb_s": bandwidth,
            "prompts": len(prompts),
            "options": {k: str(v) for k, v in vars(args).items()},
            "build_s": time.perf_counter() - start,
        }
    )
    return setup


def run(args: argparse.Namespace) -> None:
    """Every part asked for, in order, each guarded; then the summary line."""
    rep, start = Reporter(args.out), time.perf_counter()
    setup = build_setup(args, rep)
    costs = {}
    if "forward" in args.parts:
        costs = rep.guarded("forward", forward_part, setup, rep) or {}
    depth = args.max_k if {"speculative", "schedule"} & set(args.parts) else 0
    cfg = TuneConfig(
        max_new_tokens=args.new_tokens,
        probe_steps=max(1, depth),
        topks=(1,),
        max_tree_tokens=2,
        repeats=args.repeats,
        min_speedup=args.min_speedup,
    )
    bench, levels, of_bound, schedule = ShellLoadBench(setup, cfg), [], {}, {}
    if {"plain", "speculative", "schedule"} & set(args.parts):
        levels = measure_levels(bench, rep, depth)
    if depth and levels:
        of_bound = rep.guarded("speculative", speculative_part, setup, levels, costs, rep) or {}
        if "schedule" in args.parts:
            schedule = rep.guarded("schedule", schedule_part, bench, levels, rep) or {}
    rep.emit({"summary": summary(rep, costs, levels, setup, of_bound, schedule, start)})


def summary(rep, costs, levels, setup, of_bound, schedule, start) -> dict:
    """The seconds per part and issue #37's goals from the measured lines."""
    pct = {level.batch_size: plain_line(setup, level)["roofline_pct"] for level in levels}
    slower = [
        [b, t]
        for (b, t), c in sorted(costs.items())
        if len(c) == 2 and c["engine"] > c["reference"]
    ]
    return {
        "seconds": {**rep.seconds, "total": time.perf_counter() - start},
        "plain_roofline_pct": pct,
        "plain_goal_met": all(
            p >= (GOALS["plain_roofline_pct_b16"] if b <= 16 else GOALS["plain_roofline_pct_b64"])
            for b, p in pct.items()
        ),
        "forward_shapes_slower_than_reference": slower,
        "speedup_over_bound": of_bound,
        "bound_goal_met": all(x is not None and x >= 0.8 for x in of_bound.values()),
        "schedule_speedup": schedule,
        "schedule_goal_met": all(x >= GOALS["schedule_speedup"] for x in schedule.values()),
    }


def int_list(text: str) -> list[int]:
    """ "1,2,4" -> [1, 2, 4]."""
    return [int(x) for x in text.split(",") if x]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The options (module docstring); --tiny fills the ones not given with TINY's."""
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n".join(__doc__.splitlines()[1:]),
    )
    add = parser.add_argument
    add("--model", type=Path, required=True, help="the small target (the pycode-25m directory)")
    add(
        "--draft",
        type=Path,
        default=ASSETS / "draft",
        help="its EAGLE-3 drafter (default: the committed one)",
    )
    add("--shape", choices=sorted(SHAPES), help="the shell (default: llama-3-8b; --tiny: tiny)")
    add("--batch-sizes", help="default 1,2,4,8,16,32,64")
    add("--tokens", help="part 1's T per row (default 1,2,3,4,5,8)")
    add("--cached", type=int, help="part 1: row b's cached positions = this + b (default 512)")
    add("--prompt-tokens", type=int, help="parts 2-3: tokens per prompt (default 448)")
    add("--new-tokens", type=int, help="parts 2-3: tokens per sequence (default 64)")
    add("--max-k", type=int, help="part 3: chains K = 1..this (default 7)")
    add("--iters", type=int, help="part 1: timed calls per shape, after 3 untimed (default 20)")
    add("--repeats", type=int, default=1, help="parts 2-3: timing rounds (order rotated)")
    add("--min-speedup", type=float, default=1.0, help="part 3: a K is chosen past this speedup")
    add("--parts", default=",".join(PARTS), help=f"a subset of {','.join(PARTS)}")
    add("--prompt-file", type=Path, default=ASSETS / "prompts.jsonl", help='JSON lines with "text"')
    add("--eager", action="store_true", help="CUDA: engines not compiled (no graphs at batch 1)")
    add("--graphs", action="store_true", help="batched forwards as one CUDA graph per (B, T)")
    add("--tiny", action="store_true", help="CPU float32 on a tiny shell, B 1,2: a smoke run")
    add("--out", type=Path, help="also append the JSON lines here")
    args = parser.parse_args(argv)
    defaults = (
        TINY
        if args.tiny
        else {
            "shape": "llama-3-8b",
            "batch_sizes": "1,2,4,8,16,32,64",
            "tokens": "1,2,3,4,5,8",
            "cached": 512,
            "prompt_tokens": 448,
            "new_tokens": 64,
            "max_k": 7,
            "iters": 20,
        }
    )
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    args.batch_sizes, args.tokens = (
        sorted(set(int_list(args.batch_sizes))),
        sorted(set(int_list(args.tokens))),
    )
    args.parts = [p for p in args.parts.split(",") if p]
    unknown = set(args.parts) - set(PARTS)
    if unknown or args.max_k < 1 or 1 not in args.tokens:
        parser.error(f"--parts among {','.join(PARTS)}, --max-k >= 1, --tokens holding 1")
    return args


def main() -> None:
    args = parse_args()
    if args.tiny:
        torch.set_num_threads(min(2, torch.get_num_threads()))
    run(args)


if __name__ == "__main__":
    main()
