"""The three drafter layouts as tables: file names, key prefixes, config.json of each, the manifest.

Layouts (DESIGN.md §2 "Checkpoint layouts"):
- ``sglang`` (the official EAGLE-3 layout, which SGLang and vLLM load): config ``architectures:
  ["LlamaForCausalLMEagle3"]``, aux ids under ``eagle_config``; tensors ``fc.weight``,
  ``midlayer.*``, ``norm.weight``, ``lm_head.weight``, ``d2t``, ``t2d``; ``embed_tokens.weight``
  only when the drafter owns its embedding.
- ``speculators`` (read by vLLM): ``speculators_model_type: "eagle3"``,
  ``transformer_layer_config``, top-level aux ids; the decoder layer under ``layers.0.*``.
- ``specdraft``: the ``sglang`` files plus ``specdraft_manifest.json`` (no file format of its
  own: the SGLang layout is the one specdraft trains in; `describe_layout` names it so). The
  ``sglang`` layout never holds the manifest; ``speculators`` holds it when there is one.

A config flag specdraft does not implement, or a config that cannot rebuild the drafter, is a
CheckpointError naming the file (`config_from_files`).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import torch

from specdraft import __version__
from specdraft.checkpoint.config_keys import UNKNOWN_KEYS_FIX, unknown_config_keys
from specdraft.conventions import (
    AUX_KEY,
    ENGINE_NAMES,
    engines_default_layers,
    from_engine_ids,
    to_engine_ids,
)
from specdraft.conventions.engines import (
    SLIDING_LAYER_TYPE,
    engines_serving_architecture,
    engines_serving_speculators,
)
from specdraft.draft import NORM_FLAGS, DraftConfig, Eagle3Draft, rope_from_hf_config
from specdraft.errors import SpecdraftError

LAYOUTS = ("specdraft", "sglang", "speculators")
MANIFEST_FILE = "specdraft_manifest.json"
WEIGHTS_FILE = "model.safetensors"
OFFICIAL_ARCHITECTURES = ("LlamaForCausalLMEagle3",)
# Decoder-layer prefix of each layout (the only name that differs between them).
LAYER_PREFIX = {"specdraft": "midlayer.", "sglang": "midlayer.", "speculators": "layers.0."}
# Config flags of EAGLE-3 variants that specdraft's drafter does not implement: if set, refuse.
UNIMPLEMENTED_FLAGS = ("embed_norm", "attention_bias", "mlp_bias")
# SGLang's legacy names of the fc_norm flag and tensors (sglang 0.5.23 srt/models/llama_eagle3.py
# `legacy_name_map`), read as the current names.
LEGACY_FC_NORM_FLAG = "use_aux_norm"
LEGACY_TENSOR_NAMES = {
    "aux_norm_low.": "fc_norm.0.",
    "aux_norm_mid.": "fc_norm.1.",
    "aux_norm_high.": "fc_norm.2.",
}


class CheckpointError(SpecdraftError, ValueError):
    """A draft checkpoint that cannot be loaded exactly as written; the message names the file."""


class TargetNeeded(CheckpointError):
    """A manifest-less drafter read without the target's layer count: its config passed every
    check before the aux ids, which only the target's layer count and class can read."""


# What restores a drafter's damaged config.json or manifest: the training run, or the files' source.
DRAFTER_CONFIG_FIX = (
    "re-export the drafter from its training run (specdraft export RUN/draft OUT --engine "
    "sglang|vllm|speculators) or restore config.json from where the checkpoint came from"
)
MANIFEST_FIX = (
    f"re-export the drafter from its training run (specdraft export RUN/draft OUT --engine "
    f"sglang|vllm|speculators, which writes the manifest); without the run, delete {MANIFEST_FILE}: "
    "the drafter then loads from its config.json alone (pass --target DIR)"
)
# What to do about a config.json that sets one of UNIMPLEMENTED_FLAGS.
FLAGS_FIX = (
    "a drafter specdraft trained or exported never sets them: remove the flag (or write false) if "
    "the drafter was trained without it, else use the trainer that implements it"
)
# Keys a manifest-less drafter's config.json (its layer config, in the speculators layout) must hold.
DRAFTER_REQUIRED_KEYS = (
    "hidden_size",
    "num_attention_heads",
    "intermediate_size",
    "vocab_size",
    "max_position_embeddings",
)


def describe_layout(layout: str, has_manifest: bool) -> str:
    """A layout as a user sees it on disk, with the engines that load it (`conventions.DRAFT_LOADING`:
    the official EAGLE-3 files, SGLang's layout, load in vLLM too); "specdraft" is the SGLang
    layout plus the manifest."""
    check_layout(layout)
    if layout == "speculators":
        name = f"speculators layout (loaded by {_engine_list(engines_serving_speculators())})"
    else:
        loaders = _engine_list(engines_serving_architecture(list(OFFICIAL_ARCHITECTURES)))
        name = f"SGLang layout (official EAGLE-3, loaded by {loaders}; the one specdraft trains in)"
    if not has_manifest:
        return name + ", no specdraft manifest"
    return (
        name
        + " + specdraft manifest"
        + (" (convert's --layout specdraft)" if layout == "specdraft" else "")
    )


