"""The DraftConfig a drafter's config.json (and manifest) declares, read as the engines read it.

`config_from_files` rebuilds it (from the manifest when there is one), after the refusals of
`config_keys` (flags specdraft does not implement, a sliding window, unknown keys); the norm
flags are read by `norm_flags_of_config`, the aux layers of a manifest-less file by
`aux_layers_of_config` (target class, SGLang version, --aux-layers). A config that cannot
rebuild the drafter is a CheckpointError naming the file.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from specdraft.checkpoint.config_keys import (
    refuse_sliding_window,
    refuse_unimplemented_flags,
    refuse_unknown_keys,
)
from specdraft.checkpoint.layouts import (
    DRAFTER_CONFIG_FIX,
    MANIFEST_FILE,
    CheckpointError,
    InvalidCheckpointFile,
    TargetNeeded,
)
from specdraft.checkpoint.manifest import Manifest
from specdraft.conventions import AUX_KEY, engines_default_layers, from_engine_ids
from specdraft.conventions.config_reads import NUM_AUX_KEY
from specdraft.draft_config import (
    NORM_FLAGS,
    SIZE_FIELDS,
    DraftConfig,
    DraftError,
    rope_from_hf_config,
)

# SGLang's legacy name of the fc_norm flag (sglang 0.5.23 srt/models/llama_eagle3.py
# `legacy_name_map`), read as fc_norm.
LEGACY_FC_NORM_FLAG = "use_aux_norm"

# Keys a manifest-less drafter's config.json (its layer config, in the speculators layout) must hold.
DRAFTER_REQUIRED_KEYS = (
    "hidden_size",
    "num_attention_heads",
    "intermediate_size",
    "vocab_size",
    "max_position_embeddings",
)


def config_from_files(
    path: Path,
    layout: str,
    config: dict[str, Any],
    manifest: Manifest | None,
    target_num_layers: int | None,
    target_class: str = "llama",
    sglang_version: str | None = None,
    aux_layers: list[int] | None = None,
) -> DraftConfig:
    """Rebuild the DraftConfig a checkpoint declares (from the manifest when there is one),
    refusing flags specdraft does not implement whether or not a manifest is there
    (`refuse_unimplemented_flags`: the engines read config.json, not the manifest). Without a
    manifest the aux layers are `aux_layers_of_config`'s (target class, SGLang version,
    --aux-layers); with one, an --aux-layers that names other layers is a CheckpointError."""
    refuse_unimplemented_flags(path, config)
    layer = config.get("transformer_layer_config") if layout == "speculators" else config
    where = f"{path}/config.json" + (
        ": transformer_layer_config" if layout == "speculators" else ""
    )
    if not isinstance(layer, dict):
        raise InvalidCheckpointFile(f"{where}: missing or not a JSON object; {DRAFTER_CONFIG_FIX}")
    refuse_sliding_window(where, layer)  # before the unknown keys: its own reason
    refuse_unknown_keys(path, config)
    flags = norm_flags_of_config(path, config)
    if manifest is not None:
        cfg = _manifest_config(path, manifest, flags, aux_layers)
        refuse_other_declared(path, where, config, layer, cfg, flags)
    else:
        _refuse_manifestless(path, where, layer, target_num_layers)
        ids = aux_layers_of_config(
            path, config, target_num_layers, target_class, sglang_version, aux_layers
        )
        cfg = _manifestless_config(config, layer, ids, target_num_layers, flags)
    refuse_other_aux_count(path, config, cfg)
    return cfg


def _manifestless_config(
    config: dict[str, Any],
    layer: dict[str, Any],
    aux_layers: list[int],
    target_num_layers: int,
    flags: dict[str, bool],
) -> DraftConfig:
    """The DraftConfig a manifest-less config.json (`layer`: its layer config) declares, on
    `aux_layers` of a `target_num_layers`-layer target; DraftError for values it refuses."""
    rope_theta, rope_scaling = rope_from_hf_config(layer.get)
    return DraftConfig.from_target(
        layer,
        aux_layers,
        draft_vocab_size=config.get("draft_vocab_size") or layer.get("draft_vocab_size"),
        target_hidden_size=config.get("target_hidden_size") or layer["hidden_size"],
        target_num_layers=target_num_layers,
        rope_theta=rope_theta,
        rope_scaling=rope_scaling,
        **flags,
    )


# What config.json declares that the engines compute with (vLLM and SGLang build the drafter
# from config.json, never the manifest): max_position_embeddings is left out, a serving limit.
DECLARED_FIELDS = (*SIZE_FIELDS, "rope_theta", "rope_scaling", "rms_norm_eps")


def refuse_other_declared(
    path: Path,
    where: str,
    config: dict[str, Any],
    layer: dict[str, Any],
    trained: DraftConfig,
    flags: dict[str, bool],
) -> None:
    """CheckpointError naming config.json when what it declares (read as without a manifest,
    `_manifestless_config`) differs from the manifest's training record in a DECLARED_FIELDS
    value, or cannot be read: an edited rms_norm_eps loads from the manifest unchanged but every
    engine computes another drafter."""
    refuse_missing_keys(where, layer, "the engines build the drafter from config.json")
    try:
        declared = _manifestless_config(
            config, layer, list(trained.aux_layers), trained.target_num_layers, flags
        )
    except (DraftError, TypeError, ValueError) as e:
        raise InvalidCheckpointFile(f"{where}: {e}; {DRAFTER_CONFIG_FIX}") from None
    differ = [
        f"{name} {getattr(declared, name)!r} (config.json) vs {getattr(trained, name)!r} (manifest)"
        for name in DECLARED_FIELDS
        if getattr(declared, name) != getattr(trained, name)
    ]
    if differ:
        raise CheckpointError(
            f"{path}/config.json: {'; '.join(differ)}: the engines read config.json, so they "
            f"would compute another drafter than was trained; {DRAFTER_CONFIG_FIX}"
        )


def refuse_other_aux_count(path: Path, config: dict[str, Any], cfg: DraftConfig) -> None:
    """CheckpointError naming the file when its num_aux_hidden_states (the count of aux states
    fc takes, which SGLang >= 0.5.12 and vLLM read first: `conventions.config_reads.NUM_AUX_KEY`)
    is not the count of the aux layers the drafter reads."""
    count = config.get(NUM_AUX_KEY)
    if count is not None and count != cfg.n_aux:
        raise CheckpointError(
            f"{path}/config.json: {NUM_AUX_KEY} = {count!r}, but the drafter reads "
            f"{cfg.n_aux} aux layers {list(cfg.aux_layers)}: the engines would size fc for "
            f"{count!r}; write {cfg.n_aux} (or name {count!r} layers with --aux-layers)"
        )


def refuse_missing_keys(where: str, layer: dict[str, Any], why: str) -> None:
    """InvalidCheckpointFile naming `where` and the DRAFTER_REQUIRED_KEYS the layer config
    lacks (or holds as null), with `why` they are needed."""
    missing = [k for k in DRAFTER_REQUIRED_KEYS if layer.get(k) is None]
    if missing:
        raise InvalidCheckpointFile(
            f"{where}: missing {', '.join(missing)} ({why}); {DRAFTER_CONFIG_FIX}"
        )


def _refuse_manifestless(
    path: Path, where: str, layer: dict[str, Any], target_num_layers: int | None
) -> None:
    """What a drafter without a manifest needs to be built from config.json alone: the layer
    config's DRAFTER_REQUIRED_KEYS, one decoder layer, and the target's layer count (for the aux
    ids: TargetNeeded). InvalidCheckpointFile naming `where` for a missing key, CheckpointError
    for more layers."""
    refuse_missing_keys(
        where, layer, "without a specdraft manifest the drafter is built from config.json"
    )
    if layer.get("num_hidden_layers", 1) != 1:
        raise CheckpointError(
            f"{path}/config.json: num_hidden_layers = {layer['num_hidden_layers']}; "
            "specdraft implements the one-layer EAGLE-3 drafter"
        )
    if target_num_layers is None:
        raise TargetNeeded(
            f"{path}: no specdraft manifest, so the aux layer ids cannot be read "
            "without the target's layer count: pass the target (--target DIR)"
        )


def _manifest_config(
    path: Path, manifest: Manifest, flags: dict[str, bool], aux_layers: list[int] | None
) -> DraftConfig:
    """The manifest's DraftConfig, refusing a config.json whose norm flags differ from training's
    (the engines read config.json) and an --aux-layers naming other layers than training's."""
    cfg = DraftConfig.from_dict(manifest.draft)
    trained = {name: getattr(cfg, name) for name in NORM_FLAGS}
    if trained != flags:
        differ = ", ".join(
            f"{k} {flags[k]} (config.json) vs {trained[k]} (manifest)"
            for k in NORM_FLAGS
            if flags[k] != trained[k]
        )
        raise CheckpointError(
            f"{path}/config.json: {differ}: the engines read config.json, so they would "
            f"compute another drafter than was trained; {DRAFTER_CONFIG_FIX}"
        )
    refuse_other_aux_layers(path / MANIFEST_FILE, cfg.aux_layers, aux_layers)
    return cfg


