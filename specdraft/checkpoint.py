"""Draft checkpoints: the three layouts as key tables, strict load and save, the manifest.

Layouts (DESIGN.md §2 "Checkpoint layouts"):
- ``sglang`` (the official EAGLE-3 layout, which SGLang loads): config ``architectures:
  ["LlamaForCausalLMEagle3"]``, aux ids under ``eagle_config``; tensors ``fc.weight``,
  ``midlayer.*``, ``norm.weight``, ``lm_head.weight``, ``d2t``, ``t2d``; ``embed_tokens.weight``
  only when the drafter owns its embedding.
- ``speculators`` (read by vLLM): ``speculators_model_type: "eagle3"``,
  ``transformer_layer_config``, top-level aux ids; the decoder layer under ``layers.0.*``.
- ``specdraft``: the ``sglang`` files plus ``specdraft_manifest.json`` (no file format of its
  own: the SGLang layout is the one specdraft trains in; `describe_layout` names it so). The
  ``sglang`` layout never holds the manifest; ``speculators`` holds it when there is one.

`classify_dir` tells a drafter directory from a target model's by its config.json alone;
`wrong_dir_message` is the one line every command prints when given the one for the other.

Every loader in the field drops unknown keys silently. Here a key that matches nothing, a
parameter that nothing fills, a tensor of the wrong shape, or a config flag specdraft does not
implement is an error naming them (cases S1, FC-01).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from specdraft import __version__
from specdraft.conventions import from_engine_ids, to_engine_ids, validate_vocab_map
from specdraft.draft import DraftConfig, Eagle3Draft, rope_from_hf_config

LAYOUTS = ("specdraft", "sglang", "speculators")
MANIFEST_FILE = "specdraft_manifest.json"
WEIGHTS_FILE = "model.safetensors"
OFFICIAL_ARCHITECTURES = ("LlamaForCausalLMEagle3",)
# Decoder-layer prefix of each layout (the only name that differs between them).
LAYER_PREFIX = {"specdraft": "midlayer.", "sglang": "midlayer.", "speculators": "layers.0."}
# Config flags of EAGLE-3 variants that specdraft's drafter does not implement: if set, refuse.
UNIMPLEMENTED_FLAGS = ("norm_before_fc", "fc_norm", "norm_output", "embed_norm", "attention_bias",
                       "mlp_bias", "norm_before_residual")


class CheckpointError(ValueError):
    """A draft checkpoint that cannot be loaded exactly as written; the message names the file."""


# Config keys only an EAGLE-3 drafter's config has (a transformers model's has none of them),
# at the top or in a speculators transformer_layer_config.
DRAFTER_CONFIG_KEYS = ("speculators_model_type", "draft_vocab_size", "target_hidden_size", "eagle_config",
                       "eagle_aux_hidden_state_layer_ids")
DRAFTER_DIRS = "pass the drafter directory (specdraft train's OUT/draft or an export)"
# What restores a drafter's damaged config.json or manifest: the training run, or the files' source.
DRAFTER_CONFIG_FIX = ("re-export the drafter from its training run (specdraft export RUN/draft OUT --engine "
                      "sglang|vllm|speculators) or restore config.json from where the checkpoint came from")
MANIFEST_FIX = (f"re-export the drafter from its training run (specdraft export RUN/draft OUT --engine "
                f"sglang|vllm|speculators, which writes the manifest); without the run, delete {MANIFEST_FILE}: "
                "the drafter then loads from its config.json alone (pass --target DIR)")
# Keys a manifest-less drafter's config.json (its layer config, in the speculators layout) must hold.
DRAFTER_REQUIRED_KEYS = ("hidden_size", "num_attention_heads", "intermediate_size", "vocab_size",
                         "max_position_embeddings")


@dataclass(frozen=True)
class DirKind:
    """What a directory holds, judged from its config.json (and manifest) alone.

    kind: "drafter" (an EAGLE-3 draft model), "target" (a transformers model) or "other" (no or
    unreadable config.json, or one that is neither). evidence: what decided it, e.g. "its
    config.json says architectures ['LlamaForCausalLMEagle3']" or "LlamaForCausalLM, 5 layers".
    trained_for: the target a drafter records (manifest, else speculators verifier), or None.
    """

    kind: str
    evidence: str = ""
    trained_for: str | None = None


def classify_dir(path: str | Path) -> DirKind:
    """Drafter, target model or other, from `path`/config.json (see DirKind); never raises."""
    path = Path(path)
    config = _json_or_none(path / "config.json")
    if not isinstance(config, dict):
        return DirKind("other")
    architectures = config.get("architectures")
    architectures = [str(a) for a in architectures] if isinstance(architectures, list) else []
    evidence = _drafter_evidence(path, config, architectures)
    if evidence:
        return DirKind("drafter", evidence, _recorded_target(path, config))
    if not (architectures or config.get("model_type")):
        return DirKind("other")
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    layers = text.get("num_hidden_layers")
    name = ", ".join(architectures) or f"model_type {config['model_type']}"
    return DirKind("target", name + (f", {layers} layers" if layers else ""))


def _drafter_evidence(path: Path, config: dict[str, Any], architectures: list[str]) -> str:
    """What marks a drafter: an EAGLE-3 architecture, a drafter-only key, a manifest ("" if none)."""
    if set(architectures) & set(OFFICIAL_ARCHITECTURES):
        return f"its config.json says architectures {architectures}"
    layer = config.get("transformer_layer_config")
    layer = layer if isinstance(layer, dict) else {}
    for key in DRAFTER_CONFIG_KEYS:
        if key in config or key in layer:
            value = config.get(key, layer.get(key))
            return f"its config.json has {key}" + ("" if isinstance(value, dict) else f" = {value!r}")
    return f"it holds {MANIFEST_FILE}" if (path / MANIFEST_FILE).is_file() else ""


def _json_or_none(file: Path) -> Any:
    try:
        return json.loads(file.read_text())
    except (OSError, ValueError):
        return None


def _recorded_target(path: Path, config: dict[str, Any]) -> str | None:
    """The target a drafter names: its manifest's target.name_or_path, else the speculators verifier."""
    manifest = _json_or_none(path / MANIFEST_FILE)
    recorded = ((manifest.get("target") or {}).get("name_or_path") if isinstance(manifest, dict) else None)
    if not recorded:
        spec = config.get("speculators_config")
        verifier = spec.get("verifier") if isinstance(spec, dict) else None
        recorded = verifier.get("name_or_path") if isinstance(verifier, dict) else None
    return str(recorded) if recorded else None


