"""The transformers-backed engine target (`specdraft.engine.hf_target.HFTarget`) against
transformers' own `generate`, greedy, on pycode-25m's held-out prompts (a Llama target, so the
fast path would serve it: the transformers path is forced here to measure it).

Prints one JSON line per setting: decode tokens/s (after prefill, summed over the prompts) of
transformers `generate` ("hf_generate"), of plain decoding on the transformers path ("plain")
and of speculation on it with the committed drafter ("chain3"), with τ, the speedup over
"plain" and how many outputs equal `generate`'s. Goal: "plain" no slower per token than
"hf_generate". The GPU figures are not measured by this session; run it with --device cuda.

    python benchmarks/hf_target_speed.py --target ../shared/models/pycode-25m    # CPU, float32
    python benchmarks/hf_target_speed.py --tiny    # smoke test: stories260K + a seeded drafter

Measurements: benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
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
from specdraft.target import load_target

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
        out = model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)
        seconds += time.perf_counter() - start - prefill
        outputs.append(out[0, len(prompt):].tolist())
        tokens += new_tokens - 1
    return outputs, tokens / seconds


def run(target_dir: str, draft_dir: str, device: str, num_prompts: int, new_tokens: int) -> None:
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    tokenizer = Tokenizer.from_file(str(Path(target_dir) / "tokenizer.json"))
    with open(ASSETS / "prompts.jsonl") as f:
        prompts = [tokenizer.encode(json.loads(line)["text"]).ids[:64] for line in f][:num_prompts]
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
        print(json.dumps({name: {"tokens_per_s": round(tokens_per_s, 1), "tau": round(tau, 3),
                                 "speedup": round(tokens_per_s / plain_tps, 3),
                                 "per_token_vs_hf_generate": round(tokens_per_s / hf_tps, 3),
                                 "outputs_equal_hf_generate": sum(a == b for a, b in zip(outputs, reference))}}),
              flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", help="the pycode-25m directory (required without --tiny)")
    parser.add_argument("--draft", default=str(ASSETS / "draft"))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (both paths alike)")
    parser.add_argument("--tiny", action="store_true",
                        help="smoke test on the CPU: stories260K and a seeded drafter, 2 prompts x 8 tokens")
    args = parser.parse_args()
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


if __name__ == "__main__":
    main()
