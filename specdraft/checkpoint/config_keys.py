"""The config.json keys a drafter may hold: the ones specdraft reads, and the ones known harmless.

Every engine ignores a config key it does not know, so a key that changes the network (a new
norm, an MoE layer, a quantization) but that specdraft does not read would be served, checked
and converted as a plain EAGLE-3 drafter without a word. Here any key outside these lists is a
CheckpointError naming the keys and the fix (`refuse_unknown_keys`; `specdraft inspect CKPT
--known-keys` prints the lists), as is a flag of an EAGLE-3 variant specdraft does not implement
(`refuse_unimplemented_flags`, `refuse_sliding_window`).

The lists are built from the drafter configs the field publishes, read for this:
SpecForge ``configs/*eagle3*.json`` (26 files at commit a6b6b02, 2026-08-08), speculators 0.9.0
(``models/eagle3/config.py`` Eagle3SpeculatorConfig, the converter and the saved
``transformer_layer_config``: a transformers LlamaConfig / Qwen3Config), EAGLE's
``eagle/traineagle3/config.json`` (SafeAILab/EAGLE 9666a81) and NVIDIA ModelOpt 0.47.0
(``torch/export/plugins/hf_spec_configs.py`` llama_eagle_template_config). Flags of EAGLE-3
variants (`UNIMPLEMENTED_FLAGS`, and the norm / sliding-window keys of `VARIANT_KEYS`) are
judged by their own rule, not by the lists.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from specdraft.checkpoint.layouts import CheckpointError
from specdraft.conventions.engines import SLIDING_LAYER_TYPE
from specdraft.errors import closest_name

# Config flags of EAGLE-3 variants that specdraft's drafter does not implement: if set, refuse.
UNIMPLEMENTED_FLAGS = ("embed_norm", "attention_bias", "mlp_bias")
# What to do about a config.json that sets one of UNIMPLEMENTED_FLAGS.
FLAGS_FIX = (
    "a drafter specdraft trained or exported never sets them: remove the flag (or write false) if "
    "the drafter was trained without it, else use the trainer that implements it"
)

# Keys specdraft reads to build the drafter or the engines' aux ids (draft_config.DraftConfig,
# config_read.config_from_files, conventions.aux_layers_from_config).
READ_KEYS = (
    "architectures",
    "model_type",
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
    "draft_vocab_size",
    "target_hidden_size",
    "rms_norm_eps",
    "max_position_embeddings",
    "rope_theta",
    "rope_scaling",
    "rope_parameters",
    "num_hidden_layers",
    "tie_word_embeddings",
    "eagle_config",
    "eagle_aux_hidden_state_layer_ids",
    "speculators_model_type",
    "speculators_version",
    "speculators_config",
    "transformer_layer_config",
)
# Keys that change nothing the drafter computes at inference (HF boilerplate, token ids, training
# settings, metadata): any value.
HARMLESS_KEYS = (
    "torch_dtype",
    "dtype",
    "transformers_version",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
    "use_cache",
    "initializer_range",
    "target_model_type",
    "embed_requires_grad",
    "_name_or_path",
    "decoder_sparse_step",
    "max_window_layers",
    # speculators 0.9.0's saved configs: {"": "config.Eagle3SpeculatorConfig"}, the config class
    # (config.py beside it) for transformers' remote code (speculators/config.py _auto_class)
    "auto_map",
)
# Keys harmless only at these values (what the drafter specdraft implements computes); any other
# value is refused as an unknown flag would be.
HARMLESS_VALUES: dict[str, tuple[Any, ...]] = {
    "hidden_act": ("silu",),
    "attention_dropout": (0, 0.0, None),
    "pretraining_tp": (1, None),
    "use_sliding_window": (False, None),
}
# Keys of EAGLE-3 variants judged by their own rule (`UNIMPLEMENTED_FLAGS` and the norm /
# sliding-window support that reads them), never by this one; the caller adds UNIMPLEMENTED_FLAGS.
VARIANT_KEYS = (
    "norm_before_residual",
    "norm_before_fc",
    "fc_norm",
    "norm_output",
    "use_aux_norm",
    "sliding_window",
)
# eagle_config keys: the aux ids SGLang reads, and ModelOpt's architecture switches at the values
# of the one-layer EAGLE-3 drafter (None: not set).
EAGLE_CONFIG_VALUES: dict[str, tuple[Any, ...] | None] = {
    "eagle_aux_hidden_state_layer_ids": None,  # any value: read and checked by conventions
    "use_aux_hidden_state": (True, False, None),  # false: judged by serve.engine_args.aux_capture
    "use_input_layernorm_in_first_layer": (True, None),
    "use_last_layernorm": (True, None),
    "use_mtp_layernorm": (False, None),
    "next_layer_regular": (True, None),
    "parallel_draft_step": (1, None),
    "parallel_draft_heads_num_layers": None,  # read only when parallel_draft_step > 1
    "norm_before_fc": (True, False, None),  # read first by config_read.norm_flags_of_config
}
MAX_VALUE_CHARS = 60  # an unknown key's value is cut past this in the refusal
UNKNOWN_KEYS_FIX = (
    "if the key does not change the network, remove it from config.json; else train and serve the "
    "drafter with the tool that implements it"
)


def unknown_config_keys(config: dict[str, Any], variant_keys: tuple[str, ...] = ()) -> list[str]:
    """The keys of a drafter's config.json (its top level, a speculators transformer_layer_config
    and eagle_config) that are neither read, known harmless nor `variant_keys` / VARIANT_KEYS
    (judged elsewhere), as "where.key = value", followed by what is known of the key: the values
    it is harmless at, else the closest known key where one is close (difflib), e.g.
    "rope_thetta = 1e6 (closest known key: rope_theta)"."""
    skip = set(variant_keys) | set(VARIANT_KEYS)
    found = _unknown(config, "", skip)
    layer = config.get("transformer_layer_config")
    if isinstance(layer, dict):
        found += _unknown(layer, "transformer_layer_config.", skip)
    for where, nested in (
        ("eagle_config.", config.get("eagle_config")),
        (
            "transformer_layer_config.eagle_config.",
            layer.get("eagle_config") if isinstance(layer, dict) else None,
        ),
    ):
        if isinstance(nested, dict):
            found += [
                _entry(where, k, v, EAGLE_CONFIG_VALUES)
                for k, v in nested.items()
                if k not in EAGLE_CONFIG_VALUES or not _allowed(v, EAGLE_CONFIG_VALUES[k])
            ]
    return found


def _unknown(config: dict[str, Any], where: str, skip: set[str]) -> list[str]:
    known = set(READ_KEYS) | set(HARMLESS_KEYS) | skip
    names = sorted(known | set(HARMLESS_VALUES) | {"layer_types"})
    return [
        _entry(where, k, v, HARMLESS_VALUES, names)
        for k, v in config.items()
        if k not in known
        and not (k in HARMLESS_VALUES and _allowed(v, HARMLESS_VALUES[k]))
        and not (k == "layer_types" and isinstance(v, list) and set(v) <= {"full_attention"})
    ]


def _entry(
    where: str,
    key: str,
    value: Any,
    valued: dict[str, tuple[Any, ...] | None],
    names: list[str] | None = None,
) -> str:
    """ "where.key = value" (a long value cut) and the values the key is harmless at, else the
    closest of `names` (default: `valued`'s keys) when one is close."""
    shown = (
        repr(value)
        if len(repr(value)) <= MAX_VALUE_CHARS
        else repr(value)[: MAX_VALUE_CHARS - 3] + "..."
    )
    if valued.get(key):
        hint = f" (harmless only as {' / '.join(repr(v) for v in valued[key])})"
    else:
        close = closest_name(key, names if names is not None else valued)
        hint = f" (closest known key: {close})" if close else ""
    return f"{where}{key} = {shown}{hint}"


def _allowed(value: Any, values: tuple[Any, ...] | None) -> bool:
    return (
        values is None
        or any(value == v and type(value) is type(v) for v in values)
        or (value is None and None in values)
    )


def known_keys_lines(variant_keys: tuple[str, ...] = ()) -> list[str]:
    """What `specdraft inspect CKPT --known-keys` prints: the keys read, the keys harmless at any
    value and at the values given, eagle_config's, and the flags judged by their own rule
    (VARIANT_KEYS and `variant_keys`), one group a line."""

    def valued(table: dict[str, tuple[Any, ...] | None]) -> str:
        return ", ".join(
            k if vals is None else f"{k} ({' / '.join(repr(v) for v in vals)})"
            for k, vals in table.items()
        )

    return [
        f"read: {', '.join(READ_KEYS)}",
        f"harmless at any value: {', '.join(HARMLESS_KEYS)}",
        f"harmless at these values: {valued(HARMLESS_VALUES)}, layer_types (all 'full_attention')",
        f"eagle_config: {valued(EAGLE_CONFIG_VALUES)}",
        f"flags judged by their own rule: {', '.join(VARIANT_KEYS + tuple(variant_keys))}",
    ]


def refuse_sliding_window(where: str, layer: dict[str, Any]) -> None:
    """A draft layer config whose layer_types[0] is "sliding_attention" (what speculators' trainer
    writes, window 2048) is a CheckpointError: vLLM and speculators then window the drafter's
    attention (`conventions.SLIDING_LAYER_TYPE`), which specdraft's drafter does not implement."""
    layer_types = layer.get("layer_types")
    if isinstance(layer_types, list) and layer_types and layer_types[0] == SLIDING_LAYER_TYPE:
        raise CheckpointError(
            f"{where}: layer_types [{SLIDING_LAYER_TYPE!r}] with sliding_window {layer.get('sliding_window')}: "
            "vLLM and speculators window this drafter's attention, specdraft's drafter attends over the whole "
            "context (no sliding window) and would compute another drafter for longer contexts; retrain with "
            "full attention (speculators' trainer: --full-attention-indices 0)"
        )


def unimplemented_flags(config: dict[str, Any]) -> dict[str, Any]:
    """The UNIMPLEMENTED_FLAGS a drafter's config.json sets (any value but false, null, 0 or
    empty), at the top or in a speculators transformer_layer_config, with their values."""
    layer = config.get("transformer_layer_config")
    layer = layer if isinstance(layer, dict) else {}
    return {
        k: config.get(k, layer.get(k)) for k in UNIMPLEMENTED_FLAGS if config.get(k) or layer.get(k)
    }


def refuse_unimplemented_flags(path: Path, config: dict[str, Any]) -> None:
    """The one rule every command loads a drafter by: a config.json that sets a flag specdraft's
    drafter does not implement is a CheckpointError naming the file, the flags and the fix (the
    engine would compute another network than the one specdraft trained and checks)."""
    flagged = unimplemented_flags(config)
    if flagged:
        named = ", ".join(f"{k}: {json.dumps(v)}" for k, v in flagged.items())
        raise CheckpointError(
            f"{path}/config.json: sets {named}, which specdraft's drafter does not implement "
            f"(it would compute another network than was trained); {FLAGS_FIX}"
        )


def refuse_unknown_keys(path: Path, config: dict[str, Any]) -> None:
    """The one rule for the rest of config.json: a key specdraft neither reads nor knows to be
    harmless (`config_keys`) is a CheckpointError naming the file, the keys with their values (and
    the closest known key), the fix and the command that lists the known keys (every engine would
    ignore such a key without a word)."""
    unknown = unknown_config_keys(config, UNIMPLEMENTED_FLAGS)
    if unknown:
        what = "a key" if len(unknown) == 1 else f"{len(unknown)} keys"
        raise CheckpointError(
            f"{path}/config.json: {what} specdraft does not read and does not know "
            f"to be harmless: {'; '.join(unknown)}; {UNKNOWN_KEYS_FIX} "
            f"(`specdraft inspect {path} --known-keys` lists the keys known)"
        )
