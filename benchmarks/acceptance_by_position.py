"""Acceptance by position: each drafter's tau over the rounds that start at each range of context
positions, on short and long held-out prompts (EAGLE-3 against EAGLE-3.1, issue #38: the norms
are claimed to help most at late positions).

A round's position is the context it drafts after (prompt + tokens emitted before it); its
emitted tokens come from the engine's per-round stream (`Request.emit` calls `on_tokens` once a
round). The last round of each request is left out (`max_new_tokens` may cut it short). Greedy,
so tau does not depend on the machine: the shell of benchmarks/shell_target.py embeds the same
pair exactly and accepts the same tokens.

    python benchmarks/acceptance_by_position.py --target ../shared/models/pycode-25m \
        --draft eagle3=RUN3/draft --draft eagle3.1=RUN31/draft --device cuda --setting chain7
    python benchmarks/acceptance_by_position.py --tiny    # smoke test: stories260K, CPU

Prints a markdown table, then one JSON line. Measurements: benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import random
import site
import sysconfig
import tempfile
from pathlib import Path

import torch
from tiny_pair import tiny_demo_dir  # benchmarks/, the script's directory
from tokenizers import Tokenizer

from specdraft.engine.load import load_engine
from specdraft.engine.spec_config import SpecConfig

BUCKETS = (0, 128, 256, 512, 1024, 2048)  # context positions: [0, 128), [128, 256), ...
HELD_OUT_FILES = 256  # build.py holds out the last 4 x 64 site-packages files of its order


def held_out_texts(num: int, chars: int) -> list[str]:
    """`num` windows of `chars` characters from a random line start of the site-packages Python
    files tests/assets/pycode25m_draft/build.py holds out (its file order, seed 0), files of at
    least 2 x `chars` characters."""
    roots = sorted({sysconfig.get_paths()["purelib"], *site.getsitepackages()})
    files = sorted({f for root in roots for f in Path(root).rglob("*.py")})
    rng = random.Random(0)
    rng.shuffle(files)
    texts = []
    for path in files[-HELD_OUT_FILES:]:
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if len(text) < 2 * chars:
            continue
        starts = [0] + [i + 1 for i, c in enumerate(text[:-chars]) if c == "\n"]
        start = rng.choice(starts)
        texts.append(text[start : start + chars])
    return texts[:num]


def rounds_by_position(engine, prompts: list[list[int]], new_tokens: int) -> list[tuple[int, int]]:
    """(context position, tokens emitted) of every round but each request's last, greedy."""
    rounds: list[tuple[int, int]] = []
    for prompt in prompts:
        emitted: list[int] = []
        engine.generate(prompt, new_tokens, on_tokens=lambda ids, out=emitted: out.append(len(ids)))
        position = len(prompt) + emitted[0]  # after the prefill's token
        for n in emitted[1:-1]:
            rounds.append((position, n))
            position += n
    return rounds


def bucket_table(rounds: list[tuple[int, int]]) -> dict[str, dict]:
    """tau (tokens per round) and the round count of each `BUCKETS` range that has rounds."""
    table = {}
    for lo, hi in zip(BUCKETS, BUCKETS[1:]):
        counts = [n for position, n in rounds if lo <= position < hi]
        if counts:
            table[f"{lo}-{hi}"] = {"rounds": len(counts), "tau": sum(counts) / len(counts)}
    return table


def run(
    target: str,
    drafters: dict[str, str],
    prompts: list[list[int]],
    spec: SpecConfig,
    device: str,
    new_tokens: int,
) -> dict:
    """Every drafter over the same prompts; the report."""
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    longest = max(map(len, prompts)) + new_tokens + spec.num_draft_tokens + 1
    report = {}
    for name, draft in drafters.items():
        engine = load_engine(target, draft, spec, device=device, dtype=dtype, max_seq_len=longest)
        rounds = rounds_by_position(engine, prompts, new_tokens)
        tau = sum(n for _, n in rounds) / len(rounds)
        report[name] = {
            "tau": round(tau, 3),
            "rounds": len(rounds),
            "buckets": bucket_table(rounds),
        }
    return report


def print_table(report: dict) -> None:
    """One markdown row a bucket, a column a drafter: tau (rounds)."""
    names = list(report)
    buckets = sorted(
        {b for r in report.values() for b in r["buckets"]}, key=lambda b: int(b.split("-")[0])
    )
    print("| positions | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    for b in buckets:
        cells = []
        for name in names:
            cell = report[name]["buckets"].get(b)
            cells.append(f"{cell['tau']:.3f} ({cell['rounds']})" if cell else "-")
        print(f"| {b} | " + " | ".join(cells) + " |")
    print(
        "| all | "
        + " | ".join(f"{report[n]['tau']:.3f} ({report[n]['rounds']})" for n in names)
        + " |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", help="the target directory (required without --tiny)")
    parser.add_argument(
        "--draft", action="append", default=[], help="NAME=DIR, once per drafter (two or more)"
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--setting", default="chain7", help="chainK, or treeDxKxN (depth, topk, nodes)"
    )
    parser.add_argument("--prompt-tokens", default="64,768", help="prompt lengths, comma-separated")
    parser.add_argument("--prompts", type=int, default=16, help="prompts per length")
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--tiny", action="store_true", help="smoke test: stories260K on the CPU")
    args = parser.parse_args()
    spec = parse_setting(args.setting)
    if args.tiny:
        with tempfile.TemporaryDirectory(prefix="acceptance-by-position-") as tmp:
            root = tiny_demo_dir(Path(tmp))
            torch.set_num_threads(1)
            tokenizer = Tokenizer.from_file(str(root / "target" / "tokenizer.json"))
            text = (root / "data" / "heldout.txt").read_text()
            prompts = [tokenizer.encode(text).ids[:n] for n in (16, 48)]
            draft = str(root / "train" / "draft")
            report = run(str(root / "target"), {"a": draft, "b": draft}, prompts, spec, "cpu", 12)
    else:
        if args.target is None or len(args.draft) < 2:
            parser.error("--target and two or more --draft NAME=DIR are required (or --tiny)")
        drafters = dict(d.split("=", 1) for d in args.draft)
        tokenizer = Tokenizer.from_file(str(Path(args.target) / "tokenizer.json"))
        lengths = [int(n) for n in args.prompt_tokens.split(",")]
        texts = held_out_texts(args.prompts, chars=4 * max(lengths))
        prompts = [tokenizer.encode(t).ids[:n] for n in lengths for t in texts]
        report = run(args.target, drafters, prompts, spec, args.device, args.new_tokens)
    print_table(report)
    print(json.dumps({"setting": args.setting, "drafters": report}), flush=True)


def parse_setting(name: str) -> SpecConfig:
    """chainK -> a K-step chain; treeDxKxN -> SpecConfig(D, K, N)."""
    if name.startswith("chain"):
        return SpecConfig.chain(int(name[5:]))
    depth, topk, nodes = (int(x) for x in name[4:].split("x"))
    return SpecConfig(depth, topk, nodes)


if __name__ == "__main__":
    main()
