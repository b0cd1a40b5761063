"""The config.json keys a drafter may hold: the ones specdraft reads, the ones known harmless,
and the rule for the others.

Every engine ignores a config key it does not read. The rule (`sort_config_keys`): a key an
engine reads that specdraft's drafter does not compute as the engine does
(`conventions.config_reads`: quantization_config, a value other than the harmless ones), or a
likely misspelling of a known key (closest-match, difflib), is a CheckpointError naming the keys
and the fix (`refuse_unknown_keys`; `specdraft inspect CKPT --known-keys` prints the lists); any
other key no engine reads is ignored, as the engines ignore it, and named in one line
(`ignored_keys_note`). A flag of an EAGLE-3 variant specdraft does not implement is refused by
its own rule (`refuse_unimplemented_flags`, `refuse_sliding_window`).

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
from specdraft.conventions.config_reads import (
    ENGINE_READ_REFUSED,
    ENGINE_READ_VALUES,
    NUM_AUX_KEY,
    PUBLISHED_IGNORED_KEYS,
)
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
    NUM_AUX_KEY,
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
# Keys harmless only at these values (what the drafter specdraft implements computes), the keys
# an engine reads of the drafter included (`conventions.config_reads.ENGINE_READ_VALUES`); any
# other value is refused.
HARMLESS_VALUES: dict[str, tuple[Any, ...]] = {
    "hidden_act": ("silu",),
    "attention_dropout": (0, 0.0, None),
    "pretraining_tp": (1, None),
    "use_sliding_window": (False, None),
    **ENGINE_READ_VALUES,
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
    and eagle_config) that the rule refuses (`sort_config_keys`), as "where.key = value",
    followed by what is known of the key: the values it is harmless at, else the closest known
    key where one is close (difflib), e.g. "rope_thetta = 1e6 (closest known key: rope_theta)"."""
    return sort_config_keys(config, variant_keys)[0]


def ignored_config_keys(config: dict[str, Any]) -> list[str]:
    """The keys of a drafter's config.json that no engine reads and specdraft ignores as they
    do (`sort_config_keys`), as "where.key"."""
    return sort_config_keys(config, UNIMPLEMENTED_FLAGS)[1]


def sort_config_keys(
    config: dict[str, Any], variant_keys: tuple[str, ...] = ()
) -> tuple[list[str], list[str]]:
    """(refused entries, ignored keys) of a drafter's config.json: the keys neither read, known
    harmless nor `variant_keys` / VARIANT_KEYS (judged elsewhere), sorted by the module's rule;
    eagle_config keys (ModelOpt's architecture switches) outside EAGLE_CONFIG_VALUES are refused."""
    skip = set(variant_keys) | set(VARIANT_KEYS)
    refused, ignored = _unknown(config, "", skip)
    layer = config.get("transformer_layer_config")
    if isinstance(layer, dict):
        more, more_ignored = _unknown(layer, "transformer_layer_config.", skip)
        refused, ignored = refused + more, ignored + more_ignored
    for where, nested in (
        ("eagle_config.", config.get("eagle_config")),
        (
            "transformer_layer_config.eagle_config.",
            layer.get("eagle_config") if isinstance(layer, dict) else None,
        ),
    ):
        if isinstance(nested, dict):
            refused += [
                _entry(where, k, v, EAGLE_CONFIG_VALUES)
                for k, v in nested.items()
                if k not in EAGLE_CONFIG_VALUES or not _allowed(v, EAGLE_CONFIG_VALUES[k])
            ]
    return refused, ignored


def _unknown(config: dict[str, Any], where: str, skip: set[str]) -> tuple[list[str], list[str]]:
    """(refused entries, ignored "where.key") among `config`'s keys outside the known ones."""
    known = set(READ_KEYS) | set(HARMLESS_KEYS) | skip
    names = sorted(known | set(HARMLESS_VALUES) | {"layer_types"})
    refused, ignored = [], []
    for k, v in config.items():
        if (
            k in known
            or (k in HARMLESS_VALUES and _allowed(v, HARMLESS_VALUES[k]))
            or (k == "layer_types" and isinstance(v, list) and set(v) <= {"full_attention"})
        ):
            continue
        if (
            k in HARMLESS_VALUES
            or k in ENGINE_READ_REFUSED
            or (k not in PUBLISHED_IGNORED_KEYS and closest_name(k, names))
        ):
            refused.append(_entry(where, k, v, HARMLESS_VALUES, names))
        else:
            ignored.append(where + k)
    return refused, ignored


def ignored_keys_note(config: dict[str, Any]) -> str | None:
    """The one line naming the config.json keys no engine reads, which specdraft ignores too
    (`ignored_config_keys`); None when there are none."""
    ignored = ignored_config_keys(config)
    if not ignored:
        return None
    return (
        f"config.json keys no engine reads, ignored (as SGLang and vLLM ignore them): "
        f"{', '.join(ignored)}"
    )


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
        f"refused at any value (an engine reads it): {', '.join(ENGINE_READ_REFUSED)}; any other "
        "key no engine reads is ignored, one close to a known key refused as a misspelling",
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
    """The one rule for the rest of config.json: a key the module's rule refuses (an engine reads
    it and specdraft's drafter would compute otherwise, or a likely misspelling of a known key)
    is a CheckpointError naming the file, the keys with their values (and the closest known
    key), the fix and the command that lists the known keys."""
    unknown = unknown_config_keys(config, UNIMPLEMENTED_FLAGS)
    if unknown:
        what = "a key" if len(unknown) == 1 else f"{len(unknown)} keys"
        raise CheckpointError(
            f"{path}/config.json: {what} specdraft does not read and does not know "
            f"to be harmless: {'; '.join(unknown)}; {UNKNOWN_KEYS_FIX} "
            f"(`specdraft inspect {path} --known-keys` lists the keys known)"
        )
