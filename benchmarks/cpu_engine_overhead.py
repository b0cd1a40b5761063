"""Per-round overhead of specdraft's engine on the CPU: plain vs chain speculation, batch 1, greedy.

The demo's pair (`specdraft demo --out DIR`: the bundled stories260K target and its trained
EAGLE-3 drafter) is so small that every step is bound by Python and kernel-launch overhead,
so this measures the engine's host work per round, not the models. Each setting (plain, chain
1-4, one tree) generates from the held-out prompts once per repeat; settings take turns within a
repeat, so load from other processes hits them alike. Per setting: median tokens/s (output
tokens / wall time of the pass, prefill included), accept length tau, ms per round drafting and
verifying, and the median over repeats of its tokens/s over plain's in the same repeat. Every
greedy output must equal plain decoding's (the run fails otherwise). Prints one JSON line.

    python benchmarks/cpu_engine_overhead.py --out /tmp/demo3 [--repeats 7] [--profile chain-3]
    python benchmarks/cpu_engine_overhead.py --tiny    # smoke test: seeded untrained drafter, seconds

Measurements so far: benchmarks/RESULTS.md.
"""

from __future__ import annotations

import cProfile
import json
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import typer
from tiny_pair import tiny_demo_dir  # benchmarks/, the script's directory

from specdraft.demo.generation import heldout_prompts
from specdraft.engine.load import load_engine
from specdraft.engine.spec_config import SpecConfig
from specdraft.engine.speculate import SpeculativeEngine

SETTINGS = {
    "plain": None,
    **{f"chain-{n}": SpecConfig.chain(n) for n in (1, 2, 3, 4)},
    "tree-4-2-8": SpecConfig(4, 2, 8),
}


def run_once(engine: SpeculativeEngine, prompts: list[list[int]], max_new_tokens: int) -> dict:
    """Generate from every prompt: tokens/s, tau, ms per round drafting / verifying, outputs."""
    outputs, merged, start = [], None, time.perf_counter()
    for prompt in prompts:
        result = engine.generate(prompt, max_new_tokens)
        outputs.append(result.token_ids)
        merged = result.metrics if merged is None else merged.merge(result.metrics)
    seconds, rounds = time.perf_counter() - start, merged.num_verify_steps
    return {
        "tokens_per_s": merged.num_output_tokens / seconds,
        "accept_length": merged.accept_length,
        "draft_ms_per_round": 1e3 * merged.time_draft_s / rounds,
        "verify_ms_per_round": 1e3 * merged.time_verify_s / rounds,
        "outputs": outputs,
    }


def measure(
    engines: dict[str, SpeculativeEngine],
    prompts: list[list[int]],
    max_new_tokens: int,
    repeats: int,
) -> dict[str, list[dict]]:
    """`repeats` passes per setting, the settings taking turns; checks greedy outputs = plain's."""
    for engine in engines.values():
        run_once(engine, prompts[:2], 16)  # warm-up
    runs: dict[str, list[dict]] = {name: [] for name in engines}
    for _ in range(repeats):
        for name, engine in engines.items():
            runs[name].append(run_once(engine, prompts, max_new_tokens))
    for name, setting_runs in runs.items():
        if any(run["outputs"] != runs["plain"][0]["outputs"] for run in setting_runs):
            raise SystemExit(f"{name}: greedy output differs from plain decoding")
    return runs


def summarize(runs: dict[str, list[dict]]) -> dict[str, dict]:
    """Medians over repeats per setting, and the median same-repeat speed-up over plain."""
    rows = {}
    for name, setting_runs in runs.items():
        row = {
            key: round(statistics.median(run[key] for run in setting_runs), 4)
            for key in (
                "tokens_per_s",
                "accept_length",
                "draft_ms_per_round",
                "verify_ms_per_round",
            )
        }
        row["speedup"] = round(
            statistics.median(
                run["tokens_per_s"] / plain["tokens_per_s"]
                for run, plain in zip(setting_runs, runs["plain"])
            ),
            3,
        )
        row["tokens_per_s_each"] = [round(run["tokens_per_s"], 1) for run in setting_runs]
        rows[name] = row
    return rows


def main(
    out: Path = typer.Option(Path("specdraft-demo"), help="the demo's --out directory"),
    repeats: int = typer.Option(7, help="passes over the prompts per setting (medians reported)"),
    num_prompts: int = typer.Option(8, help="held-out prompts per pass"),
    prompt_tokens: int = typer.Option(8, help="prompt length (the demo's default)"),
    max_new_tokens: int = typer.Option(96, help="tokens generated per prompt"),
    threads: int = typer.Option(1, help="torch CPU threads"),
    profile: str = typer.Option("", help="also cProfile one pass of this setting (to stderr)"),
    tiny: bool = typer.Option(
        False,
        help="smoke test: a seeded tiny pair in a temporary "
        "directory instead of --out, 1 repeat, 2 prompts x 16 tokens",
    ),
) -> None:
    """Measure every setting on the demo's target and drafter; print one JSON line."""
    if tiny:
        with tempfile.TemporaryDirectory(prefix="cpu-engine-overhead-") as tmp:
            run(tiny_demo_dir(Path(tmp)), 1, 2, prompt_tokens, 16, threads, profile)
    else:
        run(out, repeats, num_prompts, prompt_tokens, max_new_tokens, threads, profile)


def run(
    out: Path,
    repeats: int,
    num_prompts: int,
    prompt_tokens: int,
    max_new_tokens: int,
    threads: int,
    profile: str,
) -> None:
    """Load every setting's engine from the demo directory `out`, measure, print one JSON line."""
    torch.set_num_threads(threads)
    target_dir = out / "target"
    prompts = heldout_prompts(target_dir, out / "data" / "heldout.txt", prompt_tokens)[:num_prompts]
    max_seq_len = max(map(len, prompts)) + max_new_tokens + 64  # as the demo sizes its engines
    engines = {
        name: load_engine(target_dir, out / "train" / "draft", spec, max_seq_len=max_seq_len)
        for name, spec in SETTINGS.items()
    }
    runs = measure(engines, prompts, max_new_tokens, repeats)
    print(
        json.dumps(
            {
                "torch": torch.__version__,
                "threads": threads,
                "repeats": repeats,
                "num_prompts": len(prompts),
                "max_new_tokens": max_new_tokens,
                "settings": summarize(runs),
            }
        )
    )
    if profile:
        profiler = cProfile.Profile()
        profiler.runcall(run_once, engines[profile], prompts, max_new_tokens)
        pstats.Stats(profiler, stream=sys.stderr).sort_stats("tottime").print_stats(30)


if __name__ == "__main__":
    typer.run(main)
