"""A DFlash drafter on disk in the specdraft layout: model.safetensors under z-lab's / SGLang's
tensor names, config.json in z-lab's form (a Qwen3 config with a `dflash_config`), and the manifest
(`conventions.dflash.DFLASH_FACTS` for the keys and their sources). `save_dflash_draft` writes one,
`load_dflash_draft` reads one strictly, in any published form (`dflash_forms`) or a DFlash run's
training checkpoint (`is_dflash_drafter`; the target's
embedding and lm_head are loaded apart: `DFlashDraft.load_target_head`). Engine exports:
`export.dflash`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from specdraft.checkpoint.dflash_forms import dflash_form, read_dflash_config, weights_kind
from specdraft.checkpoint.dirs import is_training_checkpoint, read_config
from specdraft.checkpoint.layouts import MANIFEST_FILE, WEIGHTS_FILE, CheckpointError
from specdraft.checkpoint.manifest import Manifest
from specdraft.checkpoint.save import check_output_dir
from specdraft.checkpoint.training import load_dflash_training_checkpoint, training_method
from specdraft.checkpoint.weights import REEXPORT_FIX, read_weights, write_safetensors
from specdraft.dflash import DFLASH_ARCHITECTURE, DFlashConfig, DFlashDraft
from specdraft.files import atomic_dir


def dflash_config_json(cfg: DFlashConfig) -> dict[str, Any]:
    """config.json of a DFlash drafter, z-lab's form: Qwen3 sizes, `num_target_layers`,
    `block_size` and `dflash_config` {block_size (where SGLang reads it first), mask_token_id,
    target_layer_ids (0-based)}, every layer full attention (`layer_types`)."""
    return {
        "architectures": [DFLASH_ARCHITECTURE],
        "model_type": "qwen3",
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_hidden_layers,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "vocab_size": cfg.vocab_size,
        "max_position_embeddings": cfg.max_position_embeddings,
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta,
        "rope_scaling": cfg.rope_scaling,
        "attention_bias": False,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "layer_types": ["full_attention"] * cfg.num_hidden_layers,
        "num_target_layers": cfg.target_num_layers,
        "block_size": cfg.block_size,  # where z-lab's and SpecForge's models read it
        "dflash_config": {
            "block_size": cfg.block_size,
            "mask_token_id": cfg.mask_token_id,
            "target_layer_ids": list(cfg.target_layer_ids),
        },
    }


def is_dflash_dir(path: Path) -> bool:
    """Whether `path` holds a DFlash drafter: weights, and a config.json in one of
    `dflash_forms.FORMS`."""
    try:
        config = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return dflash_form(config) is not None and (Path(path) / WEIGHTS_FILE).is_file()


def records_dflash(path: Path) -> bool:
    """Whether the directory's manifest records a DFlash training run (extra.method "dflash"),
    whatever its config.json says; False without a readable manifest."""
    try:
        data = json.loads((Path(path) / MANIFEST_FILE).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and (data.get("extra") or {}).get("method") == "dflash"


def is_dflash_drafter(path: str | Path) -> bool:
    """Whether `path` is a DFlash drafter that `load_dflash_draft` reads: a drafter directory
    (`is_dflash_dir`) or a `--method dflash` run's training checkpoint (RUN/checkpoints/step-N.pt
    or a sharded step-N directory: `training.training_method`)."""
    return is_dflash_dir(Path(path)) or training_method(path) == "dflash"


def save_dflash_draft(draft: DFlashDraft, out_dir: str | Path, manifest: Manifest) -> Path:
    """Write `draft` (its own tensors only: the embedding and lm_head are the target's) with
    `manifest` under out_dir, atomically, replacing an earlier DFlash drafter there. Raises
    CheckpointError as `check_output_dir` for anything else there."""
    out_dir = Path(out_dir).resolve()
    if not is_dflash_dir(out_dir):
        out_dir = check_output_dir(out_dir)
    tensors = {k: v.detach().contiguous().cpu() for k, v in draft.state_dict().items()}
    with atomic_dir(out_dir) as tmp:
        write_safetensors(tensors, tmp / WEIGHTS_FILE, metadata={"format": "pt"})
        config = dflash_config_json(draft.cfg)
        (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
        (tmp / MANIFEST_FILE).write_text(manifest.to_json())
    return out_dir


def load_dflash_draft(
    path: str | Path,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
    target_num_layers: int | None = None,
) -> tuple[DFlashDraft, Manifest | None]:
    """(model, manifest or None) of the DFlash drafter directory `path` (`is_dflash_dir`: any of
    `dflash_forms.FORMS`), loaded strictly: a file tensor that names no parameter, a parameter no
    tensor fills, or a shape that differs is a CheckpointError naming them and the file, as are
    EAGLE-3 tensors under a DFlash config (`weights_kind`). `target_num_layers` (else the
    manifest's) reads a form that does not record it. The model holds no target head yet: call
    `load_target_head` before its first forward. A training checkpoint (`is_training_checkpoint`)
    is read by `training.load_dflash_training_checkpoint`, the manifest it carries recording its
    step."""
    path = Path(path)
    if is_training_checkpoint(path):
        model, manifest = load_dflash_training_checkpoint(path)
        return model.to(device=device, dtype=dtype), manifest
    cfg, manifest = read_dflash_dir_config(path, target_num_layers)
    model = DFlashDraft(cfg)
    tensors, files = read_weights(path)
    if weights_kind(tensors) == "eagle3":
        raise CheckpointError(
            f"{files.entry}: EAGLE-3 tensors ({', '.join(sorted(tensors)[:4])}, ...) under a "
            f"DFlash config ({path / 'config.json'}); {REEXPORT_FIX} with the config of its kind"
        )
    _check_tensors(model.state_dict(), tensors, files.entry)
    model.load_state_dict(tensors)
    return model.to(device=device, dtype=dtype), manifest


def read_dflash_dir_config(
    path: Path, target_num_layers: int | None = None
) -> tuple[DFlashConfig, Manifest | None]:
    """(config, manifest or None) of the DFlash drafter directory `path`: config.json read by
    `dflash_forms.read_dflash_config` (`target_num_layers`, else the manifest's, for a form that
    does not record it) and checked against the manifest's training record
    (`check_trained_block`). Raises CheckpointError as those do."""
    manifest_file = path / MANIFEST_FILE
    manifest = Manifest.read(manifest_file, dflash=True) if manifest_file.exists() else None
    if target_num_layers is None and manifest is not None:
        target_num_layers = manifest.target.get("num_layers")
    cfg = read_dflash_config(read_config(path), path / "config.json", target_num_layers)
    check_trained_block(cfg, manifest, path / "config.json")
    return cfg, manifest


def trained_block(manifest: Manifest | None) -> int | None:
    """The block size the drafter was trained on, as its manifest records it (`draft.block_size`);
    None without a manifest or a record."""
    return (manifest.draft or {}).get("block_size") if manifest is not None else None


def check_trained_block(cfg: DFlashConfig, manifest: Manifest | None, config_file: Path) -> None:
    """CheckpointError naming `config_file` when its block size or mask token id is not the one
    the manifest records training with: a config edited to another block or mask loads (no
    tensor's shape depends on either) but every engine would draft blocks never trained, or
    fill them with another token's embedding."""
    trained = trained_block(manifest)
    reexport = (
        "or re-export it from its training run (specdraft export RUN/draft OUT --engine ENGINE)"
    )
    if trained is not None and trained != cfg.block_size:
        raise CheckpointError(
            f"{config_file}: block_size {cfg.block_size}, but the drafter was trained on blocks "
            f"of {trained} ({MANIFEST_FILE}); write block_size {trained} (top-level and "
            f"dflash_config.block_size) in config.json, {reexport}"
        )
    mask = (manifest.draft or {}).get("mask_token_id") if manifest is not None else None
    if mask is not None and mask != cfg.mask_token_id:
        raise CheckpointError(
            f"{config_file}: mask_token_id {cfg.mask_token_id}, but the drafter was trained with "
            f"mask token {mask} ({MANIFEST_FILE}); write dflash_config.mask_token_id {mask} in "
            f"config.json, {reexport}"
        )


def _check_tensors(expected: dict, tensors: dict, file: Path) -> None:
    """CheckpointError naming `file` and every tensor of `tensors` that names no parameter of
    `expected`, parameter none fills, and shape that differs."""
    unknown = sorted(set(tensors) - set(expected))
    unfilled = sorted(set(expected) - set(tensors))
    shapes = [
        f"{k} {tuple(tensors[k].shape)} != {tuple(v.shape)}"
        for k, v in expected.items()
        if k in tensors and tensors[k].shape != v.shape
    ]
    fc, want = tensors.get("fc.weight"), expected["fc.weight"]
    layers = (
        f" (fc.weight reads {fc.shape[1] // want.shape[0]} target layers' states, the config "
        f"names {want.shape[1] // want.shape[0]} in dflash_config.target_layer_ids)"
        if fc is not None and fc.dim() == 2 and fc.shape[1] != want.shape[1]
        else ""
    )
    problems = [
        f"tensors matching no parameter: {', '.join(unknown[:8])}" if unknown else "",
        f"parameters no tensor fills: {', '.join(unfilled[:8])}" if unfilled else "",
        f"shapes: {'; '.join(shapes[:8])}{layers}" if shapes else "",
    ]
    if any(problems):
        found = "; ".join(p for p in problems if p)
        raise CheckpointError(
            f"{file}: not the DFlash drafter its config.json describes ({found}); {REEXPORT_FIX}"
        )