def _engine_list(engines: list[str]) -> str:
    """ "SGLang and vLLM": engines by their names."""
    return " and ".join(ENGINE_NAMES[e] for e in engines)


@dataclass
class Manifest:
    """What a drafter was trained against, stored as ``specdraft_manifest.json``.

    `aux_layers` are specdraft indices (DESIGN.md §2). `target` holds architecture, config_hash,
    num_layers, hidden_size, vocab_size, rope_theta, rope_scaling, max_position_embeddings,
    name_or_path. `tokenizer` holds vocab_hash, bos_id, eos_ids, pad_id, length.
    `chat_template` holds hash and kwargs. `training` holds the final metrics.
    """

    draft: dict[str, Any]
    target: dict[str, Any]
    aux_layers: list[int]
    tokenizer: dict[str, Any] | None = None
    chat_template: dict[str, Any] | None = None
    data_hash: str | None = None
    draft_vocab_hash: str | None = None
    training: dict[str, Any] | None = None
    training_command: str | None = None
    specdraft_version: str = __version__
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        """Pretty JSON with sorted keys."""
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    @classmethod
    def read(cls, path: Path) -> Manifest:
        """Read a manifest file; bad JSON or unknown keys raise CheckpointError naming the file."""
        try:
            data = json.loads(Path(path).read_text())
        except json.JSONDecodeError as e:
            raise CheckpointError(f"{path}: not valid JSON ({e}); {MANIFEST_FIX}") from e
        if not isinstance(data, dict):
            raise CheckpointError(
                f"{path}: not a JSON object (a {type(data).__name__}); {MANIFEST_FIX}"
            )
        unknown = sorted(set(data) - set(cls.__dataclass_fields__))
        if unknown:
            raise CheckpointError(
                f"{path}: unknown manifest keys {unknown} (a newer specdraft's?): upgrade "
                f"specdraft, or {MANIFEST_FIX}"
            )
        missing = sorted(
            f.name
            for f in fields(cls)
            if f.name not in data and f.default is MISSING and f.default_factory is MISSING
        )
        if missing:
            raise CheckpointError(f"{path}: manifest keys {missing} missing; {MANIFEST_FIX}")
        return cls(**data)


def state_dict_for_layout(model: Eagle3Draft, layout: str) -> dict[str, torch.Tensor]:
    """The tensors one layout stores, under that layout's names (contiguous, detached).

    The shared embedding is left out unless the drafter owns it (SGLang and vLLM take the
    target's embedding when the widths match).
    """
    check_layout(layout)
    out = {}
    for name, tensor in model.state_dict().items():
        if name == "embed_tokens.weight" and not model.cfg.owns_embedding:
            continue
        if name.startswith("midlayer."):
            name = LAYER_PREFIX[layout] + name[len("midlayer.") :]
        out[name] = tensor.detach().contiguous()
    return out


def check_layout(layout: str) -> None:
    """Raise ValueError unless `layout` is one of LAYOUTS."""
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}: choose one of {', '.join(LAYOUTS)}")


def official_config(
    cfg: DraftConfig,
    dtype: torch.dtype,
    target_class: str = "llama",
    sglang_version: str | None = None,
) -> dict[str, Any]:
    """config.json of the official/SGLang layout.

    Aux ids: nested `eagle_config` key in SGLang's convention (the rule of the target's class and
    SGLang version) when SGLang can express the layers whatever the version, top-level key in
    vLLM's convention (vLLM reads the top-level key first, SGLang only the nested one, so one file
    serves both; both name cfg.aux_layers), left out when vLLM cannot capture them on the class
    (a file for SGLang alone); neither key when no engine can at `sglang_version` (the manifest
    then records the layers: `save_draft` refuses such a file without one). rope_theta/rope_scaling,
    target_hidden_size and draft_vocab_size are written explicitly.
    """
    top, sglang = (
        vllm_ids_or_none(cfg, target_class),
        sglang_ids_or_none(cfg, target_class, sglang_version),
    )
    config = base_llama_config(cfg, dtype)
    config.update(
        architectures=list(OFFICIAL_ARCHITECTURES),
        draft_vocab_size=cfg.draft_vocab_size,
        target_hidden_size=cfg.target_hidden_size,
        **norm_flags_config(cfg),
    )
    if (
        top is not None
    ):  # else a file for SGLang alone: vLLM would read the nested ids as-is, wrongly
        config[AUX_KEY] = top
    if sglang is not None:
        config["eagle_config"] = {
            "eagle_aux_hidden_state_layer_ids": sglang,
            "use_aux_hidden_state": True,
        }
    return config