def refuse_other_aux_layers(
    where: str | Path, recorded: list[int], given: list[int] | None
) -> None:
    """The one rule of --aux-layers (`given`, specdraft indices; None: left out) for a drafter that
    records its training layers (`recorded`: a specdraft manifest, a training checkpoint): the same
    layers are accepted, others are a CheckpointError naming `where` and both lists."""
    if given is not None and list(given) != list(recorded):
        raise CheckpointError(
            f"{where}: the drafter was trained on aux layers {list(recorded)} (specdraft "
            f"indices), which it records; --aux-layers {list(given)} names other layers: drop "
            "--aux-layers (it names the layers of a drafter without a manifest)"
        )


def norm_flags_of_config(path: Path, config: dict[str, Any]) -> dict[str, bool]:
    """The `draft_config.NORM_FLAGS` a drafter's config.json sets, read as the engines read them
    (`conventions.FLAG_RULES`): top-level keys; norm_before_fc in eagle_config first; fc_norm also
    under SGLang's legacy `use_aux_norm`. Absent or null = false; any other non-boolean value, or
    two keys of one flag that disagree, is a CheckpointError naming the file. A speculators config
    without norm_before_residual is a CheckpointError too: vLLM reads it as true, the speculators
    library as false (`conventions.engines.FLAG_RULES`), so the file names no one drafter."""
    if "speculators_model_type" in config and config.get("norm_before_residual") is None:
        raise CheckpointError(
            f"{path}/config.json: a speculators config without norm_before_residual: vLLM 0.32 "
            "reads it as true, the speculators library as false, so engines would compute "
            "different drafters; write the value it was trained with (true or false)"
        )
    nested = config.get("eagle_config") if isinstance(config.get("eagle_config"), dict) else {}
    keys = {name: [(name, config.get(name))] for name in NORM_FLAGS}
    keys["norm_before_fc"].append(("eagle_config.norm_before_fc", nested.get("norm_before_fc")))
    keys["fc_norm"].append((LEGACY_FC_NORM_FLAG, config.get(LEGACY_FC_NORM_FLAG)))
    flags = {}
    for name, pairs in keys.items():
        given = {key: value for key, value in pairs if value is not None}
        bad = {key: value for key, value in given.items() if not isinstance(value, bool)}
        if bad:
            raise CheckpointError(
                f"{path}/config.json: {', '.join(f'{k}: {json.dumps(v)}' for k, v in bad.items())}"
                f" must be true or false; {DRAFTER_CONFIG_FIX}"
            )
        if len(set(given.values())) > 1:
            raise CheckpointError(
                f"{path}/config.json: {json.dumps(given)} disagree; write one value"
            )
        flags[name] = any(given.values())
    return flags