def wrong_dir_message(path: str | Path, want: str, given_as: str = "") -> str | None:
    """The one-line refusal when `path` holds a drafter where a target model is wanted
    (want="target"), a target model where a drafter is (want="drafter"), a capture store where
    either is, or a training run directory where a drafter is (naming RUN/draft); None otherwise
    (anything else is left to the loader). given_as: the option it came in, e.g. "--target"."""
    kind = classify_dir(path)
    given = f"{given_as} {path}" if given_as else str(path)
    if want == "target" and kind.kind == "drafter":
        which = (f"the one the drafter was trained for: {kind.trained_for}" if kind.trained_for
                 else "the one the drafter was trained for; the drafter does not record it")
        return (f"{given} is an EAGLE-3 drafter ({kind.evidence}), not a target model: pass the target "
                f"model directory ({which})")
    if want == "drafter" and kind.kind == "target":
        return (f"{given} is a transformers target model ({kind.evidence}), not an EAGLE-3 drafter: "
                f"{DRAFTER_DIRS}, and this directory as --target")
    path = Path(path)
    if kind.kind == "other" and (path / "index.json").is_file() and not (path / "config.json").exists():
        if want == "drafter":
            return (f"{given} is a capture store (specdraft capture's index.json), not a drafter: train one on it "
                    f"(specdraft train {path} OUT), then pass OUT/draft")
        return (f"{given} is a capture store (specdraft capture's index.json), not a target model: pass the "
                f"target's transformers directory (the store's index.json records its path)")
    if want == "drafter" and kind.kind == "other" and classify_dir(path / "draft").kind == "drafter":
        return (f"{given} is a training run directory, not a drafter: pass {path / 'draft'} (the drafter "
                f"specdraft train writes at the end)")
    return None


