"""The published forms of a DFlash drafter's config.json, read into one DFlashConfig
(`read_dflash_config`, which `checkpoint.dflash.load_dflash_draft` calls), and the kind of
drafter a weight file holds (`weights_kind`). Keys and sources: `conventions.dflash.DFLASH_FACTS`.

- ``dflash``: a Qwen3 config naming DFlashDraftModel with a `dflash_config` (z-lab's published
  drafters, e.g. Qwen3-8B-DFlash-b16, and SpecForge's `save_pretrained`: `block_size` and
  `num_target_layers` top-level, dflash_config {mask_token_id, target_layer_ids}; specdraft writes
  block_size in dflash_config too, where SGLang reads it first).
- ``speculators``: `speculators_model_type: "dflash"` (speculators' DFlashSpeculatorConfig):
  sizes under transformer_layer_config, `aux_hidden_state_layer_ids` in specdraft indices,
  `mask_token_id`, `block_size`, `draft_vocab_size`.

Every form stores the tensors under the same names (layers.{i}.*, fc, hidden_norm, norm). A key
that changes the network specdraft's drafter computes is refused in one line naming it; a key no
engine reads for DFlash (auto_map, dtype, bos_token_id, ...) is ignored.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from specdraft.checkpoint.layouts import DRAFTER_CONFIG_FIX, CheckpointError, TargetNeeded
from specdraft.dflash import DFLASH_ARCHITECTURE, DFlashConfig
from specdraft.draft_config import DraftError, rope_from_hf_config

FORMS = ("dflash", "speculators")
SPECULATORS_TYPE = "dflash"  # speculators_model_type of speculators' DFlash drafter

# config.json keys of the Qwen3 part, by DFlashConfig field.
CONFIG_FIELDS = {
    "hidden_size": "hidden_size",
    "intermediate_size": "intermediate_size",
    "num_hidden_layers": "num_hidden_layers",
    "num_attention_heads": "num_attention_heads",
    "num_key_value_heads": "num_key_value_heads",
    "head_dim": "head_dim",
    "vocab_size": "vocab_size",
    "max_position_embeddings": "max_position_embeddings",
    "rms_norm_eps": "rms_norm_eps",
}
# dflash_config / top-level keys SGLang 0.5.22 or vLLM 0.32 read that would run another network
# than specdraft's drafter, with the value that network has (dflash_utils.parse_dflash_draft_config,
# qwen3_dflash._resolve_layer_attention).
PLAIN_VALUES = {
    "projector_type": ("dflash", None),
    "conv_kernel_size": (0, None),
    "selector_rank": (0, None),
    "output_multiplier": (1, 1.0, None),
    "final_logit_softcapping": (0, 0.0, None),
    "attention_sink_bias": (False, None),
    "attention_value_scale": (None,),
    "sample_from_anchor": (False, None),
    "use_swa": (False, None),
    "causal": (False, None),
}
TOP_PLAIN_VALUES = {
    "attention_bias": (False, None),
    "hidden_act": ("silu", None),
    "is_causal": (False, None),
    "has_embed_tokens": (False, None),
    "quantization_config": (None,),
}
_DFLASH_LAYER = re.compile(r"layers\.\d+\.self_attn\.q_norm\.weight")


def dflash_form(config: Any) -> str | None:
    """The one of FORMS a parsed config.json is in, None for no DFlash drafter's."""
    if not isinstance(config, dict):
        return None
    if config.get("speculators_model_type") == SPECULATORS_TYPE:
        return "speculators"
    return "dflash" if config.get("architectures") == [DFLASH_ARCHITECTURE] else None


def weights_kind(names) -> str | None:
    """ "dflash" or "eagle3": which drafter's tensors the names are (a DFlash drafter: a top-level
    hidden_norm, per-head q_norm in numbered layers; EAGLE-3: midlayer.*, d2t / t2d, a
    hidden_norm inside the one layer); None when neither."""
    names = set(names)
    if "hidden_norm.weight" in names or any(_DFLASH_LAYER.fullmatch(n) for n in names):
        return "dflash"
    eagle = {"d2t", "t2d", "layers.0.hidden_norm.weight"}
    if names & eagle or any(n.startswith("midlayer.") for n in names):
        return "eagle3"
    return None


