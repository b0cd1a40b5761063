"""A DFlash drafter on disk in the specdraft layout: model.safetensors under z-lab's / SGLang's
tensor names, config.json in z-lab's form (a Qwen3 config with a `dflash_config`), and the manifest
(`conventions.dflash.DFLASH_FACTS` for the keys and their sources). `save_dflash_draft` writes one,
`load_dflash_draft` reads one strictly (the target's embedding and lm_head are loaded apart:
`DFlashDraft.load_target_head`). Engine exports come later.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from specdraft.checkpoint.dirs import read_config
from specdraft.checkpoint.layouts import (
    DRAFTER_CONFIG_FIX,
    MANIFEST_FILE,
    WEIGHTS_FILE,
    CheckpointError,
)
from specdraft.checkpoint.manifest import Manifest
from specdraft.checkpoint.save import check_output_dir
from specdraft.checkpoint.weights import REEXPORT_FIX, read_weights, write_safetensors
from specdraft.dflash import DFLASH_ARCHITECTURE, DFlashConfig, DFlashDraft
from specdraft.draft_config import DraftError
from specdraft.files import atomic_dir

# config.json keys `dflash_config_json` writes (besides `dflash_config`), by DFlashConfig field;
# every other key of a published Qwen3 config is read only where it changes the network (below).
_CONFIG_FIELDS = {
    "hidden_size": "hidden_size",
    "intermediate_size": "intermediate_size",
    "num_hidden_layers": "num_hidden_layers",
    "num_attention_heads": "num_attention_heads",
    "num_key_value_heads": "num_key_value_heads",
    "head_dim": "head_dim",
    "vocab_size": "vocab_size",
    "max_position_embeddings": "max_position_embeddings",
    "rms_norm_eps": "rms_norm_eps",
    "rope_theta": "rope_theta",
    "rope_scaling": "rope_scaling",
    "num_target_layers": "target_num_layers",
}


def dflash_config_json(cfg: DFlashConfig) -> dict[str, Any]:
    """config.json of a DFlash drafter, z-lab's form: Qwen3 sizes, `num_target_layers`, and
    `dflash_config` {block_size, mask_token_id, target_layer_ids (0-based)}."""
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
        "num_target_layers": cfg.target_num_layers,
        "dflash_config": {
            "block_size": cfg.block_size,
            "mask_token_id": cfg.mask_token_id,
            "target_layer_ids": list(cfg.target_layer_ids),
        },
    }


def is_dflash_dir(path: Path) -> bool:
    """Whether `path` holds a DFlash drafter: weights, and a config.json naming
    DFLASH_ARCHITECTURE."""
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return False
    named = isinstance(config, dict) and config.get("architectures") == [DFLASH_ARCHITECTURE]
    return named and (path / WEIGHTS_FILE).is_file()


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


def dflash_config_from_json(config: dict[str, Any], where: str | Path) -> DFlashConfig:
    """The DFlashConfig of a config.json in z-lab's form (`dflash_config_json`'s inverse). Raises
    CheckpointError naming `where` for a missing key, a value DFlashConfig refuses, or a network
    this drafter does not compute: attention bias, an activation other than SiLU, sliding-window
    layers (SGLang runs `sliding_attention` layers causally, `DFLASH_FACTS`)."""
    block = config.get("dflash_config")
    if not isinstance(block, dict):
        raise CheckpointError(f"{where}: no dflash_config object; {DRAFTER_CONFIG_FIX}")
    missing = [k for k in _CONFIG_FIELDS if k not in config]
    missing += [f"dflash_config.{k}" for k in ("block_size", "mask_token_id") if k not in block]
    missing += [] if "target_layer_ids" in block else ["dflash_config.target_layer_ids"]
    if missing:
        raise CheckpointError(f"{where}: keys {missing} missing; {DRAFTER_CONFIG_FIX}")
    unsupported = {
        "attention_bias": config.get("attention_bias", False) is not False,
        "hidden_act": config.get("hidden_act", "silu") != "silu",
        "sliding_window": bool(config.get("use_sliding_window"))
        or "sliding_attention" in (config.get("layer_types") or []),
    }
    bad = [k for k, refused in unsupported.items() if refused]
    if bad:
        raise CheckpointError(
            f"{where}: {', '.join(bad)} set; specdraft's DFlash drafter computes full-attention "
            "layers with SiLU and no attention bias only"
        )
    values = {field: config[key] for key, field in _CONFIG_FIELDS.items()}
    try:
        return DFlashConfig(
            **values,
            block_size=block["block_size"],
            mask_token_id=block["mask_token_id"],
            target_layer_ids=tuple(block["target_layer_ids"]),
        )
    except (DraftError, TypeError) as e:
        raise CheckpointError(f"{where}: {e}") from e


def load_dflash_draft(
    path: str | Path, *, device: str | torch.device = "cpu", dtype: torch.dtype | None = None
) -> tuple[DFlashDraft, Manifest | None]:
    """(model, manifest or None) of the DFlash drafter directory `path` (`is_dflash_dir`), loaded
    strictly: a file tensor that names no parameter, a parameter no tensor fills, or a shape that
    differs is a CheckpointError naming them and the file. The model holds no target head yet:
    call `load_target_head` before its first forward."""
    path = Path(path)
    cfg = dflash_config_from_json(read_config(path), path / "config.json")
    manifest_file = path / MANIFEST_FILE
    manifest = Manifest.read(manifest_file, dflash=True) if manifest_file.exists() else None
    model = DFlashDraft(cfg)
    tensors, files = read_weights(path)
    expected = model.state_dict()
    unknown = sorted(set(tensors) - set(expected))
    unfilled = sorted(set(expected) - set(tensors))
    shapes = [
        f"{k} {tuple(tensors[k].shape)} != {tuple(v.shape)}"
        for k, v in expected.items()
        if k in tensors and tensors[k].shape != v.shape
    ]
    problems = [
        f"tensors matching no parameter: {', '.join(unknown[:8])}" if unknown else "",
        f"parameters no tensor fills: {', '.join(unfilled[:8])}" if unfilled else "",
        f"shapes: {'; '.join(shapes[:8])}" if shapes else "",
    ]
    if any(problems):
        found = "; ".join(p for p in problems if p)
        raise CheckpointError(
            f"{files.entry}: not the DFlash drafter its config.json describes "
            f"({found}); {REEXPORT_FIX}"
        )
    model.load_state_dict(tensors)
    return model.to(device=device, dtype=dtype), manifest