def describe_layout(layout: str, has_manifest: bool) -> str:
    """A layout as a user sees it on disk ("specdraft" is the SGLang layout plus the manifest)."""
    check_layout(layout)
    name = ("speculators layout (vLLM's)" if layout == "speculators"
            else "SGLang layout (official EAGLE-3, the one specdraft trains in)")
    if not has_manifest:
        return name + ", no specdraft manifest"
    return name + " + specdraft manifest" + (" (convert's --layout specdraft)" if layout == "specdraft" else "")


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
            raise CheckpointError(f"{path}: not a JSON object (a {type(data).__name__}); {MANIFEST_FIX}")
        unknown = sorted(set(data) - set(cls.__dataclass_fields__))
        if unknown:
            raise CheckpointError(f"{path}: unknown manifest keys {unknown} (a newer specdraft's?): upgrade "
                                  f"specdraft, or {MANIFEST_FIX}")
        missing = sorted(f.name for f in fields(cls) if f.name not in data
                         and f.default is MISSING and f.default_factory is MISSING)
        if missing:
            raise CheckpointError(f"{path}: manifest keys {missing} missing; {MANIFEST_FIX}")
        return cls(**data)


@dataclass
class LoadedDraft:
    """A drafter read from disk: the model, its manifest (None outside specdraft layout), its layout."""

    model: Eagle3Draft
    manifest: Manifest | None
    layout: str
    path: Path


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
            name = LAYER_PREFIX[layout] + name[len("midlayer."):]
        out[name] = tensor.detach().contiguous()
    return out


def check_layout(layout: str) -> None:
    """Raise ValueError unless `layout` is one of LAYOUTS."""
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}: choose one of {', '.join(LAYOUTS)}")


def official_config(cfg: DraftConfig, dtype: torch.dtype) -> dict[str, Any]:
    """config.json of the official/SGLang layout.

    Aux ids: nested `eagle_config` key in SGLang's convention when SGLang can express the layers,
    top-level key in vLLM's convention (vLLM reads the top-level key first, SGLang only the nested
    one, so one file serves both). rope_theta/rope_scaling are written explicitly.
    """
    config = base_llama_config(cfg, dtype)
    config.update(architectures=list(OFFICIAL_ARCHITECTURES), draft_vocab_size=cfg.draft_vocab_size,
                  target_hidden_size=cfg.target_hidden_size, norm_before_residual=False,
                  eagle_aux_hidden_state_layer_ids=vllm_ids(cfg))
    sglang = sglang_ids_or_none(cfg)
    if sglang is not None:
        config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": sglang, "use_aux_hidden_state": True}
    return config


def speculators_config(cfg: DraftConfig, dtype: torch.dtype, verifier: str | None,
                       num_speculative_tokens: int = 3) -> dict[str, Any]:
    """config.json of the speculators layout (read by vLLM).

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
        "norm_before_residual": False,
        "eagle_aux_hidden_state_layer_ids": vllm_ids(cfg),
        "speculators_config": {
            "algorithm": "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": num_speculative_tokens}],
            "verifier": {"name_or_path": verifier, "architectures": ["LlamaForCausalLM"]},
        },
    }


def base_llama_config(cfg: DraftConfig, dtype: torch.dtype) -> dict[str, Any]:
    """The Llama-shaped part shared by both config files (one decoder layer)."""
    return {
        "model_type": "llama", "hidden_act": "silu", "num_hidden_layers": 1,
        "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
        "num_attention_heads": cfg.num_attention_heads, "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim, "vocab_size": cfg.vocab_size, "rms_norm_eps": cfg.rms_norm_eps,
        "max_position_embeddings": cfg.max_position_embeddings, "rope_theta": cfg.rope_theta,
        "rope_scaling": cfg.rope_scaling, "tie_word_embeddings": False,
        "torch_dtype": str(dtype).removeprefix("torch."),
    }


def vllm_ids(cfg: DraftConfig) -> list[int]:
    """The aux layers in vLLM's (as-is) convention."""
    return to_engine_ids(list(cfg.aux_layers), "vllm", cfg.target_num_layers)


