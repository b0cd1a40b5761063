"""Peak memory of reading and converting a drafter, against the size of its file.

Goal (issue #21): `specdraft inspect`, `convert` and `doctor` of a drafter cost at most ~1.5x
the drafter file's size above what the process holds after its imports. The drafter is built here
with random bf16 tensors of a Llama-3-8B drafter's shapes (hidden 4096, intermediate 14336,
32 heads / 8 KV heads, vocabulary 128256, draft vocabulary 32000: a 0.85 GB model.safetensors),
in the SGLang layout without a manifest, beside a target directory holding only its config.json
(32 layers). Each command runs in its own process; its peak RSS (ru_maxrss) less the peak of the
same process that only imports what the commands import is the command's cost (Linux: VmHWM).

    python benchmarks/drafter_memory.py            # the 0.85 GB drafter (needs ~4 GB free memory)
    python benchmarks/drafter_memory.py --tiny     # a tiny drafter, seconds (the smoke run)

Prints one line per command, then a JSON object: file_gb, and per command peak_gb (above the
imports) and ratio (peak / file size).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from transformers import LlamaConfig

from specdraft.checkpoint import official_config, state_dict_for_layout, write_safetensors
from specdraft.draft import Eagle3Draft
from specdraft.draft_config import DraftConfig

SHAPES = {
    "full": {
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": 128256,
        "draft_vocab_size": 32000,
    },
    "tiny": {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 512,
        "draft_vocab_size": 128,
    },
}
NUM_LAYERS = 32
# Runs one CLI command in this process and prints its peak RSS in bytes: VmHWM of /proc/self/status
# (KiB; ru_maxrss would carry the forking parent's RSS across exec).
RUNNER = """
import json, sys
from specdraft.cli import app
import specdraft.checkpoint, specdraft.doctor, specdraft.export, transformers, rich  # what the commands import
args = json.loads(sys.argv[1])
if args:
    try:
        app(args, standalone_mode=False)
    except SystemExit:
        pass
hwm = next(line for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print("PEAK", int(hwm.split()[1]) * 1024)
"""


def write_drafter(root: Path, shape: str) -> tuple[Path, Path]:
    """(drafter dir, target dir): random bf16 tensors of `shape`, SGLang layout, no manifest."""
    sizes = SHAPES[shape]
    target = LlamaConfig(
        num_hidden_layers=NUM_LAYERS,
        max_position_embeddings=8192,
        **{k: v for k, v in sizes.items() if k != "draft_vocab_size"},
    )
    (root / "target").mkdir()
    target.save_pretrained(root / "target")
    cfg = DraftConfig.from_target(
        target.to_dict(),
        [2, NUM_LAYERS // 2, NUM_LAYERS - 3],
        draft_vocab_size=sizes["draft_vocab_size"],
        target_num_layers=NUM_LAYERS,
    )
    with torch.device("meta"):
        names = state_dict_for_layout(Eagle3Draft(cfg), "sglang")
    generator = torch.Generator().manual_seed(0)
    tensors = {}
    for name, meta in names.items():
        if name == "d2t":
            tensors[name] = torch.zeros(meta.shape, dtype=torch.int64)
        elif name == "t2d":
            tensors[name] = torch.arange(meta.shape[0]) < cfg.draft_vocab_size
        else:
            tensors[name] = (torch.randn(meta.shape, generator=generator) * 0.02).to(torch.bfloat16)
    (root / "draft").mkdir()
    write_safetensors(tensors, root / "draft" / "model.safetensors", metadata={"format": "pt"})
    (root / "draft" / "config.json").write_text(
        json.dumps(official_config(cfg, torch.bfloat16), indent=2)
    )
    return root / "draft", root / "target"


def peak_bytes(args: list[str]) -> int:
    """Peak RSS of a fresh process running `specdraft ARGS` (after its imports)."""
    out = subprocess.run(
        [sys.executable, "-c", RUNNER, json.dumps(args)],
        check=True,
        capture_output=True,
        text=True,
        env=dict(os.environ),
    )
    return int(next(line for line in out.stdout.splitlines() if line.startswith("PEAK")).split()[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="a tiny drafter (the smoke run)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        draft, target = write_drafter(Path(tmp), "tiny" if args.tiny else "full")
        size = (draft / "model.safetensors").stat().st_size
        base = peak_bytes([])
        commands = {
            "inspect": ["inspect", str(draft), "--target", str(target)],
            "convert": [
                "convert",
                str(draft),
                str(Path(tmp) / "out"),
                "--layout",
                "speculators",
                "--target",
                str(target),
            ],
            "doctor": ["doctor", str(draft), "--target", str(target), "--engine", "vllm"],
        }
        result = {"file_gb": round(size / 1e9, 3), "imports_gb": round(base / 1e9, 3)}
        for name, command in commands.items():
            peak = max(0, peak_bytes(command) - base)
            result[name] = {"peak_gb": round(peak / 1e9, 3), "ratio": round(peak / size, 2)}
            print(
                f"{name}: {peak / 1e9:.2f} GB above the imports for a {size / 1e9:.2f} GB file "
                f"({peak / size:.2f}x)",
                flush=True,
            )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