def speculators_config(
    cfg: DraftConfig,
    dtype: torch.dtype,
    verifier: str | None,
    verifier_architectures: list[str],
    num_speculative_tokens: int = 3,
    target_class: str = "llama",
) -> dict[str, Any]:
    """config.json of the speculators layout (read by vLLM).

    `verifier_architectures`: the target config's `architectures` (speculators' verifier record).
    `norm_before_residual` is written explicitly: vLLM assumes true when a speculators config
    omits it (vllm `transformers_utils/configs/speculators/algos.py`).
    """
    return {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "speculators_version": "0.3.0",
        "transformer_layer_config": base_llama_config(cfg, dtype),
        "draft_vocab_size": cfg.draft_vocab_size,
        "target_hidden_size": cfg.target_hidden_size,
        **norm_flags_config(cfg),
        "eagle_aux_hidden_state_layer_ids": vllm_ids(cfg, target_class),
        "speculators_config": {
            "algorithm": "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": [
                {"proposal_type": "greedy", "speculative_tokens": num_speculative_tokens}
            ],
            "verifier": {"name_or_path": verifier, "architectures": list(verifier_architectures)},
        },
    }


def norm_flags_config(cfg: DraftConfig) -> dict[str, bool]:
    """The norm flags as both config files write them, top-level (where SGLang, vLLM and
    speculators all read them): norm_before_residual always (vLLM assumes true when a speculators
    config omits it), the EAGLE-3.1 flags when set (every engine's default is false)."""
    flags = {"norm_before_residual": cfg.norm_before_residual}
    return flags | {name: True for name in NORM_FLAGS[1:] if getattr(cfg, name)}


def base_llama_config(cfg: DraftConfig, dtype: torch.dtype) -> dict[str, Any]:
    """The Llama-shaped part shared by both config files (one decoder layer)."""
    return {
        "model_type": "llama",
        "hidden_act": "silu",
        "num_hidden_layers": 1,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "vocab_size": cfg.vocab_size,
        "rms_norm_eps": cfg.rms_norm_eps,
        "max_position_embeddings": cfg.max_position_embeddings,
        "rope_theta": cfg.rope_theta,
        "rope_scaling": cfg.rope_scaling,
        "tie_word_embeddings": False,
        "torch_dtype": str(dtype).removeprefix("torch."),
    }


def vllm_ids(cfg: DraftConfig, target_class: str = "llama") -> list[int]:
    """The aux layers in vLLM's (as-is) convention."""
    return to_engine_ids(list(cfg.aux_layers), "vllm", cfg.target_num_layers, target_class)


def vllm_ids_or_none(cfg: DraftConfig, target_class: str = "llama") -> list[int] | None:
    """`vllm_ids`, or None when vLLM cannot capture the layers on the target's class (e.g. the
    embeddings on DeepSeek-class targets)."""
    try:
        return vllm_ids(cfg, target_class)
    except ValueError:
        return None


def sglang_ids_or_none(
    cfg: DraftConfig, target_class: str = "llama", sglang_version: str | None = None
) -> list[int] | None:
    """The aux layers in SGLang's convention for the target's class (every SGLang version when
    `sglang_version` is None), or None when SGLang cannot express them."""
    try:
        return to_engine_ids(
            list(cfg.aux_layers), "sglang", cfg.target_num_layers, target_class, sglang_version
        )
    except ValueError:
        return None


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
        raise CheckpointError(f"{where}: missing or not a JSON object; {DRAFTER_CONFIG_FIX}")
    refuse_sliding_window(where, layer)  # before the unknown keys: its own reason
    refuse_unknown_keys(path, config)
    flags = norm_flags_of_config(path, config)
    if manifest is not None:
        return _manifest_config(path, manifest, flags, aux_layers)
    missing = [k for k in DRAFTER_REQUIRED_KEYS if layer.get(k) is None]
    if missing:
        raise CheckpointError(
            f"{where}: missing {', '.join(missing)} (without a specdraft manifest the drafter "
            f"is built from config.json); {DRAFTER_CONFIG_FIX}"
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
    rope_theta, rope_scaling = rope_from_hf_config(layer.get)
    return DraftConfig.from_target(
        layer,
        aux_layers_of_config(
            path, config, target_num_layers, target_class, sglang_version, aux_layers
        ),
        draft_vocab_size=config.get("draft_vocab_size") or layer.get("draft_vocab_size"),
        target_hidden_size=config.get("target_hidden_size") or layer["hidden_size"],
        target_num_layers=target_num_layers,
        rope_theta=rope_theta,
        rope_scaling=rope_scaling,
        **flags,
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
    """The `draft.NORM_FLAGS` a drafter's config.json sets, read as the engines read them
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


def canonical_tensor_names(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`tensors` with SGLang's legacy fc_norm names (`LEGACY_TENSOR_NAMES`) renamed to the current ones."""

    def rename(name: str) -> str:
        for legacy, new in LEGACY_TENSOR_NAMES.items():
            if name.startswith(legacy):
                return new + name[len(legacy) :]
        return name

    return {rename(name): tensor for name, tensor in tensors.items()}


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
