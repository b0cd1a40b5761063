"""Speed of specdraft's engine on a Llama-3.1-8B-shaped target with random bf16 weights, batch 1.

Measures, and prints as JSON:
- copy bandwidth: a large device-to-device copy (bytes read + written / time);
- plain decode: tokens/s of CUDA-graphed single-token steps on a 1k-token cache, against the
  roofline = measured bandwidth / weight bytes (every weight is read once per token);
- target forward time for T = 1, 4, 8, 16, 32, 64 new tokens on the 1k-token cache (graphed),
  as the engine calls it (inputs staged from the host, a verify's drafted ids already in the
  graph's input, then the replay, synchronised; the sizes timed in interleaved rounds); for 1
  and 16 also the replay alone on CUDA events: the GPU's part, without the host's;
- drafter step time (EAGLE-3 layer of the same width, 32k draft vocabulary): first step over
  4 accepted positions and a tree step over topk = 4 frontier rows, on a 1k-token draft cache;
- end to end: `SpeculativeEngine.generate` with compile=True, plain vs chain vs tree (random
  weights: drafts are ~never accepted, so this measures the machinery, not a speedup);
- on CUDA first: compile=True against eager greedy decoding on small targets: float32, the
  same tokens; bf16 (Triton kernels), every token the float32 argmax up to bf16 near-ties.
Output: one JSON object per line, one per section.
Goals checked: plain decode >= 90 % of roofline, verify 16 <= 1.15 x decode, drafter step <=
10 % of a target decode step; after the end-to-end run, plain decode >= 90 % again as the engine
decodes (`goal_end_to_end`: tokens/s after prefill, the host one step ahead).

    python benchmarks/engine_speed.py            # H200 / any CUDA GPU
    python benchmarks/engine_speed.py --tiny     # smoke test: small shapes on the CPU, seconds
    --profile: also the costliest kernels of an eager decode and host ops of a draft round.

On the CPU (--tiny) the target and drafter run their torch paths (the engine takes the Triton
kernels only on CUDA) and the graph check is skipped; the goals are printed, not met.
Measurements so far, and the variants tried and dropped: benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict

import torch
from gpu_timing import replay_ms  # benchmarks/, the script's directory
from torch.nn.attention import sdpa_kernel

from specdraft.draft import Eagle3Draft
from specdraft.draft_config import DraftConfig
from specdraft.engine.eagle import DRAFT_SDPA_BACKENDS, DraftCache, FastDraft
from specdraft.engine.fast_config import ModelArgs
from specdraft.engine.fast_model import FastTarget, causal_mask
from specdraft.engine.graphs import GraphedTarget
from specdraft.engine.round import speculative_round
from specdraft.engine.sampling import SamplingParams
from specdraft.engine.spec_config import SpecConfig
from specdraft.engine.speculate import SpeculativeEngine

LLAMA_8B = ModelArgs(
    model_type="llama",
    hidden_size=4096,
    num_layers=32,
    num_heads=32,
    num_kv_heads=8,
    head_dim=128,
    intermediate_size=14336,
    vocab_size=128256,
    rms_norm_eps=1e-5,
    max_position_embeddings=131072,
    rope_theta=500000.0,
    rope_type="llama3",
    rope_factor=8.0,
    rope_low_freq_factor=1.0,
    rope_high_freq_factor=4.0,
    rope_original_max_positions=8192,
)
TINY = ModelArgs(
    model_type="llama",
    hidden_size=64,
    num_layers=8,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    intermediate_size=128,
    vocab_size=512,
    max_position_embeddings=4096,
)
VERIFY_TOKENS = (1, 4, 8, 16, 32, 64)


def random_target(args: ModelArgs, dtype: torch.dtype, device: str) -> FastTarget:
    """FastTarget with N(0, 0.02) weights and unit norms, built directly on `device`."""
    with torch.device("meta"):
        model = FastTarget(args)
    model = model.to_empty(device=device).to(dtype)
    model.tie_weights()
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.fill_(1.0) if name.endswith("norm.weight") else param.normal_(0, 0.02)
    return model.eval()


def random_draft(
    target: FastTarget, draft_vocab: int, dtype: torch.dtype, device: str
) -> Eagle3Draft:
    """EAGLE-3 drafter of the target's width, aux layers [2, L//2, L-3], embedding shared."""
    a = target.args
    cfg = DraftConfig(
        hidden_size=a.hidden_size,
        num_attention_heads=a.num_heads,
        num_key_value_heads=a.num_kv_heads,
        head_dim=a.head_dim,
        intermediate_size=a.intermediate_size,
        target_hidden_size=a.hidden_size,
        vocab_size=a.vocab_size,
        draft_vocab_size=draft_vocab,
        aux_layers=(2, a.num_layers // 2, a.num_layers - 3),
        target_num_layers=a.num_layers,
        max_position_embeddings=a.max_position_embeddings,
        rope_theta=a.rope_theta,
    )
    with torch.device(device):
        draft = Eagle3Draft(cfg)
    draft = draft.to(dtype).eval()
    draft.load_target_embedding(target.tok_embeddings.weight)
    return draft


def timed_ms(fn: Callable[[], object], device: str, iters: int, warmup_s: float = 0.3) -> float:
    """Median wall time of fn() in milliseconds (synchronised on CUDA), after calling fn for
    warmup_s seconds and at least 3 times (compiles, captures, and lets the GPU's clocks settle)."""
    warm_up(fn, device, warmup_s)
    return statistics.median(step_times(fn, device, iters))


def interleaved_ms(
    fns: dict, device: str, iters: int, rounds: int = 5, warmup_s: float = 0.3
) -> dict:
    """Median wall time in milliseconds of each fn in `fns` (synchronised on CUDA): each warmed
    up as `timed_ms`, then `rounds` rounds of iters // rounds calls of every fn in turn, so that
    the host's and the GPU's drift within the process (clocks, another process's load) reaches
    them all alike instead of whichever ran last."""
    for fn in fns.values():
        warm_up(fn, device, warmup_s)
    times: dict = {key: [] for key in fns}
    for _ in range(rounds):
        for key, fn in fns.items():
            times[key] += step_times(fn, device, max(1, iters // rounds))
    return {key: statistics.median(samples) for key, samples in times.items()}


def warm_up(fn: Callable[[], object], device: str, seconds: float) -> None:
    """Call fn (synchronised) for `seconds` and at least 3 times."""
    start, calls = time.perf_counter(), 0
    while calls < 3 or time.perf_counter() - start < seconds:
        step_times(fn, device, 1)
        calls += 1


def step_times(fn: Callable[[], object], device: str, n: int) -> list[float]:
    """Wall times in milliseconds of n calls of fn, each synchronised on CUDA."""
    times = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    return times


def copy_bandwidth_gbs(device: str, num_bytes: int) -> float:
    """GB/s of a device-to-device copy: (read + write) bytes / median time."""
    src = torch.empty(num_bytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    ms = timed_ms(lambda: dst.copy_(src), device, iters=10)
    return 2 * num_bytes / (ms / 1e3) / 1e9


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of the weights a decode step reads (the input embedding is a lookup: excluded)."""
    params = {id(p): p for n, p in model.named_parameters() if not n.startswith("tok_embeddings")}
    if hasattr(model, "output") and model.args.tie_word_embeddings:
        params[id(model.output.weight)] = model.output.weight
    return sum(p.numel() * p.element_size() for p in params.values())


def step_forward(target: FastTarget, forward, prefix: int, t: int, max_seq_len: int, device: str):
    """A callable running T = t new tokens after `prefix` cached tokens (causal). For a
    `GraphedTarget` the inputs are where the engine has them: positions, slots and mask built on
    the host, a decode step's token too; a verify's drafted tokens on the device, in the graph's
    own input buffer, where the engine's drafter writes them (`GraphedTarget.device_input_ids`)."""
    staged = isinstance(forward, GraphedTarget)
    if staged and t > 1:
        ids = forward.device_input_ids(t, max_seq_len)
        ids.random_(0, target.args.vocab_size)
    else:
        ids = torch.randint(0, target.args.vocab_size, (1, t), device="cpu" if staged else device)
    positions = torch.arange(prefix, prefix + t, device="cpu" if staged else device)[None]
    slots = positions[0]
    mask = causal_mask(prefix, t, max_seq_len, device=positions.device)
    return lambda: forward(ids, positions, slots, mask, ())


@torch.inference_mode()  # as the engine runs the target; the stacked cache's views need it
def bench_target(
    target: FastTarget, device: str, prefix: int, max_seq_len: int, iters: int, triton: bool
) -> dict:
    """Decode and verify times on a `prefix`-token cache, graphed on CUDA (T <= 16 through the
    Triton kernels when `triton`, as `SpeculativeEngine(compile=True)` runs them)."""
    target.setup_cache(1, max_seq_len)
    step_forward(target, target, 0, prefix, max_seq_len, device)()  # prefill the cache
    forward, kernels = target, "torch"
    if device == "cuda":
        for layer in target.layers:
            layer.compile()
        forward = GraphedTarget(target, ())
        if triton:
            reason = target.use_triton()
            kernels = "triton" if reason is None else f"torch ({reason})"
    times = interleaved_ms(
        {t: step_forward(target, forward, prefix, t, max_seq_len, device) for t in VERIFY_TOKENS},
        device,
        iters,
    )
    result = {
        "prefix_tokens": prefix,
        "kernels_up_to_16_tokens": kernels,
        "forward_ms": {str(t): ms for t, ms in times.items()},
        "decode_ms": times[1],
        "decode_tokens_per_s": 1e3 / times[1],
        "verify16_over_decode": times[16] / times[1],
    }
    if isinstance(forward, GraphedTarget):
        graphs = {
            key[0]: graph for key, (graph, _, _) in forward.graphs.items()
        }  # one placement per T
        replay = {t: replay_ms(graphs[t], iters) for t in (1, 16)}
        result["graph_replay_ms"] = {str(t): ms for t, ms in replay.items()}
        result["graph_replay_verify16_over_decode"] = replay[16] / replay[1]
    return result


def bench_draft(
    draft: Eagle3Draft, device: str, prefix: int, topk: int, iters: int, triton: bool
) -> dict:
    """Drafter first step (4 positions) and tree step (topk rows) on a `prefix`-entry cache, as
    the engine runs them (`FastDraft`, writing its K/V into the cache; through the Triton
    kernels when `triton`, as `SpeculativeEngine(compile=True)` runs it), graphed on CUDA."""
    cfg, fast = draft.cfg, FastDraft(draft)
    kernels = "torch"
    if triton:
        reason = fast.use_triton()
        kernels = "triton" if reason is None else f"torch ({reason})"
    cache = DraftCache(
        cfg.num_key_value_heads, cfg.head_dim, prefix + 64, draft.fc.weight.dtype, device
    )
    dtype = draft.fc.weight.dtype

    def run(t: int, first: bool, mask: torch.Tensor | None):
        ids = torch.randint(0, cfg.vocab_size, (t,), device=device)
        width = cfg.n_aux * cfg.target_hidden_size if first else cfg.hidden_size
        hidden = torch.randn(t, width, device=device, dtype=dtype)
        positions = torch.full((t,), prefix, device=device)
        return lambda: fast(ids, hidden, positions, first, cache, prefix, mask)

    tree_mask = torch.ones(topk, prefix + topk, dtype=torch.bool, device=device)
    fns = {
        "first_step_4_ms": run(4, True, None),
        f"tree_step_{topk}_ms": run(topk, False, tree_mask),
        "chain_step_1_ms": run(1, False, None),
    }
    with sdpa_kernel(DRAFT_SDPA_BACKENDS):  # as the engine runs the drafter
        if device == "cuda":
            fns = {name: graphed(fn) for name, fn in fns.items()}
        return {"kernels": kernels} | {
            name: timed_ms(fn, device, iters) for name, fn in fns.items()
        }


def graphed(fn: Callable[[], object]) -> Callable[[], object]:
    """Capture fn (fixed inputs) as a CUDA graph; return its replay."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def bench_end_to_end(
    target: FastTarget,
    draft: Eagle3Draft,
    device: str,
    prefix: int,
    new_tokens: int,
    max_seq_len: int,
    profile: bool = False,
) -> dict:
    """SpeculativeEngine.generate tokens/s: plain, chain(3), tree(4, 4, 16) (greedy)."""
    prompt = torch.randint(0, target.args.vocab_size, (prefix,)).tolist()
    results = {}
    settings = {"plain": None, "chain3": SpecConfig.chain(3), "tree4x4_16": SpecConfig(4, 4, 16)}
    for name, spec in settings.items():
        engine = SpeculativeEngine(
            target,
            draft if spec else None,
            spec,
            None,
            max_seq_len,
            device,
            compile=device == "cuda",
        )
        try:
            engine.generate(prompt, 8)  # warm-up: compiles and captures
            m = engine.generate(prompt, new_tokens).metrics
            if profile and spec is not None:
                results[name + "_draft_round_ops"] = profile_draft_round(engine, prompt)
        except Exception as e:  # report and go on with the other settings
            results[name] = {"error": f"{type(e).__name__}: {e}"}
            continue
        results[name] = {
            "kernels": {"target": engine.target_kernels, "draft": engine.draft_kernels},
            "tokens_per_s": m.tokens_per_s,
            "accept_length": m.accept_length,
            "time_prefill_s": m.time_prefill_s,
            "time_draft_s": m.time_draft_s,
            "time_verify_s": m.time_verify_s,
            "time_other_s": m.time_other_s,
            "decode_tokens_per_s": (m.num_output_tokens - 1) / (m.time_total_s - m.time_prefill_s),
        }
    return results


def profile_decode(target: FastTarget, device: str, prefix: int, max_seq_len: int) -> list[dict]:
    """The 15 costliest kernels of one eager single-token forward (CUDA time, microseconds)."""
    from torch.profiler import ProfilerActivity, profile

    target.setup_cache(1, max_seq_len)
    step = step_forward(target, target, prefix, 1, max_seq_len, device)
    step()
    with profile(
        activities=[ProfilerActivity.CUDA if device == "cuda" else ProfilerActivity.CPU]
    ) as prof:
        step()
        if device == "cuda":
            torch.cuda.synchronize()
    rows = sorted(prof.key_averages(), key=lambda e: -e.device_time_total)[:15]
    return [
        {"kernel": e.key[:90], "calls": e.count, "us": round(e.device_time_total, 1)} for e in rows
    ]


@torch.inference_mode()
def profile_draft_round(engine: SpeculativeEngine, prompt: list[int]) -> list[dict]:
    """The 12 costliest host-side ops of one drafting round (CPU time, microseconds)."""
    from torch.profiler import ProfilerActivity, profile

    req = engine.new_request(prompt, 8, SamplingParams(), (), None, None, None)
    req.emit([engine.prefill(req)])
    speculative_round(req, engine.proposer, engine.runner)
    activities = [ProfilerActivity.CPU] + (
        [ProfilerActivity.CUDA] if engine.device.type == "cuda" else []
    )
    with profile(activities=activities) as prof:
        engine.proposer.propose(req)
    rows = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:12]
    return [
        {
            "op": e.key[:60],
            "calls": e.count,
            "self_cpu_us": round(e.self_cpu_time_total, 1),
            "device_us": round(e.device_time_total, 1),
        }
        for e in rows
    ]


def check_graphs(device: str) -> dict:
    """compile=True (layer compile + CUDA graphs, Triton kernels in bf16) against eager torch on
    small targets, plain / chain / tree greedy. float32: the same tokens. bf16: logits are rounded
    to bf16, so near-ties break either way; instead each emitted token must be the float32
    argmax of its prefix up to 5 % of the logit spread (sd) (`off_argmax` counts the tokens that are
    not; `max_gap` is the largest shortfall, in units of that spread)."""
    report = {}
    prompt = torch.randint(0, 4096, (40,)).tolist()
    for dtype in (torch.float32, torch.bfloat16):
        target = random_target(dataclasses.replace(TINY, vocab_size=4096), dtype, device)
        with torch.no_grad():
            target.output.weight.mul_(50)  # peaked logits: fewer near-ties between kernels
        draft = random_draft(target, 1024, dtype, device)
        settings = {"plain": None, "chain3": SpecConfig.chain(3), "tree3x2_6": SpecConfig(3, 2, 6)}
        for name, spec in settings.items():
            outs = {}
            for compile in (False, True):
                target.triton_kernels = False
                engine = SpeculativeEngine(
                    target, draft if spec else None, spec, None, 256, device, compile=compile
                )
                outs[engine.target_kernels if compile else "eager"] = engine.generate(
                    prompt, 48
                ).token_ids
            key = f"{name}_{str(dtype)[6:]}"
            if dtype == torch.float32:
                report[key] = {"same_tokens": len(set(map(tuple, outs.values()))) == 1}
            else:
                report[key] = {
                    path: greedy_gaps(target, prompt, tokens) for path, tokens in outs.items()
                }
        target.triton_kernels = False
    return report


@torch.no_grad()
def greedy_gaps(target: FastTarget, prompt: list[int], tokens: list[int]) -> dict:
    """How far each generated token falls short of the float32 argmax after its prefix."""
    exact = dataclasses.replace(target.args)
    model = FastTarget(exact).to(target.output.weight.device)
    model.load_state_dict({k: v.float() for k, v in target.state_dict().items()})
    ids = torch.tensor([prompt + tokens], device=model.output.weight.device)
    n = ids.shape[1]
    model.setup_cache(1, n)
    logits = model(
        ids,
        torch.arange(n, device=ids.device)[None],
        torch.arange(n, device=ids.device),
        causal_mask(0, n, n, device=ids.device),
    ).logits[0, len(prompt) - 1 : -1]
    chosen = logits.gather(1, torch.tensor(tokens, device=ids.device)[:, None])[:, 0]
    gap = (logits.max(-1).values - chosen) / logits.std(-1)
    return {"off_argmax": int((gap > 0.05).sum()), "max_gap": round(gap.max().item(), 4)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="small shapes on the CPU (smoke test)")
    parser.add_argument(
        "--prefix", type=int, default=1024, help="cached tokens before each timed step"
    )
    parser.add_argument("--new-tokens", type=int, default=128, help="tokens generated end to end")
    parser.add_argument("--iters", type=int, default=100)
    parser.add_argument("--skip-e2e", action="store_true")
    parser.add_argument(
        "--tune-gemv",
        action="store_true",
        help="inductor coordinate-descent tuning: single-token matmuls become tuned "
        "Triton reductions (gpt-fast's setting; longer compile)",
    )
    parser.add_argument(
        "--profile", action="store_true", help="print the CUDA kernels of one eager decode"
    )
    parser.add_argument(
        "--torch-kernels",
        action="store_true",
        help="time the torch paths of target (compiled layers) and drafter instead of the "
        "Triton kernels",
    )
    args = parser.parse_args()
    device = "cpu" if args.tiny else "cuda"
    if args.tiny:  # seconds, not minutes: the code paths, not the figures
        torch.set_num_threads(1)  # tiny shapes: threads only add contention
        args.prefix, args.new_tokens, args.iters = (
            min(args.prefix, 64),
            min(args.new_tokens, 16),
            min(args.iters, 5),
        )
    shape, dtype = (TINY, torch.float32) if args.tiny else (LLAMA_8B, torch.bfloat16)
    prefix = args.prefix
    max_seq_len = prefix + args.new_tokens + 128
    torch.manual_seed(0)
    if args.tune_gemv:
        torch._inductor.config.coordinate_descent_tuning = True
    report(
        "graph_check_same_tokens",
        check_graphs(device) if device == "cuda" else "skipped: CUDA graphs need CUDA",
    )
    target = random_target(shape, dtype, device)
    draft = random_draft(target, min(32000, shape.vocab_size), dtype, device)
    bandwidth = copy_bandwidth_gbs(device, (1 << 24) if args.tiny else (4 << 30))
    weights = weight_bytes(target)
    roofline = bandwidth * 1e9 / weights
    report(
        "setup",
        {
            "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
            "torch": torch.__version__,
            "target": asdict(shape),
            "dtype": str(dtype),
            "weight_bytes": weights,
            "copy_bandwidth_gb_s": bandwidth,
            "roofline_tokens_per_s": roofline,
            "draft_weight_bytes": sum(
                p.numel() * p.element_size()
                for n, p in draft.named_parameters()
                if n != "embed_tokens.weight"
            ),
        },
    )
    if args.profile:
        report("decode_kernels", profile_decode(target, device, prefix, max_seq_len))
    forward = report(
        "target_forward",
        bench_target(
            target, device, prefix, max_seq_len, args.iters, triton=not args.torch_kernels
        ),
    )
    draft_ms = report(
        "draft_step_ms",
        bench_draft(draft, device, prefix, topk=4, iters=args.iters, triton=not args.torch_kernels),
    )
    goals = {
        "plain_decode_fraction_of_roofline": forward["decode_tokens_per_s"] / roofline,
        "verify16_over_decode": forward["verify16_over_decode"],
        "draft_tree_step_over_decode": draft_ms["tree_step_4_ms"] / forward["decode_ms"],
        "draft_chain_step_over_decode": draft_ms["chain_step_1_ms"] / forward["decode_ms"],
    }
    if "graph_replay_ms" in forward:  # the GPU's part of a step, without the host's staging
        goals["graph_replay_decode_fraction_of_roofline"] = (
            1e3 / forward["graph_replay_ms"]["1"] / roofline
        )
        goals["graph_replay_verify16_over_decode"] = forward["graph_replay_verify16_over_decode"]
    goals["met"] = {
        "decode>=0.9roofline": goals["plain_decode_fraction_of_roofline"] >= 0.9,
        "verify16<=1.15decode": goals["verify16_over_decode"] <= 1.15,
        "draft_step<=0.1decode": goals["draft_tree_step_over_decode"] <= 0.1,
    }
    report("goals", goals)
    if not args.skip_e2e:
        e2e = report(
            "end_to_end",
            bench_end_to_end(
                target, draft, device, prefix, args.new_tokens, max_seq_len, args.profile
            ),
        )
        # plain decoding as the engine runs it (the host one step ahead): what a user gets
        fraction = e2e["plain"]["decode_tokens_per_s"] / roofline
        report(
            "goal_end_to_end",
            {
                "plain_decode_fraction_of_roofline": fraction,
                "met": {"decode>=0.9roofline": fraction >= 0.9},
            },
        )


def report(section: str, value):
    """Print one JSON line {"section": value} (flushed: partial runs still report) and return value."""
    print(json.dumps({section: value}, default=str), flush=True)
    return value


if __name__ == "__main__":
    main()