def config_without_target(path: Path, layout: str, config: dict[str, Any], names) -> DraftConfig:
    """A manifest-less drafter's DraftConfig from config.json alone, for its tensors' names and
    shapes (`checkpoint.draft_tensors`): read with a stand-in target layer count under which every
    aux id it holds is capturable (top-level ids as-is, eagle_config ids + 1), at least 7 (where
    the engines' default [2, L//2, L-3], read when it holds none, is 3 layers). Aux layers set no
    tensor's shape, their count does; `names`: the file's tensor names (`owned_embedding_config`).
    Raises CheckpointError / ValueError as `config_from_files`."""
    nested = config.get("eagle_config")
    ids = list(config.get(AUX_KEY) or []) + list(
        (nested.get(AUX_KEY) if isinstance(nested, dict) else None) or []
    )
    stand_in = max([7] + [i + 2 for i in ids if isinstance(i, int)])
    return owned_embedding_config(
        config_from_files(path, layout, config, None, stand_in), None, names
    )


def owned_embedding_config(cfg: DraftConfig, manifest: Manifest | None, names) -> DraftConfig:
    """`cfg` marked `embedding_owned` when a manifest-less drafter's file holds `embed_tokens.weight`
    at the target's width (speculators' trainer saves it): the drafter then uses that one, as vLLM
    does with a distinct owned embedding. With a manifest, the manifest's record decides."""
    if manifest is None and "embed_tokens.weight" in names and not cfg.owns_embedding:
        return dataclasses.replace(cfg, embedding_owned=True)
    return cfg


