"""The transformers-backed engine target (`specdraft.engine.hf_target.HFTarget`) against
transformers' own `generate`, greedy, on pycode-25m's held-out prompts (a Llama target, so the
fast path would serve it: the transformers path is forced here to measure it).

Prints one JSON line per setting: decode tokens/s (after prefill, summed over the prompts) of
transformers `generate` ("hf_generate"), of plain decoding on the transformers path ("plain")
and of speculation on it with the committed drafter ("chain3"), with τ, the speedup over
"plain" and how many outputs equal `generate`'s. Goal: "plain" no slower per token than
"hf_generate" (H200 figures: benchmarks/RESULTS.md).

--host-costs times both per token in interleaved runs instead (one prompt, one CPU thread,
float32; one JSON line of per-token microseconds: median, min, max over the runs); without
--target on stories260K, whose compute is negligible: the host work per token.

    python benchmarks/hf_target_speed.py --target ../shared/models/pycode-25m    # CPU, float32
    python benchmarks/hf_target_speed.py --host-costs --repeats 7 --new-tokens 128    # stories260K
    python benchmarks/hf_target_speed.py --tiny    # smoke test: stories260K + a seeded drafter, both modes

Measurements: benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
from pycode_speed import ASSETS, decode  # benchmarks/, the script's directory
from tiny_pair import tiny_demo_dir
from tokenizers import Tokenizer

from specdraft.engine.hf_target import HFTarget
from specdraft.engine.load import load_paired_draft
from specdraft.engine.spec_config import SpecConfig
from specdraft.engine.speculate import SpeculativeEngine
from specdraft.stories260k import convert_stories260k
from specdraft.targets import load_target

MAX_SEQ = 512


@torch.inference_mode()
def hf_generate(model, prompts: list[list[int]], new_tokens: int) -> tuple[list[list[int]], float]:
    """Outputs and decode tokens/s of transformers' greedy `generate`: each prompt's time minus
    its prefill (one forward over the prompt, timed apart)."""
    outputs, tokens, seconds = [], 0, 0.0
    for prompt in prompts:
        ids = torch.tensor([prompt], device=model.device)
        start = time.perf_counter()
        model(input_ids=ids)
        prefill = time.perf_counter() - start
        start = time.perf_counter()
        out = model.generate(
            ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False
        )
        seconds += time.perf_counter() - start - prefill
        outputs.append(out[0, len(prompt) :].tolist())
        tokens += new_tokens - 1
    return outputs, tokens / seconds


def read_prompts(target_dir: str, num_prompts: int) -> list[list[int]]:
    """The first num_prompts held-out prompts, 64 tokens at most, in the target's tokenizer."""
    tokenizer = Tokenizer.from_file(str(Path(target_dir) / "tokenizer.json"))
    with open(ASSETS / "prompts.jsonl") as f:
        return [tokenizer.encode(json.loads(line)["text"]).ids[:64] for line in f][:num_prompts]


def host_costs(target_dir: str, repeats: int, new_tokens: int) -> None:
    """Per-token microseconds of `generate` and of plain decoding on the transformers path, one
    prompt, `repeats` interleaved runs of each after a warm-up; float32 on the CPU."""
    prompts = read_prompts(target_dir, 1)
    loaded = load_target(target_dir)
    engine = SpeculativeEngine(HFTarget(loaded), None, None, None, MAX_SEQ, "cpu")
    micros: dict[str, list[float]] = {"hf_generate": [], "plain": []}
    equal = 0
    for repeat in range(repeats + 1):
        reference, hf_tps = hf_generate(loaded.model, prompts, new_tokens)
        outputs, plain_tps, _ = decode(engine, prompts, new_tokens)
        if repeat:  # the first run of each warms up
            micros["hf_generate"].append(1e6 / hf_tps)
            micros["plain"].append(1e6 / plain_tps)
            equal += outputs == reference
    summary = {
        name: {
            "us_per_token_median": round(statistics.median(v), 1),
            "min": round(min(v), 1),
            "max": round(max(v), 1),
        }
        for name, v in micros.items()
    }
    summary["plain_over_hf_generate_median"] = round(
        statistics.median(micros["plain"]) / statistics.median(micros["hf_generate"]), 3
    )
    summary["outputs_equal_hf_generate"] = f"{equal}/{repeats}"
    print(json.dumps(summary), flush=True)


def run(target_dir: str, draft_dir: str, device: str, num_prompts: int, new_tokens: int) -> None:
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    prompts = read_prompts(target_dir, num_prompts)
    loaded = load_target(target_dir, dtype=dtype, device=device)
    target = HFTarget(loaded)
    hf_generate(loaded.model, prompts[:1], 4)  # warm-up
    reference, hf_tps = hf_generate(loaded.model, prompts, new_tokens)
    print(json.dumps({"hf_generate": {"tokens_per_s": round(hf_tps, 1)}}), flush=True)
    draft = load_paired_draft(draft_dir, target, target_dir, device, dtype).model
    plain_tps = None
    for name, spec in (("plain", None), ("chain3", SpecConfig.chain(3))):
        engine = SpeculativeEngine(target, draft if spec else None, spec, None, MAX_SEQ, device)
        decode(engine, prompts[:1], 4)  # warm-up
        outputs, tokens_per_s, tau = decode(engine, prompts, new_tokens)
        plain_tps = plain_tps or tokens_per_s
        print(
            json.dumps(
                {
                    name: {
                        "tokens_per_s": round(tokens_per_s, 1),
                        "tau": round(tau, 3),
                        "speedup": round(tokens_per_s / plain_tps, 3),
                        "per_token_vs_hf_generate": round(tokens_per_s / hf_tps, 3),
                        "outputs_equal_hf_generate": sum(
                            a == b for a, b in zip(outputs, reference)
                        ),
                    }
                }
            ),
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", help="the pycode-25m directory (required without --tiny)")
    parser.add_argument("--draft", default=str(ASSETS / "draft"))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument(
        "--threads", type=int, default=1, help="torch CPU threads (both paths alike)"
    )
    parser.add_argument(
        "--tiny",
        action="store_true",
        help="smoke test on the CPU: stories260K and a seeded drafter, 2 prompts x 8 tokens, "
        "then --host-costs' line for 1 run of 8 tokens",
    )
    parser.add_argument(
        "--host-costs",
        action="store_true",
        help="per-token microseconds of generate and plain decoding, interleaved runs on one "
        "CPU thread; stories260K without --target",
    )
    parser.add_argument("--repeats", type=int, default=5, help="--host-costs: timed runs of each")
    args = parser.parse_args()
    if args.host_costs:
        torch.set_num_threads(1)
        with tempfile.TemporaryDirectory(prefix="hf-target-host-") as tmp:
            target_dir = args.target or str(convert_stories260k(Path(tmp) / "target"))
            host_costs(target_dir, args.repeats, args.new_tokens)
        return
    if not args.tiny:
        if args.target is None:
            parser.error("--target is required (or --tiny)")
        torch.set_num_threads(args.threads)
        run(args.target, args.draft, args.device, args.prompts, args.new_tokens)
        return
    with tempfile.TemporaryDirectory(prefix="hf-target-speed-") as tmp:
        root = tiny_demo_dir(Path(tmp))
        torch.set_num_threads(1)
        run(str(root / "target"), str(root / "train" / "draft"), "cpu", 2, 8)
        host_costs(str(root / "target"), 1, 8)


if __name__ == "__main__":
    main()
