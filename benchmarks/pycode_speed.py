"""Speculative decoding of a real target with a trained drafter: pycode-25m and the committed
drafter (`tests/assets/pycode25m_draft`), greedy, on its held-out prompts.

Prints one JSON line per setting: decode tokens/s (after prefill, summed over the prompts), τ,
speedup over plain decoding on the same engine, and how many outputs equal plain decoding's.
A 25M-parameter target is bound by the host on a GPU (a decode step's weights are read in
microseconds), so this measures the engine's loop: staging, launches, drafting, bookkeeping.
In bf16 the speculative outputs need not all be plain decoding's (a verify of T tokens and a
decode step round differently, and a near-tie can go either way); at float32 they are equal.

    python benchmarks/pycode_speed.py --target ../shared/models/pycode-25m --device cuda --compile
    python benchmarks/pycode_speed.py --target ../shared/models/pycode-25m    # CPU, float32
    python benchmarks/pycode_speed.py --tiny    # smoke test: stories260K + a seeded drafter, CPU

Measurements so far: benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

import torch
from tiny_pair import tiny_demo_dir  # benchmarks/, the script's directory
from tokenizers import Tokenizer

from specdraft.engine.load import load_engine
from specdraft.engine.spec_config import SpecConfig
from specdraft.engine.speculate import SpeculativeEngine

ASSETS = Path(__file__).resolve().parent.parent / "tests" / "assets" / "pycode25m_draft"
SETTINGS = {
    "plain": None,
    "chain3": SpecConfig.chain(3),
    "chain5": SpecConfig.chain(5),
    "tree4x2_8": SpecConfig(4, 2, 8),
    "tree5x4_16": SpecConfig(5, 4, 16),
}


def decode(
    engine: SpeculativeEngine, prompts: list[list[int]], new_tokens: int
) -> tuple[list[list[int]], float, float]:
    """Outputs, decode tokens/s (after each prefill) and mean τ over the prompts, greedy."""
    outputs, tokens, seconds, taus = [], 0, 0.0, []
    for prompt in prompts:
        result = engine.generate(prompt, new_tokens)
        m = result.metrics
        outputs.append(result.token_ids)
        tokens += len(result.token_ids) - 1
        seconds += m.time_total_s - m.time_prefill_s
        taus.append(m.accept_length)
    return outputs, tokens / seconds, statistics.mean(taus)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", help="the pycode-25m directory (required without --tiny)")
    parser.add_argument("--draft", default=str(ASSETS / "draft"))
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--compile", action="store_true", help="Triton kernels and CUDA graphs (CUDA)"
    )
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument(
        "--tiny",
        action="store_true",
        help="smoke test on the CPU: stories260K and a seeded drafter, 2 prompts x 8 tokens",
    )
    args = parser.parse_args()
    if not args.tiny:
        if args.target is None:
            parser.error("--target is required (or --tiny)")
        run(args.target, args.draft, args.device, args.compile, args.prompts, args.new_tokens)
        return
    with tempfile.TemporaryDirectory(prefix="pycode-speed-") as tmp:
        root = tiny_demo_dir(Path(tmp))
        torch.set_num_threads(1)  # tiny shapes: threads only fight each other
        run(str(root / "target"), str(root / "train" / "draft"), "cpu", False, 2, 8)


def run(
    target: str, draft: str, device: str, compile: bool, num_prompts: int, new_tokens: int
) -> None:
    """Every setting on the committed prompts; one JSON line per setting."""
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    tokenizer = Tokenizer.from_file(str(Path(target) / "tokenizer.json"))
    with open(ASSETS / "prompts.jsonl") as f:
        prompts = [tokenizer.encode(json.loads(line)["text"]).ids[:64] for line in f][:num_prompts]
    plain = None
    for name, spec in SETTINGS.items():
        engine = load_engine(
            target,
            draft if spec else None,
            spec,
            device=device,
            dtype=dtype,
            max_seq_len=512,
            compile=compile,
        )
        decode(engine, prompts[:2], 16)  # warm-up: compiles and captures
        outputs, tokens_per_s, tau = decode(engine, prompts, new_tokens)
        plain = plain or (outputs, tokens_per_s)
        print(
            json.dumps(
                {
                    name: {
                        "tokens_per_s": round(tokens_per_s, 1),
                        "tau": round(tau, 3),
                        "speedup": round(tokens_per_s / plain[1], 3),
                        "outputs_equal_plain": sum(a == b for a, b in zip(outputs, plain[0])),
                    }
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
