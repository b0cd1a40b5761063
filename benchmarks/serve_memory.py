"""A continuously batching `specdraft serve` under constant load: its RSS over time (issue #37).

Serves a target and drafter (`--tiny`: stories260K and an untrained drafter, `tiny_pair`) with
`--max-num-seqs` rows on loopback, `--concurrency` clients sending greedy completions (half of
them streamed) back to back for `--seconds`, and prints the process's RSS (MiB) and the requests
served every `--every` seconds, then a JSON line (the RSS samples, requests, /health). Memory is flat when RSS stops growing after the
first interval (allocator and import warm-up) while the requests keep coming.

    python benchmarks/serve_memory.py --tiny --seconds 120 --concurrency 32
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

import httpx
import torch

from benchmarks.tiny_pair import tiny_demo_dir
from specdraft.engine.spec_config import SpecConfig
from specdraft.serve.server import build_app, serve_in_thread

PROMPTS = ("Once upon a time", "The little dog", "Lily and Tom went", "One day, a bird")


def rss_mib() -> float:
    """This process's resident set (/proc/self/status VmRSS), MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def load(url: str, args: argparse.Namespace) -> list[tuple[float, int, float]]:
    """`args.concurrency` clients back to back until args.seconds pass; RSS every args.every:
    the (seconds, requests served, RSS MiB) samples, the last one at the end."""
    served, start, samples = [0], time.monotonic(), []
    stop = start + args.seconds

    async def client(c: httpx.AsyncClient, i: int) -> None:
        while time.monotonic() < stop:
            body = {"prompt": PROMPTS[i % len(PROMPTS)], "temperature": 0, "max_tokens": 24}
            response = await c.post("/v1/completions", json={**body, "stream": i % 2 == 0})
            response.raise_for_status()
            served[0] += 1

    def sample() -> None:
        samples.append((round(time.monotonic() - start, 1), served[0], round(rss_mib(), 1)))
        t, n, rss = samples[-1]
        print(f"t {t:6.0f} s  requests {n:6d}  rss {rss:.1f} MiB", flush=True)

    async def report() -> None:
        while time.monotonic() < stop:
            sample()
            await asyncio.sleep(args.every)

    limits = httpx.Limits(max_connections=args.concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as c:
        await asyncio.gather(report(), *(client(c, i) for i in range(args.concurrency)))
    sample()
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="stories260K + an untrained drafter")
    parser.add_argument("--target", default="", help="target directory (without --tiny)")
    parser.add_argument("--draft", default="", help="drafter directory (without --tiny)")
    parser.add_argument("--seconds", type=float, default=120)
    parser.add_argument("--every", type=float, default=20)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--max-num-seqs", type=int, default=32)
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        target, draft = args.target, args.draft
        if args.tiny:
            root = tiny_demo_dir(Path(tmp))
            target, draft = str(root / "target"), str(root / "train" / "draft")
        app = build_app(
            target, draft, SpecConfig.chain(3), max_seq_len=256, batching=(args.max_num_seqs, None)
        )
        with serve_in_thread(app) as server:
            samples = asyncio.run(load(server.url, args))
            health = httpx.get(server.url + "/health").json()
    print(json.dumps({"rss_mib": [s[2] for s in samples], "requests": samples[-1][1], **health}))


if __name__ == "__main__":
    main()
