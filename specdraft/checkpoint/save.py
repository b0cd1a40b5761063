"""Writing a drafter in one of the three layouts, atomically, and the one rule for where it may
be written (`check_output_dir`: never over the source, a file, or a directory of other files)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from specdraft.checkpoint.config_write import official_config, speculators_config
from specdraft.checkpoint.layouts import (
    MANIFEST_FILE,
    WEIGHTS_FILE,
    CheckpointError,
    check_layout,
    state_dict_for_layout,
)
from specdraft.checkpoint.load import detect_layout
from specdraft.checkpoint.manifest import Manifest
from specdraft.checkpoint.weights import WEIGHT_FILES, write_safetensors
from specdraft.conventions import AUX_KEY
from specdraft.draft import Eagle3Draft
from specdraft.errors import UnusableInput
from specdraft.files import atomic_dir


def save_draft(
    model: Eagle3Draft,
    out_dir: str | Path,
    *,
    layout: str = "specdraft",
    manifest: Manifest | None = None,
    verifier: str | None = None,
    verifier_architectures: list[str] | None = None,
    target_class: str | None = None,
    sglang_version: str | None = None,
    layer_names: str | None = None,
) -> Path:
    """Write `model` in `layout` under `out_dir`, atomically (temp dir, then rename).

    Writes model.safetensors and config.json, and specdraft_manifest.json when a manifest is
    given (required for the specdraft layout), except in the ``sglang`` layout: that is the plain
    official one, the specdraft layout minus the manifest. `verifier` and `verifier_architectures`
    are the speculators `verifier.name_or_path` and `verifier.architectures` (default: the target
    path and architecture the manifest records; [] when nothing records the architecture).
    `target_class` / `sglang_version` pick the engines' id rules (`config_write.official_config`;
    default: the class the manifest records, `Manifest.target_class`, else "llama"). `layer_names`: the decoder layer's
    names (`layouts.LAYER_NAMES`; default: the layout's own).
    Raises CheckpointError (a ValueError) for an unknown layout or layer names, a specdraft
    layout without manifest, or aux layers the ``sglang`` layout cannot record.
    """
    check_layout(layout)
    tensors = state_dict_for_layout(model, layout, layer_names)
    if layout == "specdraft" and manifest is None:
        raise CheckpointError(
            "the specdraft layout needs a manifest (what the drafter was trained on)"
        )
    out_dir = check_output_dir(out_dir)
    config = _layout_config(
        model, layout, manifest, verifier, verifier_architectures, target_class, sglang_version
    )
    with atomic_dir(out_dir) as tmp:
        write_safetensors(tensors, tmp / WEIGHTS_FILE, metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
        if manifest is not None and layout != "sglang":
            (tmp / MANIFEST_FILE).write_text(manifest.to_json())
    return out_dir


def _layout_config(
    model: Eagle3Draft,
    layout: str,
    manifest: Manifest | None,
    verifier: str | None,
    verifier_architectures: list[str] | None,
    target_class: str | None,
    sglang_version: str | None,
) -> dict[str, Any]:
    """`save_draft`'s config.json for `layout`, its defaults taken from what the manifest records;
    CheckpointError when the ``sglang`` layout (no manifest) cannot record the aux layers."""
    dtype = model.fc.weight.dtype
    recorded = (manifest.target if manifest is not None else None) or {}
    verifier = verifier if verifier is not None else recorded.get("name_or_path")
    if verifier_architectures is None:
        verifier_architectures = [recorded["architecture"]] if recorded.get("architecture") else []
    recorded_class = manifest.target_class() if manifest is not None else None
    target_class = target_class or recorded_class or "llama"
    if layout == "speculators":
        return speculators_config(
            model.cfg, dtype, verifier, verifier_architectures, target_class=target_class
        )
    config = official_config(model.cfg, dtype, target_class, sglang_version)
    if layout == "sglang" and AUX_KEY not in config and "eagle_config" not in config:
        raise CheckpointError(
            f"aux layers {list(model.cfg.aux_layers)}: no engine id list names them on "
            f"{target_class}-class targets{'' if sglang_version is None else ' in SGLang ' + sglang_version}"
            ", so the official layout (no manifest) cannot record them: pass --sglang-version, "
            "or keep the specdraft layout"
        )
    return config


def check_output_dir(out_dir: str | Path, source: str | Path | None = None) -> Path:
    """The absolute path of a drafter output directory, after refusing what writing there would
    destroy: the `source` being read, a file, or a directory holding anything but an EAGLE-3
    drafter (a new or empty directory, or an earlier drafter, is replaced atomically). Raises
    CheckpointError; UnusableInput for the `source` itself (a usage error: exit 2)."""
    out = Path(out_dir).resolve()
    if source is not None and out == Path(source).resolve():
        raise UnusableInput(
            f"{out_dir}: is the checkpoint being read; writing there would replace it: give "
            "another output directory"
        )
    if out.exists() and not out.is_dir():
        raise CheckpointError(
            f"{out_dir}: is a file; give a new directory (or a drafter directory to replace)"
        )
    if out.is_dir() and any(out.iterdir()):
        try:
            detect_layout(out)
        except CheckpointError:
            raise CheckpointError(
                f"{out_dir}: holds files that are not an EAGLE-3 drafter; it would be "
                "replaced as a whole: give a new or empty directory"
            ) from None
        if not any((out / name).is_file() for name in WEIGHT_FILES):
            raise CheckpointError(
                f"{out_dir}: a drafter config without weights ({', '.join(WEIGHT_FILES)}); "
                "give a new or empty directory"
            )
    return out
