"""Speculative decoding of a real target with a trained drafter: pycode-25m and the committed
drafter (`tests/assets/pycode25m_draft`), greedy, on its held-out prompts.

Prints one JSON line per setting: decode tokens/s (after prefill, summed over the prompts), τ,
speedup over plain decoding on the same engine, and how many outputs equal plain decoding's.
A 25M-parameter target is bound by the host on a GPU (a decode step's weights are read in
microseconds), so this measures the engine's loop: staging, launches, drafting, bookkeeping.

    python benchmarks/pycode_speed.py --target ../shared/models/pycode-25m --device cuda --compile
    python benchmarks/pycode_speed.py --target ../shared/models/pycode-25m    # CPU, float32

Measured on an H200 (2026-12-01, torch 2.11, bf16, compile=True, 8 prompts x 128 tokens), two
runs of each, against the same engine with this session's changes switched off in the same
process (the whole-round draft graph `GraphedRound` and the run-ahead plain decode
`decode_ahead`; git-ignored `.carry/exp_pycode.py`), tokens/s:
plain 5710 / 5719 (off: 4040 / 3942); chain 3 4415 / 4378 (2551 / 2424), τ 2.49; chain 5 4291 /
4086 (2070 / 1882), τ 3.00; tree 4 x 2 / 8 2307 / 2321 (1235 / 1103), τ 3.01; tree 5 x 4 / 16
2109 / 2037 (1062 / 1073), τ 3.46. τ is the same with the changes on and off. This script, run
after them: plain 5653, chain 3 4273 (0.76x), chain 5 3721 (0.66x), tree 4 x 2 / 8 1827 (0.32x),
tree 5 x 4 / 16 1848 (0.33x): on a target this small speculation loses, since a round's drafting
and verification cost more host and launch time than the ~1.5-2.5 tokens it wins (the demo's
tuner and `bench` say the same of such pairings); 5-6 of 8 bf16 outputs equal plain's. In bf16 the
speculative outputs are not all plain decoding's: a verify of T tokens and a decode step round
differently (other kernels), and a near-tie can go either way; at float32 they are equal (the
lossless tests).
Session 9 (a graphed tree round selects its tree and writes the verify's inputs on the device),
A / B in one process against the tree read back and selected on the host (`.carry/exp_tree_ab.py`),
tokens/s: tree 4 x 2 / 8 1974 / 2000 against 1667 / 1673, tree 5 x 4 / 16 1719 / 1789 against 1413 /
1456, τ and outputs unchanged. Then a chain's verify mask built by a comparison instead of `tril`
(which split its rows across all 16 CPU threads of the H200's host: a chain of 3 ran at 243-1172
tokens/s in processes with 16 threads, at 3200-6700 with one; `tree.verify_mask`): 10 generations of
chain 3 at 3289-5917 tokens/s with 16 threads, and this script: plain 5331, chain 3 3627 (0.68x),
chain 5 3724 (0.70x), tree 4 x 2 / 8 2164 (0.41x), tree 5 x 4 / 16 2126 (0.40x), τ and outputs as
before.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch
from tokenizers import Tokenizer

from specdraft.engine.spec_config import SpecConfig
from specdraft.engine.load import load_engine
from specdraft.engine.speculate import SpeculativeEngine

ASSETS = Path(__file__).resolve().parent.parent / "tests" / "assets" / "pycode25m_draft"
SETTINGS = {"plain": None, "chain3": SpecConfig.chain(3), "chain5": SpecConfig.chain(5),
            "tree4x2_8": SpecConfig(4, 2, 8), "tree5x4_16": SpecConfig(5, 4, 16)}


def decode(engine: SpeculativeEngine, prompts: list[list[int]], new_tokens: int) -> tuple[list[list[int]], float, float]:
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
    parser.add_argument("--target", required=True, help="the pycode-25m directory")
    parser.add_argument("--draft", default=str(ASSETS / "draft"))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--compile", action="store_true", help="Triton kernels and CUDA graphs (CUDA)")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=128)
    args = parser.parse_args()
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    tokenizer = Tokenizer.from_file(str(Path(args.target) / "tokenizer.json"))
    with open(ASSETS / "prompts.jsonl") as f:
        prompts = [tokenizer.encode(json.loads(line)["text"]).ids[:64] for line in f][:args.prompts]
    plain = None
    for name, spec in SETTINGS.items():
        engine = load_engine(args.target, args.draft if spec else None, spec, device=args.device, dtype=dtype,
                             max_seq_len=512, compile=args.compile)
        decode(engine, prompts[:2], 16)  # warm-up: compiles and captures
        outputs, tokens_per_s, tau = decode(engine, prompts, args.new_tokens)
        plain = plain or (outputs, tokens_per_s)
        print(json.dumps({name: {"tokens_per_s": round(tokens_per_s, 1), "tau": round(tau, 3),
                                 "speedup": round(tokens_per_s / plain[1], 3),
                                 "outputs_equal_plain": sum(a == b for a, b in zip(outputs, plain[0]))}}),
              flush=True)


if __name__ == "__main__":
    main()