def read_dflash_config(
    config: dict[str, Any], where: str | Path, target_num_layers: int | None = None
) -> DFlashConfig:
    """The DFlashConfig of a config.json in either of FORMS; `target_num_layers` (the manifest's
    or the --target's) for a form that does not record it (speculators'). Raises CheckpointError
    naming `where` for another config, a missing key, a value DFlashConfig refuses, or a setting
    of a network this drafter does not compute (attention bias, a non-SiLU MLP, sliding-window or
    causal layers, a reduced draft vocabulary, the SGLang / vLLM DFlash variants' extras:
    PLAIN_VALUES); TargetNeeded when neither the file nor the caller gives the target's layers."""
    form = dflash_form(config)
    if form is None:
        raise CheckpointError(f"{where}: not a DFlash drafter's config; {DRAFTER_CONFIG_FIX}")
    if form == "speculators":
        config = _from_speculators(config, where)
    block = config.get("dflash_config")
    if not isinstance(block, dict):
        raise CheckpointError(f"{where}: no dflash_config object; {DRAFTER_CONFIG_FIX}")
    _refuse_other_networks(config, block, where)
    values = {
        "block_size": _block_size(config, block, where),
        "mask_token_id": block.get("mask_token_id", config.get("mask_token_id")),
        "target_layer_ids": block.get("target_layer_ids"),
    }  # SGLang's and vLLM's places of each (`DFLASH_FACTS`)
    missing = [k for k in CONFIG_FIELDS if k not in config]
    missing += [f"dflash_config.{k}" for k, v in values.items() if v is None]
    if missing:
        raise CheckpointError(f"{where}: keys {missing} missing; {DRAFTER_CONFIG_FIX}")
    layers = block.get("num_target_layers", config.get("num_target_layers", target_num_layers))
    if layers is None:
        raise TargetNeeded(
            f"{where}: the target's layer count is not in the file ({form} form); pass --target DIR"
        )
    theta, scaling = rope_from_hf_config(config.get)
    fields = {field: config[key] for key, field in CONFIG_FIELDS.items()}
    try:
        return DFlashConfig(
            **fields,
            **{**values, "target_layer_ids": tuple(values["target_layer_ids"])},
            target_num_layers=layers,
            rope_theta=theta,
            rope_scaling=scaling,
        )
    except (DraftError, TypeError) as e:
        raise CheckpointError(f"{where}: {e}") from e


def _block_size(config: dict[str, Any], block: dict[str, Any], where) -> int | None:
    """dflash_config.block_size (where SGLang reads it first), else the top-level block_size
    (z-lab's, SpecForge's); CheckpointError when both are there and differ."""
    nested, top = block.get("block_size"), config.get("block_size")
    if nested is not None and top is not None and nested != top:
        raise CheckpointError(
            f"{where}: dflash_config.block_size {nested} != block_size {top}; SGLang reads the "
            "first, z-lab's loader the second: make them equal (the block the drafter was trained on)"
        )
    return nested if nested is not None else top


def _refuse_other_networks(config: dict[str, Any], block: dict[str, Any], where) -> None:
    """CheckpointError naming every key set to a network other than specdraft's drafter."""
    bad = [f"dflash_config.{k}" for k, ok in PLAIN_VALUES.items() if block.get(k) not in ok]
    bad += [k for k, ok in TOP_PLAIN_VALUES.items() if config.get(k) not in ok]
    if config.get("use_sliding_window"):
        bad.append("use_sliding_window")
    layer_types = config.get("layer_types") or []
    others = [f"layer_types[{i}] {t!r}" for i, t in enumerate(layer_types) if t != "full_attention"]
    if others:
        bad.append(f"{', '.join(others[:8])} (every layer must be full_attention)")
    if bad:
        raise CheckpointError(
            f"{where}: {', '.join(bad)} set; specdraft's DFlash drafter computes full-attention, "
            "bidirectional layers with SiLU, no attention bias, the target's embedding and head"
        )


def _from_speculators(config: dict[str, Any], where) -> dict[str, Any]:
    """The dflash form of a speculators config, as vLLM 0.32 translates it (algos.update_dflash):
    transformer_layer_config's sizes, aux_hidden_state_layer_ids - 1 as target_layer_ids.
    CheckpointError for a missing key or a draft vocabulary smaller than the target's."""
    layer = config.get("transformer_layer_config")
    missing = [
        k
        for k in ("aux_hidden_state_layer_ids", "mask_token_id", "block_size")
        if config.get(k) is None
    ] + ([] if isinstance(layer, dict) else ["transformer_layer_config"])
    if missing:
        raise CheckpointError(f"{where}: keys {missing} missing; {DRAFTER_CONFIG_FIX}")
    vocab = config.get("draft_vocab_size")
    if vocab is not None and vocab != layer.get("vocab_size"):
        raise CheckpointError(
            f"{where}: draft_vocab_size {vocab} of {layer.get('vocab_size')}: a reduced draft "
            "vocabulary; specdraft's DFlash drafter drafts over the target's whole head"
        )
    ids = [int(i) - 1 for i in config["aux_hidden_state_layer_ids"]]
    return {
        **layer,
        "architectures": [DFLASH_ARCHITECTURE],
        "block_size": config["block_size"],
        "dflash_config": {
            "mask_token_id": config["mask_token_id"],
            "target_layer_ids": ids,
            "projector_type": config.get("projector_type"),
            "sample_from_anchor": config.get("sample_from_anchor"),
        },
    }
