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
from specdraft.conventions.engines import FLAG_RULES
from specdraft.conventions.ids import parse_version
from specdraft.export import export_draft
from tests.sglang_tier.engine import VERSION
from tests.support.doctor_helpers import draft_checkpoint

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
    """A seeded drafter (norm flags `flags`) for a tiny `arch` target, exported for this SGLang.
    One that sets a flag this release does not read yet (FlagRule.since), which `export
    --sglang-version` refuses, is exported for the newest release instead: the tests then show
    what this one computes from such a file (the drafter without the flag)."""
    draft, target = draft_checkpoint(
        root, arch=arch, num_layers=NUM_LAYERS, aux=AUX_LAYERS, draft_kw=flags
    )
    out = root / "sglang"
    set_flags = {name for name, on in (flags or {}).items() if on}
    version = None if set_flags & late_flags() else VERSION
    export_draft(draft, out, engine="sglang", target=target, dtype=dtype, sglang_version=version)
    return read_export(out, target)


def late_flags() -> set[str]:
    """The norm flags SGLang reads only from a release after this one (FLAG_RULES' `since`)."""
    version = parse_version(VERSION)
    return {
        r.flag
        for r in FLAG_RULES
        if r.engine == "sglang" and r.since is not None and version < r.since
    }


def doctor(directory: Path, target: Path) -> dict[str, dict]:
    """`specdraft doctor DIR --engine sglang --sglang-version VERSION --target T --json`: the
    findings by check name (each with verdict, evidence, fix)."""
    args = ["doctor", str(directory), "--engine", "sglang", "--sglang-version", VERSION]
    result = CliRunner().invoke(app, [*args, "--target", str(target), "--json"])
    report = json.loads(result.stdout)
    return {f["check"]: f for f in report["findings"]}