def aux_layers_of_config(
    path: Path,
    config: dict[str, Any],
    num_layers: int,
    target_class: str = "llama",
    sglang_version: str | None = None,
    aux_layers: list[int] | None = None,
) -> list[int]:
    """Specdraft indices named by a config: nested ids in SGLang's convention by the rule of the
    target's class and SGLang version (`conventions.ENGINE_RULES`), top-level ids as-is.

    When both keys exist they must name the same layers (DESIGN.md §2, case FC-03). A config
    with neither (or null ids) gets the engines' default [2, L//2, L-3]
    (`conventions.engines_default_layers`); `aux_layers` (a user's --aux-layers, specdraft
    indices) replaces whatever the config says. CheckpointError naming the file otherwise.
    """
    if aux_layers is not None:
        return list(aux_layers)
    top = config.get(AUX_KEY)
    nested = (config.get("eagle_config") or {}).get(AUX_KEY)
    try:
        from_top = from_engine_ids(top, "vllm", num_layers, target_class) if top else None
        from_nested = (
            from_engine_ids(nested, "sglang", num_layers, target_class, sglang_version)
            if nested
            else None
        )
        layers = from_top or from_nested or engines_default_layers(num_layers)
    except ValueError as e:
        raise CheckpointError(f"{path}/config.json: {e}") from e
    if from_top and from_nested and from_top != from_nested:
        raise CheckpointError(
            f"{path}/config.json: top-level ids {top} (vLLM: layers {from_top}) and eagle_config ids "
            f"{nested} (SGLang: layers {from_nested}) name different layers; fix one of them"
        )
    return layers


def fc_width_hint(cfg: DraftConfig, tensors: dict[str, Any]) -> str:
    """ "; ..." saying how many aux states the file's fc.weight takes when its input width is another
    multiple of the target's hidden size than the aux layers named (an --aux-layers or config ids
    of another count: the drafter's fc, not an engine, bounds the count); "" otherwise."""
    fc, width = tensors.get("fc.weight"), cfg.target_hidden_size
    if (
        fc is None
        or fc.dim() != 2
        or fc.shape[1] % width
        or fc.shape[1] // width == len(cfg.aux_layers)
    ):
        return ""
    count = fc.shape[1] // width
    return (
        f"; the drafter's fc takes {count} aux states ({count} x target hidden size {width}) and the "
        f"aux layers {list(cfg.aux_layers)} are {len(cfg.aux_layers)}: name {count} layers"
    )


def config_target_sizes(config: dict[str, Any]) -> dict[str, Any]:
    """The target sizes a drafter's config.json was built for, as `config_from_files` reads them:
    hidden_size (target_hidden_size, else the layer's hidden_size) and vocab_size (the layer's;
    speculators nest the layer in transformer_layer_config); None where the file names none."""
    layer = config.get("transformer_layer_config")
    layer = layer if isinstance(layer, dict) else config
    return {
        "hidden_size": config.get("target_hidden_size") or layer.get("hidden_size"),
        "vocab_size": layer.get("vocab_size"),
    }


def aux_layers_note(
    config: dict[str, Any],
    manifest: Manifest | None,
    num_layers: int | None,
    aux_layers: list[int] | None,
) -> str | None:
    """The one line saying where a manifest-less drafter's aux layers came from when its config
    names none, or an --aux-layers override; None when the manifest or the config names them."""
    if manifest is not None or num_layers is None:
        return None
    if aux_layers is not None:
        return f"aux layers {list(aux_layers)} (specdraft indices) from --aux-layers, not from config.json"
    if config.get(AUX_KEY) or (config.get("eagle_config") or {}).get(AUX_KEY):
        return None
    return (
        f"config.json names no {AUX_KEY}: using the engines' default [2, L//2, L-3] = "
        f"{engines_default_layers(num_layers)} (specdraft indices, what SGLang and vLLM capture without "
        "ids); --aux-layers overrides"
    )
