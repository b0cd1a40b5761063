"""A tiny target and drafter on disk for the benchmarks' `--tiny` modes (CPU, seconds).

The target is the bundled stories260K (converted to a transformers Llama); the drafter is an
untrained EAGLE-3 layer seeded with `seed`, aux layers [2, 3, 4], full draft vocabulary, in
the specdraft layout with a manifest naming the target. Its drafts are rarely accepted (τ near
1): the tiny modes run the benchmarks' code paths, they measure nothing worth recording.

    root = tiny_demo_dir(Path(tmp))   # root/target, root/train/draft, root/data/heldout.txt

The layout is the demo's `--out` directory, so a benchmark that reads one reads this.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from specdraft.checkpoint import Manifest, save_draft
from specdraft.draft import Eagle3Draft
from specdraft.draft_config import DraftConfig
from specdraft.stories260k import SAMPLE_FILE, bundled_dir, convert_stories260k

AUX_LAYERS = (2, 3, 4)  # [2, L//2, L-3] collapses for stories260K's 5 layers (DESIGN.md §2)
HELDOUT_DOCS = 4


def tiny_demo_dir(root: Path, seed: int = 0) -> Path:
    """Write target/, train/draft/ and data/heldout.txt under `root`; return `root`."""
    target_dir = convert_stories260k(root / "target")
    config = json.loads((target_dir / "config.json").read_text())
    cfg = DraftConfig.from_target(config, AUX_LAYERS)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        draft = Eagle3Draft(cfg).eval()
    manifest = Manifest(
        draft=cfg.to_dict(),
        aux_layers=list(AUX_LAYERS),
        target={
            "hidden_size": config["hidden_size"],
            "num_layers": config["num_hidden_layers"],
            "vocab_size": config["vocab_size"],
            "name_or_path": "stories260K",
        },
    )
    save_draft(draft, root / "train" / "draft", manifest=manifest)
    docs = [d for d in (bundled_dir() / SAMPLE_FILE).read_text().split("\n\n") if d.strip()]
    (root / "data").mkdir(parents=True, exist_ok=True)
    (root / "data" / "heldout.txt").write_text("\n\n".join(docs[-HELDOUT_DOCS:]) + "\n")
    return root
