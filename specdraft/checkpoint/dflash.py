"""Writing a DFlash drafter in the specdraft layout: model.safetensors under z-lab's / SGLang's
tensor names, config.json in z-lab's form (a Qwen3 config with a `dflash_config`), and the manifest
(`conventions.dflash.DFLASH_FACTS` for the keys and their sources). Engine exports come later.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from specdraft.checkpoint.layouts import MANIFEST_FILE, WEIGHTS_FILE
from specdraft.checkpoint.manifest import Manifest
from specdraft.checkpoint.save import check_output_dir
from specdraft.checkpoint.weights import write_safetensors
from specdraft.dflash import DFLASH_ARCHITECTURE, DFlashConfig, DFlashDraft
from specdraft.files import atomic_dir


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
