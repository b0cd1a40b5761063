"""What the SGLang tier builds: `specdraft export --engine sglang` directories of seeded drafters
for tiny targets built in code, and specdraft's doctor verdict on a directory."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from specdraft.cli import app
from specdraft.export import export_draft
from tests.doctor_helpers import draft_checkpoint
from tests.sglang_tier.engine import VERSION

NUM_LAYERS = 5
AUX_LAYERS = (2, 3, 4)  # specdraft indices; SGLang ids [1, 2, 3] on every pinned version


@dataclass
class Export:
    """An SGLang export: its directory, the tiny target's directory, config.json and tensors."""

    path: Path
    target: Path
    config: dict
    tensors: dict[str, torch.Tensor]

    @property
    def embedding(self) -> torch.Tensor:
        """The target's input embedding [vocab, H] (SGLang's worker hands it to the drafter)."""
        return load_file(str(self.target / "model.safetensors"))["model.embed_tokens.weight"]


def read_export(path: Path, target: Path) -> Export:
    config = json.loads((path / "config.json").read_text())
    return Export(path, target, config, load_file(str(path / "model.safetensors")))


def sglang_export(root: Path, arch: str = "llama", dtype: str = "fp32", flags=None) -> Export:
    """A seeded drafter (norm flags `flags`) for a tiny `arch` target, exported for this SGLang."""
    draft, target = draft_checkpoint(
        root, arch=arch, num_layers=NUM_LAYERS, aux=AUX_LAYERS, draft_kw=flags
    )
    out = root / "sglang"
    export_draft(draft, out, engine="sglang", target=target, dtype=dtype, sglang_version=VERSION)
    return read_export(out, target)


def doctor(directory: Path, target: Path) -> dict[str, dict]:
    """`specdraft doctor DIR --engine sglang --sglang-version VERSION --target T --json`: the
    findings by check name (each with verdict, evidence, fix)."""
    args = ["doctor", str(directory), "--engine", "sglang", "--sglang-version", VERSION]
    result = CliRunner().invoke(app, [*args, "--target", str(target), "--json"])
    report = json.loads(result.stdout)
    return {f["check"]: f for f in report["findings"]}
