"""A DFlash drafter's config.json as each engine reads it: the target layers it captures, the
attention each draft layer runs, the speculative setting that serves the trained block. The rules
and their sources are `conventions.dflash.DFLASH_FACTS`; every function here takes the config as
a dict (z-lab's form, SpecForge's, or vLLM's translation of a speculators config) and reads only
what that engine reads.

Layers are specdraft indices (`specdraft.conventions`): DFlash id i = the output of decoder
layer i = specdraft index i + 1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specdraft.conventions.dflash import dflash_aux_layers, dflash_target_layer_ids

DFLASH_ENGINES = ("sglang", "vllm")
SLIDING = "sliding_attention"
DEFAULT_MASK_TOKEN = "<|MASK|>"  # SGLang's DEFAULT_DFLASH_MASK_TOKEN, z-lab's tokenizer addition


@dataclass(frozen=True)
class LayerAttention:
    """How one draft layer attends: window (None: the whole context) and causal (False: every
    block position sees every other, as DFlash trains)."""

    window: int | None
    causal: bool

    def describe(self) -> str:
        """ "full, bidirectional" / "sliding 2048, causal"."""
        span = "full" if self.window is None else f"sliding {self.window}"
        return f"{span}, {'causal' if self.causal else 'bidirectional'}"


TRAINED_ATTENTION = LayerAttention(window=None, causal=False)  # what specdraft's drafter computes


def nested(config: dict[str, Any], key: str) -> dict[str, Any]:
    """config[key] when it is a dict, else {} (what the engines do with a missing section)."""
    value = config.get(key)
    return value if isinstance(value, dict) else {}


def vllm_reading(config: dict[str, Any]) -> dict[str, Any]:
    """The config vLLM 0.32 builds from a speculators DFlash config (algos.update_dflash): the
    transformer_layer_config with the aux ids top-level, dflash_config.target_layer_ids = aux - 1
    and dflash_config.causal = not sliding_window_non_causal (default True), which
    `_dflash_layer_causal` applies to every layer. Any other config is returned as it is."""
    if config.get("speculators_model_type") != "dflash":
        return config
    aux = list(config.get("aux_hidden_state_layer_ids") or [])
    return {
        **config.get("transformer_layer_config", {}),
        "eagle_aux_hidden_state_layer_ids": aux,
        "dflash_config": {
            "mask_token_id": config.get("mask_token_id"),
            "target_layer_ids": [i - 1 for i in aux],
            "causal": not config.get("sliding_window_non_causal", True),
        },
    }


def engine_aux_layers(
    config: dict[str, Any], engine: str, target_num_layers: int | None = None
) -> tuple[int, ...] | None:
    """The specdraft indices `engine` captures for the drafter of `config` on a target of
    `target_num_layers` (None: the config's num_target_layers); None: the config names none and
    vLLM falls back to the target's own default. SGLang: dflash_config.target_layer_ids, else
    top-level target_layer_ids, else `dflash_target_layer_ids` of the runtime target's layer count
    (sglang 0.5.22 model_runner_components/spec_aux_hidden_state.py); each id + 1. vLLM: the top-level
    eagle_aux_hidden_state_layer_ids as-is, else dflash_config.target_layer_ids + 1, which a
    non-empty eagle_config replaces by its own list (vLLM 0.32's V1 runner)."""
    block = nested(config, "dflash_config")
    if engine == "sglang":
        ids = block.get("target_layer_ids", config.get("target_layer_ids"))
        if ids is None:
            draft_layers = int(config["num_hidden_layers"])
            target = target_num_layers or block.get(
                "num_target_layers", config.get("num_target_layers")
            )
            ids = dflash_target_layer_ids(int(target or draft_layers), draft_layers)
        return dflash_aux_layers([int(i) for i in ids])
    ids = config.get("eagle_aux_hidden_state_layer_ids")
    if not ids:
        ids = dflash_aux_layers(block.get("target_layer_ids") or []) if block else None
        if nested(config, "eagle_config"):  # replaces the dflash ids, even with no list
            ids = config["eagle_config"].get("eagle_aux_hidden_state_layer_ids")
    return tuple(int(i) for i in ids) if ids else None


def engine_attention(config: dict[str, Any], engine: str) -> list[LayerAttention]:
    """Each draft layer's attention as `engine` runs it. SGLang reads layer_types only
    (sliding_attention: window sliding_window, causal; anything else or none: full,
    bidirectional). vLLM: layer_types, dflash_config.use_swa (every layer sliding, window
    dflash_config.swa_window_size else sliding_window), and is_causal / dflash_config.causal
    over the default (causal exactly for sliding layers)."""
    num_layers = int(config["num_hidden_layers"])
    layer_types = config.get("layer_types") or None
    types = list(layer_types) if layer_types else ["full_attention"] * num_layers
    types = (types + ["full_attention"] * num_layers)[:num_layers]
    window = config.get("sliding_window")
    if engine == "sglang":
        return [LayerAttention(window, True) if t == SLIDING else TRAINED_ATTENTION for t in types]
    block = nested(config, "dflash_config")
    use_swa = bool(block.get("use_swa", False))
    if use_swa and SLIDING not in types:
        types = [SLIDING] * num_layers
    window = block.get("swa_window_size", window)
    forced = config.get("is_causal", block.get("causal"))
    return [
        LayerAttention(
            window if t == SLIDING else None, bool(forced) if forced is not None else t == SLIDING
        )
        for t in types
    ]


def engine_num_speculative_tokens(engine: str, block_size: int) -> int:
    """The engine's speculative setting that serves a block of `block_size` (anchor + drafts):
    SGLang's --speculative-num-draft-tokens is the block; vLLM's num_speculative_tokens counts
    the mask queries after the bonus token, block_size - 1."""
    return block_size if engine == "sglang" else block_size - 1


def config_block_size(config: dict[str, Any]) -> int:
    """The block SGLang 0.5.22 serves when --speculative-num-draft-tokens is unset:
    dflash_config.block_size, else the top-level block_size, else 16 (`DFLASH_FACTS`)."""
    block = nested(config, "dflash_config")
    return block.get("block_size", config.get("block_size", 16))


def served_block_size(engine: str, num_speculative_tokens: int) -> int:
    """The block an engine runs under its setting (`engine_num_speculative_tokens`'s inverse)."""
    return num_speculative_tokens if engine == "sglang" else num_speculative_tokens + 1


def trained_attention(config: dict[str, Any]) -> list[LayerAttention]:
    """Each draft layer's attention as the reference trainers build it from the config:
    transformers' Qwen3Config layer types (layer_types, else sliding_attention for layers >=
    max_window_layers when use_sliding_window), full layers bidirectional, sliding layers causal
    (speculators': bidirectional when sliding_window_non_causal; z-lab's and SpecForge's: causal,
    as both engines run them). specdraft's own drafter: every layer full, bidirectional."""
    layer = config.get("transformer_layer_config")
    speculators = isinstance(layer, dict) and config.get("speculators_model_type") == "dflash"
    base = layer if speculators else config
    num_layers = int(base["num_hidden_layers"])
    types = base.get("layer_types")
    if not types:
        first_sliding = int(base.get("max_window_layers", num_layers))
        sliding = bool(base.get("use_sliding_window"))
        types = [SLIDING if sliding and i >= first_sliding else "full" for i in range(num_layers)]
    causal = not config.get("sliding_window_non_causal", False) if speculators else True
    window = base.get("sliding_window")
    return [LayerAttention(window, causal) if t == SLIDING else TRAINED_ATTENTION for t in types]


def mask_token_conflict(config: dict[str, Any], vocab: dict[str, int]) -> tuple[str, int] | None:
    """(text, id) when the tokenizer vocabulary `vocab` holds the mask token's text
    (dflash_config.mask_token, default DEFAULT_MASK_TOKEN) at another id than the config's
    mask_token_id: SGLang 0.5.22 refuses to start (dflash_worker_v2.py _resolve_mask_token_id);
    None otherwise."""
    block = nested(config, "dflash_config")
    mask = block.get("mask_token_id", config.get("mask_token_id"))
    text = mask_token_text(config)
    found = vocab.get(text)
    return (text, found) if found is not None and mask is not None and found != mask else None


def mask_token_text(config: dict[str, Any]) -> str:
    """The mask token's text SGLang resolves: dflash_config.mask_token, else the top-level
    mask_token, else DEFAULT_MASK_TOKEN (dflash_utils.parse_dflash_draft_config)."""
    block = nested(config, "dflash_config")
    return block.get("mask_token") or config.get("mask_token") or DEFAULT_MASK_TOKEN