def sglang_ids_or_none(cfg: DraftConfig) -> list[int] | None:
    """The aux layers in SGLang's convention (Llama class), or None when SGLang cannot express them."""
    try:
        return to_engine_ids(list(cfg.aux_layers), "sglang", cfg.target_num_layers)
    except ValueError:
        return None


def save_draft(model: Eagle3Draft, out_dir: str | Path, *, layout: str = "specdraft",
               manifest: Manifest | None = None, verifier: str | None = None) -> Path:
    """Write `model` in `layout` under `out_dir`, atomically (temp dir, then rename).

    Writes model.safetensors and config.json, and specdraft_manifest.json when a manifest is
    given (required for the specdraft layout), except in the ``sglang`` layout: that is the plain
    official one, the specdraft layout minus the manifest. `verifier` is the speculators
    `verifier.name_or_path` (default: the target path the manifest records).
    Raises ValueError for an unknown layout or a specdraft layout without manifest.
    """
    check_layout(layout)
    if layout == "specdraft" and manifest is None:
        raise ValueError("the specdraft layout needs a manifest (what the drafter was trained on)")
    out_dir = check_output_dir(out_dir)
    dtype = model.fc.weight.dtype
    if verifier is None and manifest is not None:
        verifier = manifest.target.get("name_or_path")
    config = (speculators_config(model.cfg, dtype, verifier) if layout == "speculators"
              else official_config(model.cfg, dtype))
    tmp = out_dir.with_name(f".{out_dir.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    write_safetensors(state_dict_for_layout(model, layout), tmp / WEIGHTS_FILE, metadata={"format": "pt"})
    (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    if manifest is not None and layout != "sglang":
        (tmp / MANIFEST_FILE).write_text(manifest.to_json())
    replace_dir(tmp, out_dir)
    return out_dir


def file_sha256(path: Path) -> str:
    """sha256 (hex) of a file's bytes, read in chunks (a store shard, a drafter, a downloaded model)."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def replace_dir(src: Path, dst: Path) -> None:
    """Move directory `src` to `dst`, replacing an existing `dst` only once `src` is complete
    (callers check first that `dst` may be replaced, e.g. `check_output_dir`)."""
    if dst.exists():
        old = dst.with_name(f".{dst.name}.old-{os.getpid()}")
        os.replace(dst, old)
        os.replace(src, dst)
        shutil.rmtree(old)
    else:
        os.replace(src, dst)


def check_output_dir(out_dir: str | Path, source: str | Path | None = None) -> Path:
    """The absolute path of a drafter output directory, after refusing what writing there would
    destroy: the `source` being read, a file, or a directory holding anything but an EAGLE-3
    drafter (a new or empty directory, or an earlier drafter, is replaced atomically). Raises
    CheckpointError."""
    out = Path(out_dir).resolve()
    if source is not None and out == Path(source).resolve():
        raise CheckpointError(f"{out_dir}: is the checkpoint being read; writing there would replace it: give "
                              "another output directory")
    if out.exists() and not out.is_dir():
        raise CheckpointError(f"{out_dir}: is a file; give a new directory (or a drafter directory to replace)")
    if out.is_dir() and any(out.iterdir()):
        try:
            detect_layout(out)
        except CheckpointError:
            raise CheckpointError(f"{out_dir}: holds files that are not an EAGLE-3 drafter; it would be "
                                  "replaced as a whole: give a new or empty directory") from None
        if not (out / WEIGHTS_FILE).is_file():
            raise CheckpointError(f"{out_dir}: a drafter config without {WEIGHTS_FILE}; give a new or "
                                  "empty directory")
    return out


def write_safetensors(tensors: dict[str, torch.Tensor], path: str | Path, metadata: dict[str, str] | None = None) -> None:
    """safetensors.save_file with the permissions of an ordinary file (0666 less the umask;
    save_file creates it owner-only, which a server running as another user cannot read)."""
    save_file(tensors, str(path), metadata=metadata)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)


def detect_layout(path: Path) -> str:
    """Layout of a checkpoint directory, from its files; CheckpointError when none matches."""
    config = read_config(path)
    if config.get("speculators_model_type") is not None:
        if config["speculators_model_type"] != "eagle3":
            raise CheckpointError(f"{path}/config.json: speculators_model_type "
                                  f"{config['speculators_model_type']!r} is not an EAGLE-3 drafter")
        return "speculators"
    if any(a in OFFICIAL_ARCHITECTURES for a in config.get("architectures") or []):
        return "specdraft" if (path / MANIFEST_FILE).exists() else "sglang"
    wrong = wrong_dir_message(path, "drafter")
    if wrong:
        raise CheckpointError(wrong)
    manifest = (f"though {MANIFEST_FILE} is there; {DRAFTER_CONFIG_FIX}" if (path / MANIFEST_FILE).is_file()
                else "no manifest")
    raise CheckpointError(f"{path}/config.json: not an EAGLE-3 draft config (architectures "
                          f"{config.get('architectures')}, no speculators_model_type, {manifest})")


def read_config(path: Path) -> dict[str, Any]:
    """config.json of a checkpoint dir; a missing file or bad JSON is a CheckpointError."""
    file = Path(path) / "config.json"
    if not file.exists():  # a run directory or a store given for its drafter: say what to pass
        raise CheckpointError(wrong_dir_message(path, "drafter") or
                              f"{file}: missing; a draft checkpoint directory needs config.json")
    try:
        return json.loads(file.read_text())
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{file}: not valid JSON ({e})") from e


def config_from_files(path: Path, layout: str, config: dict[str, Any],
                      manifest: Manifest | None, target_num_layers: int | None) -> DraftConfig:
    """Rebuild the DraftConfig a checkpoint declares, refusing flags specdraft does not implement."""
    if manifest is not None:
        return DraftConfig.from_dict(manifest.draft)
    layer = config.get("transformer_layer_config") if layout == "speculators" else config
    where = f"{path}/config.json" + (": transformer_layer_config" if layout == "speculators" else "")
    if not isinstance(layer, dict):
        raise CheckpointError(f"{where}: missing or not a JSON object; {DRAFTER_CONFIG_FIX}")
    missing = [k for k in DRAFTER_REQUIRED_KEYS if layer.get(k) is None]
    if missing:
        raise CheckpointError(f"{where}: missing {', '.join(missing)} (without a specdraft manifest the drafter "
                              f"is built from config.json); {DRAFTER_CONFIG_FIX}")
    flagged = [k for k in UNIMPLEMENTED_FLAGS if config.get(k) or layer.get(k)]
    if flagged:
        raise CheckpointError(f"{path}/config.json: sets {flagged}, which specdraft's drafter does "
                              "not implement (it would compute something else than was trained)")
    if layer.get("num_hidden_layers", 1) != 1:
        raise CheckpointError(f"{path}/config.json: num_hidden_layers = {layer['num_hidden_layers']}; "
                              "specdraft implements the one-layer EAGLE-3 drafter")
    if target_num_layers is None:
        raise CheckpointError(f"{path}: no specdraft manifest, so the aux layer ids cannot be read "
                              "without the target's layer count: pass the target (--target DIR)")
    rope_theta, rope_scaling = rope_from_hf_config(layer.get)
    return DraftConfig.from_target(
        layer, aux_layers_of_config(path, config, target_num_layers),
        draft_vocab_size=config.get("draft_vocab_size") or layer.get("draft_vocab_size"),
        target_hidden_size=config.get("target_hidden_size") or layer["hidden_size"],
        target_num_layers=target_num_layers, rope_theta=rope_theta, rope_scaling=rope_scaling)


def aux_layers_of_config(path: Path, config: dict[str, Any], num_layers: int) -> list[int]:
    """Specdraft indices named by a config: nested ids in SGLang's convention, top-level as-is.

    When both keys exist they must name the same layers (DESIGN.md §2, case FC-03).
    """
    top = config.get("eagle_aux_hidden_state_layer_ids")
    nested = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    try:
        from_top = from_engine_ids(top, "vllm", num_layers) if top else None
        from_nested = from_engine_ids(nested, "sglang", num_layers) if nested else None
    except ValueError as e:
        raise CheckpointError(f"{path}/config.json: {e}") from e
    if from_top and from_nested and from_top != from_nested:
        raise CheckpointError(
            f"{path}/config.json: top-level ids {top} (vLLM: layers {from_top}) and eagle_config ids "
            f"{nested} (SGLang: layers {from_nested}) name different layers; fix one of them")
    layers = from_top or from_nested
    if not layers:
        raise CheckpointError(f"{path}/config.json: no eagle_aux_hidden_state_layer_ids; write the "
                              "training layers explicitly (engine defaults differ)")
    return layers


def load_draft(path: str | Path, *, device: str | torch.device = "cpu", dtype: torch.dtype | None = None,
               target_num_layers: int | None = None) -> LoadedDraft:
    """Load a draft checkpoint strictly, detecting its layout.

    Raises CheckpointError naming the file and every unmatched key, unfilled parameter or
    mis-shaped tensor (cases S1, FC-01). The shared embedding is not in the file: call
    `model.load_target_embedding` before use. `target_num_layers` is needed to read aux ids
    from a checkpoint without a specdraft manifest.
    """
    path = Path(path)
    layout = detect_layout(path)
    config = read_config(path)
    manifest = Manifest.read(path / MANIFEST_FILE) if (path / MANIFEST_FILE).exists() else None
    cfg = config_from_files(path, layout, config, manifest, target_num_layers)
    weights = path / WEIGHTS_FILE
    if not weights.exists():
        raise CheckpointError(f"{weights}: missing")
    try:
        tensors = load_file(str(weights))
    except Exception as e:  # safetensors raises several types for a corrupt header
        raise CheckpointError(f"{weights}: cannot be read as safetensors ({e}); re-export it") from e
    model = Eagle3Draft(cfg).to(dtype=tensors["fc.weight"].dtype if "fc.weight" in tensors else None)
    fill_model(model, tensors, layout, weights)
    model.to(device=device, dtype=dtype)
    return LoadedDraft(model=model, manifest=manifest, layout=layout, path=path)


def fill_model(model: Eagle3Draft, tensors: dict[str, torch.Tensor], layout: str, file: Path) -> None:
    """Copy `tensors` (named in `layout`) into `model`, refusing any mismatch (names the keys)."""
    expected = state_dict_for_layout(model, layout)
    unmatched = sorted(set(tensors) - set(expected))
    missing = sorted(set(expected) - set(tensors))
    if unmatched or missing:
        raise CheckpointError(key_mismatch_message(file, layout, unmatched, missing))
    bad = [f"{k} {tuple(tensors[k].shape)} (expected {tuple(expected[k].shape)})"
           for k in expected if tensors[k].shape != expected[k].shape]
    if bad:
        raise CheckpointError(f"{file}: tensors of the wrong shape: {'; '.join(bad)}")
    renamed = {("midlayer." + k[len(LAYER_PREFIX[layout]):] if k.startswith(LAYER_PREFIX[layout]) else k): v
               for k, v in tensors.items()}
    if "embed_tokens.weight" not in renamed:
        renamed["embed_tokens.weight"] = model.embed_tokens.weight.detach()
    model.load_state_dict(renamed, strict=True)
    model.embedding_loaded = model.cfg.owns_embedding


def key_mismatch_message(file: Path, layout: str, unmatched: list[str], missing: list[str]) -> str:
    """One line naming the keys; suggests the rename when they sit under another layout's prefix (S1)."""
    parts = [f"{file}: {layout} layout"]
    if unmatched:
        parts.append(f"{len(unmatched)} tensors match no parameter: {', '.join(unmatched[:24])}"
                     + (" ..." if len(unmatched) > 24 else ""))
    if missing:
        parts.append(f"{len(missing)} parameters not in the file: {', '.join(missing[:24])}"
                     + (" ..." if len(missing) > 24 else ""))
    want = LAYER_PREFIX[layout]
    for other in set(LAYER_PREFIX.values()) - {want}:
        if any(k.startswith(other) for k in unmatched):
            parts.append(f"the decoder layer is stored under '{other}*' but this layout reads "
                         f"'{want}*': rename them (specdraft convert --layout {layout})")
    return "; ".join(parts)


def audit(model: Eagle3Draft) -> list[str]:
    """Problems in a loaded drafter's tensors: NaN/Inf values and an invalid d2t/t2d map (FC-02)."""
    problems = [f"{name} holds NaN or Inf" for name, t in model.state_dict().items()
                if t.is_floating_point() and not torch.isfinite(t).all()]
    problems += validate_vocab_map(model.d2t, model.t2d, model.cfg.vocab_size, model.cfg.draft_vocab_size)
    return problems


def tensor_digest(t: torch.Tensor) -> str:
    """sha256 of a tensor's raw bytes (dtype and shape included), for bit-exact comparisons."""
    h = hashlib.sha256(f"{t.dtype}{tuple(t.shape)}".encode())
    h.update(t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def convert_draft(src: str | Path, dst: str | Path, *, layout: str,
                  target_num_layers: int | None = None) -> int:
    """Rewrite a drafter in `layout`, then re-read both and prove every tensor bit-identical and
    the drafter config the same (the ``sglang`` layout drops the manifest, so its config.json
    alone must rebuild the drafter).

    A specdraft-layout destination needs the source's manifest; speculators carries it too.
    Returns the number of tensors compared; raises CheckpointError when a tensor differs or is
    missing (case FC-01), or the re-read config differs.
    """
    check_output_dir(dst, source=src)
    if layout == "specdraft" and not (Path(src) / MANIFEST_FILE).is_file():  # before asking for the target
        with_target = "" if target_num_layers else ", with --target DIR (without a manifest the aux ids need it)"
        raise CheckpointError(f"{src}: no {MANIFEST_FILE}, which the specdraft layout carries and --target "
                              f"cannot supply; convert to --layout sglang or speculators instead{with_target}")
    source = load_draft(src, target_num_layers=target_num_layers)
    save_draft(source.model, dst, layout=layout, manifest=source.manifest)
    written = load_draft(dst, target_num_layers=source.model.cfg.target_num_layers)
    if written.model.cfg != source.model.cfg:
        want, have = source.model.cfg.to_dict(), written.model.cfg.to_dict()
        differ = [f"{k} {want[k]!r} -> {have.get(k)!r}" for k in want if want[k] != have.get(k)]
        raise CheckpointError(f"{dst}: the drafter config reads back differently: {', '.join(differ)}")
    return verify_same_tensors(source.model, written.model, dst)


def verify_same_tensors(expected: Eagle3Draft, actual: Eagle3Draft, where: str | Path) -> int:
    """Compare every saved tensor of two drafters bit for bit; CheckpointError names the first that differs."""
    want = state_dict_for_layout(expected, "sglang")
    have = state_dict_for_layout(actual, "sglang")
    for name, tensor in want.items():
        if name not in have or tensor_digest(have[name]) != tensor_digest(tensor):
            raise CheckpointError(f"{where}: tensor {name} is missing or differs after writing")
    return len(want)
