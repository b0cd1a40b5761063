"""Every drafter on disk: strict load and save of the three layouts, and training checkpoints.

The package's modules: `layouts` (the layouts as tables: file names, key prefixes, config.json
of each and the DraftConfig read back from it, the manifest, CheckpointError), `dirs` (what a
directory holds: drafter, target model or other, and the one line naming the mix-up) and this
module (load, save, convert, audit; the training checkpoints a run writes under
RUN/checkpoints, read here so that loading a drafter never imports the trainer). The names
other modules import from `specdraft.checkpoint` are listed in `__all__`.

Every loader in the field drops unknown keys silently. Here a key that matches nothing, a
parameter that nothing fills, a tensor of the wrong shape, or a config flag specdraft does not
implement is an error naming them (cases S1, FC-01).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from specdraft.checkpoint.dirs import (
    PROGRESS_FILE,
    DirKind,
    classify_dir,
    has_manifest,
    is_training_checkpoint,
    plain_architecture_message,
    read_config,
    source_verifier,
    unimplemented_architecture_message,
    verifier_replaced_note,
    wrong_dir_message,
)
from specdraft.checkpoint.layouts import (
    DRAFTER_CONFIG_FIX,
    FLAGS_FIX,
    LAYER_PREFIX,
    LAYOUTS,
    MANIFEST_FILE,
    MANIFEST_FIX,
    OFFICIAL_ARCHITECTURES,
    UNIMPLEMENTED_FLAGS,
    WEIGHTS_FILE,
    CheckpointError,
    Manifest,
    aux_layers_note,
    canonical_tensor_names,
    check_layout,
    config_from_files,
    describe_layout,
    fc_width_hint,
    official_config,
    owned_embedding_config,
    refuse_other_aux_layers,
    refuse_unimplemented_flags,
    speculators_config,
    state_dict_for_layout,
    unimplemented_flags,
)
from specdraft.checkpoint.weights import (
    WEIGHT_FILES,
    WeightFiles,
    check_weight_headers,
    find_weights,
    open_safetensors,
    read_safetensors,
    read_weights,
    write_safetensors,
)
from specdraft.conventions import AUX_KEY
from specdraft.data.vocab import t2d_from_d2t, validate_vocab_map
from specdraft.draft import DraftConfig, Eagle3Draft, rope_inv_freq
from specdraft.errors import UnusableInput
from specdraft.files import atomic_dir, replace_dir

__all__ = [
    "CHECKPOINT_DIR",
    "SOURCE_FORMS",
    "DRAFTER_CONFIG_FIX",
    "FLAGS_FIX",
    "LAYER_PREFIX",
    "LAYOUTS",
    "MANIFEST_FILE",
    "MANIFEST_FIX",
    "PROGRESS_FILE",
    "UNIMPLEMENTED_FLAGS",
    "WEIGHTS_FILE",
    "WEIGHT_FILES",
    "CheckpointError",
    "Converted",
    "DirKind",
    "LoadedDraft",
    "Manifest",
    "WeightFiles",
    "all_finite",
    "audit",
    "aux_layers_note",
    "build_draft",
    "check_output_dir",
    "check_vocab_map",
    "check_weight_headers",
    "checkpoint_paths",
    "classify_dir",
    "config_from_files",
    "convert_draft",
    "derived_tensors",
    "describe_layout",
    "detect_layout",
    "draft_tensors",
    "file_sha256",
    "find_weights",
    "has_manifest",
    "is_training_checkpoint",
    "load_draft",
    "load_training_checkpoint",
    "official_config",
    "open_safetensors",
    "owned_embedding_config",
    "read_config",
    "read_draft_config",
    "read_safetensors",
    "read_sharded",
    "read_weights",
    "refuse_other_aux_layers",
    "refuse_unimplemented_flags",
    "replace_dir",
    "save_draft",
    "source_verifier",
    "speculators_config",
    "state_dict_for_layout",
    "tensor_digest",
    "unimplemented_flags",
    "usable_vocab",
    "verifier_replaced_note",
    "verify_written",
    "vocab_map_problems",
    "write_safetensors",
    "wrong_dir_message",
]

CHECKPOINT_DIR = "checkpoints"  # a training run's checkpoints: RUN/checkpoints/step-N.pt or step-N/
SOURCE_FORMS = (
    "a drafter directory (config.json, model.safetensors) or a training checkpoint "
    "(RUN/checkpoints/step-N.pt)"
)  # what load_draft reads: export's CHECKPOINT, the engine's --draft


@dataclass
class LoadedDraft:
    """A drafter read from disk: the model, its manifest (None outside specdraft layout), its layout,
    and the tensors specdraft derived because the file lacks them (`derived_tensors`)."""

    model: Eagle3Draft
    manifest: Manifest | None
    layout: str
    path: Path
    derived: tuple[str, ...] = ()


@dataclass(frozen=True)
class Converted:
    """What `convert_draft` proved: how many tensors are bit-identical to the source's, and the
    ones derived because the source has none (written, not copied)."""

    num_copied: int
    derived: tuple[str, ...]


def save_draft(
    model: Eagle3Draft,
    out_dir: str | Path,
    *,
    layout: str = "specdraft",
    manifest: Manifest | None = None,
    verifier: str | None = None,
    verifier_architectures: list[str] | None = None,
    target_class: str | None = None,
    sglang_version: str | None = None,
) -> Path:
    """Write `model` in `layout` under `out_dir`, atomically (temp dir, then rename).

    Writes model.safetensors and config.json, and specdraft_manifest.json when a manifest is
    given (required for the specdraft layout), except in the ``sglang`` layout: that is the plain
    official one, the specdraft layout minus the manifest. `verifier` and `verifier_architectures`
    are the speculators `verifier.name_or_path` and `verifier.architectures` (default: the target
    path and architecture the manifest records; [] when nothing records the architecture).
    `target_class` / `sglang_version` pick the engines' id rules (`layouts.official_config`;
    default: the class the manifest records, else "llama").
    Raises ValueError for an unknown layout or a specdraft layout without manifest.
    """
    check_layout(layout)
    if layout == "specdraft" and manifest is None:
        raise ValueError("the specdraft layout needs a manifest (what the drafter was trained on)")
    out_dir = check_output_dir(out_dir)
    dtype = model.fc.weight.dtype
    recorded = (manifest.target if manifest is not None else None) or {}
    verifier = verifier if verifier is not None else recorded.get("name_or_path")
    if verifier_architectures is None:
        verifier_architectures = [recorded["architecture"]] if recorded.get("architecture") else []
    target_class = target_class or recorded.get("target_class") or "llama"
    config = (
        speculators_config(
            model.cfg, dtype, verifier, verifier_architectures, target_class=target_class
        )
        if layout == "speculators"
        else official_config(model.cfg, dtype, target_class, sglang_version)
    )
    if layout == "sglang" and AUX_KEY not in config and "eagle_config" not in config:
        raise CheckpointError(
            f"aux layers {list(model.cfg.aux_layers)}: no engine id list names them on "
            f"{target_class}-class targets{'' if sglang_version is None else ' in SGLang ' + sglang_version}"
            ", so the official layout (no manifest) cannot record them: pass --sglang-version, "
            "or keep the specdraft layout"
        )
    with atomic_dir(out_dir) as tmp:
        write_safetensors(
            state_dict_for_layout(model, layout), tmp / WEIGHTS_FILE, metadata={"format": "pt"}
        )
        (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
        if manifest is not None and layout != "sglang":
            (tmp / MANIFEST_FILE).write_text(manifest.to_json())
    return out_dir


def file_sha256(path: Path) -> str:
    """sha256 (hex) of a file's bytes, read in chunks (a store shard, a drafter, a downloaded model)."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def check_output_dir(out_dir: str | Path, source: str | Path | None = None) -> Path:
    """The absolute path of a drafter output directory, after refusing what writing there would
    destroy: the `source` being read, a file, or a directory holding anything but an EAGLE-3
    drafter (a new or empty directory, or an earlier drafter, is replaced atomically). Raises
    CheckpointError; UnusableInput for the `source` itself (a usage error: exit 2)."""
    out = Path(out_dir).resolve()
    if source is not None and out == Path(source).resolve():
        raise UnusableInput(
            f"{out_dir}: is the checkpoint being read; writing there would replace it: give "
            "another output directory"
        )
    if out.exists() and not out.is_dir():
        raise CheckpointError(
            f"{out_dir}: is a file; give a new directory (or a drafter directory to replace)"
        )
    if out.is_dir() and any(out.iterdir()):
        try:
            detect_layout(out)
        except CheckpointError:
            raise CheckpointError(
                f"{out_dir}: holds files that are not an EAGLE-3 drafter; it would be "
                "replaced as a whole: give a new or empty directory"
            ) from None
        if not any((out / name).is_file() for name in WEIGHT_FILES):
            raise CheckpointError(
                f"{out_dir}: a drafter config without weights ({', '.join(WEIGHT_FILES)}); "
                "give a new or empty directory"
            )
    return out


def detect_layout(path: Path) -> str:
    """Layout of a checkpoint directory, from its files; CheckpointError when none matches."""
    config = read_config(path)
    if config.get("speculators_model_type") is not None:
        if config["speculators_model_type"] != "eagle3":
            raise CheckpointError(
                f"{path}/config.json: speculators_model_type "
                f"{config['speculators_model_type']!r} is not an EAGLE-3 drafter"
            )
        return "speculators"
    architectures = config.get("architectures") or []
    if any(a in OFFICIAL_ARCHITECTURES for a in architectures):
        return "specdraft" if (path / MANIFEST_FILE).exists() else "sglang"
    if (
        any("eagle" in str(a).lower() for a in architectures)
        and classify_dir(path).kind == "drafter"
    ):
        raise CheckpointError(unimplemented_architecture_message(path, architectures))
    wrong = wrong_dir_message(path, "drafter")
    if wrong:
        raise CheckpointError(wrong)
    if (
        classify_dir(path).kind == "drafter"
    ):  # a drafter key (e.g. draft_vocab_size) under a plain class
        raise CheckpointError(plain_architecture_message(path, architectures))
    manifest = (
        f"though {MANIFEST_FILE} is there; {DRAFTER_CONFIG_FIX}"
        if (path / MANIFEST_FILE).is_file()
        else "no manifest"
    )
    raise CheckpointError(
        f"{path}/config.json: not an EAGLE-3 draft config (architectures "
        f"{config.get('architectures')}, no speculators_model_type, {manifest})"
    )


def read_draft_config(
    path: str | Path,
    target_num_layers: int | None = None,
    target_class: str = "llama",
    sglang_version: str | None = None,
    aux_layers: list[int] | None = None,
) -> tuple[str, Manifest | None, DraftConfig]:
    """(layout, manifest or None, DraftConfig) of a drafter directory, from its config.json and
    manifest alone (no tensor is read; an owned embedding is marked by `owned_embedding_config`
    once the tensor names are known); CheckpointError naming the file, as `load_draft`. Aux ids
    of a manifest-less file are read by `layouts.aux_layers_of_config` (target class, SGLang
    version; `aux_layers` overrides them: --aux-layers)."""
    path = Path(path)
    layout = detect_layout(path)
    config = read_config(path)
    manifest = Manifest.read(path / MANIFEST_FILE) if (path / MANIFEST_FILE).exists() else None
    return (
        layout,
        manifest,
        config_from_files(
            path,
            layout,
            config,
            manifest,
            target_num_layers,
            target_class,
            sglang_version,
            aux_layers,
        ),
    )


def load_draft(
    path: str | Path,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
    target_num_layers: int | None = None,
    target_class: str = "llama",
    sglang_version: str | None = None,
    aux_layers: list[int] | None = None,
) -> LoadedDraft:
    """Load a draft checkpoint strictly, detecting its layout and weights format (`weights`); a
    training checkpoint (`is_training_checkpoint`) is read by `load_training_checkpoint`.

    Raises CheckpointError naming the file and every unmatched key, unfilled parameter or
    mis-shaped tensor (cases S1, FC-01). Unless the drafter owns its embedding (the file holds
    embed_tokens.weight), the shared embedding is not in the file: call
    `model.load_target_embedding` before use. `target_num_layers` (with `target_class`,
    `sglang_version`, `aux_layers`: `read_draft_config`) is needed to read aux ids from a
    checkpoint without a specdraft manifest. The model holds the tensors as read (no copy)
    unless `device` or `dtype` moves them.
    """
    path = Path(path)
    if is_training_checkpoint(path):
        loaded = load_training_checkpoint(path, aux_layers)
        loaded.model.to(device=device, dtype=dtype)
        return loaded
    layout, manifest, cfg = read_draft_config(
        path, target_num_layers, target_class, sglang_version, aux_layers
    )
    tensors, files = read_weights(path)
    cfg = owned_embedding_config(cfg, manifest, tensors)
    derived = derived_tensors(tensors)  # before build_draft adds them
    model = build_draft(cfg, tensors, layout, files.entry)
    model.to(device=device, dtype=dtype)
    return LoadedDraft(model=model, manifest=manifest, layout=layout, path=path, derived=derived)


def derived_tensors(tensors: dict[str, torch.Tensor]) -> tuple[str, ...]:
    """The tensors specdraft derives for a file that lacks them: `t2d` from a 1-D `d2t` (NVIDIA
    ModelOpt exports write only d2t; t2d is the mask of d2t's target ids, `data.vocab.t2d_from_d2t`)."""
    return (
        ("t2d",) if "t2d" not in tensors and "d2t" in tensors and tensors["d2t"].dim() == 1 else ()
    )


def draft_tensors(
    cfg: DraftConfig, tensors: dict[str, torch.Tensor], layout: str, file: Path
) -> dict[str, torch.Tensor]:
    """The tensors specdraft loads from a file named in `layout`: the file's own (SGLang's legacy
    fc_norm names read as the current ones), plus the tensors `derived_tensors` names. The one rule the loader and doctor read a file by: any name that
    matches no parameter, parameter not in the file, or tensor of the wrong shape is a
    CheckpointError naming `file` and them (cases S1, FC-01)."""
    tensors = canonical_tensor_names(tensors)
    if "t2d" in derived_tensors(tensors):
        tensors["t2d"] = t2d_from_d2t(tensors["d2t"], cfg.vocab_size)
    with torch.device("meta"):
        expected = state_dict_for_layout(Eagle3Draft(cfg), layout)
    unmatched = sorted(set(tensors) - set(expected))
    missing = sorted(set(expected) - set(tensors))
    if unmatched or missing:
        raise CheckpointError(key_mismatch_message(file, layout, unmatched, missing))
    bad = [
        f"{k} {tuple(tensors[k].shape)} (expected {tuple(expected[k].shape)})"
        for k in expected
        if tensors[k].shape != expected[k].shape
    ]
    if bad:
        raise CheckpointError(
            f"{file}: tensors of the wrong shape: {'; '.join(bad)}{fc_width_hint(cfg, tensors)}"
        )
    return tensors


def build_draft(
    cfg: DraftConfig, tensors: dict[str, torch.Tensor], layout: str, file: Path
) -> Eagle3Draft:
    """A drafter whose parameters are `tensors` themselves (named in `layout`, checked by
    `draft_tensors`), cast to fc.weight's dtype where a tensor differs: built on the meta device
    and filled with `load_state_dict(assign=True)`, so loading costs the file's size, not twice it.
    A shared embedding (not in the file) is a `torch.empty` tensor (no page touched) until
    `load_target_embedding` fills it. Raises CheckpointError as `draft_tensors`."""
    tensors = draft_tensors(cfg, tensors, layout, file)
    with torch.device("meta"):
        model = Eagle3Draft(cfg)
    prefix = LAYER_PREFIX[layout]
    state = {
        ("midlayer." + k[len(prefix) :] if k.startswith(prefix) else k): v
        for k, v in tensors.items()
    }
    dtype = state["fc.weight"].dtype
    if "embed_tokens.weight" not in state:
        state["embed_tokens.weight"] = torch.empty(cfg.vocab_size, cfg.hidden_size, dtype=dtype)
    model.load_state_dict(state, strict=True, assign=True)
    model.inv_freq = rope_inv_freq(
        cfg.head_dim, cfg.rope_theta, cfg.rope_scaling
    )  # built on meta above
    model.embedding_loaded = cfg.owns_embedding
    return model.to(dtype=dtype)


def key_mismatch_message(file: Path, layout: str, unmatched: list[str], missing: list[str]) -> str:
    """One line naming the keys; suggests the rename when they sit under another layout's prefix (S1)."""
    parts = [f"{file}: {layout} layout"]
    if unmatched:
        parts.append(
            f"{len(unmatched)} tensors match no parameter: {', '.join(unmatched[:24])}"
            + (" ..." if len(unmatched) > 24 else "")
        )
    if missing:
        parts.append(
            f"{len(missing)} parameters not in the file: {', '.join(missing[:24])}"
            + (" ..." if len(missing) > 24 else "")
        )
    want = LAYER_PREFIX[layout]
    for other in set(LAYER_PREFIX.values()) - {want}:
        if any(k.startswith(other) for k in unmatched):
            parts.append(
                f"the decoder layer is stored under '{other}*' but this layout reads "
                f"'{want}*': rename them (specdraft convert --layout {layout})"
            )
    return "; ".join(parts)


def usable_vocab(manifest: Manifest | None) -> int | None:
    """How many target ids are tokens: the tokenizer length the manifest records (a target's
    vocab_size may pad its embedding past it, as Qwen-family configs do), or None when unrecorded."""
    length = ((manifest.tokenizer if manifest is not None else None) or {}).get("length")
    return (
        length if isinstance(length, int) and not isinstance(length, bool) and length > 0 else None
    )


def vocab_map_problems(model: Eagle3Draft, manifest: Manifest | None) -> list[str]:
    """The one vocabulary-map rule (FC-02, `data.vocab.validate_vocab_map`), with the bound the
    manifest records (`usable_vocab`): what inspect's audit, doctor, the engine and export refuse."""
    cfg = model.cfg
    return validate_vocab_map(
        model.d2t.cpu(),
        model.t2d.cpu(),
        cfg.vocab_size,
        cfg.draft_vocab_size,
        usable_vocab(manifest),
    )


def check_vocab_map(model: Eagle3Draft, manifest: Manifest | None, path: str | Path) -> None:
    """Raise CheckpointError naming `path` when `vocab_map_problems` finds any."""
    problems = vocab_map_problems(model, manifest)
    if problems:
        raise CheckpointError(f"{path}: its vocabulary map (d2t) is wrong: {'; '.join(problems)}")


def audit(model: Eagle3Draft, manifest: Manifest | None = None) -> list[str]:
    """Problems in the tensors a drafter saves (a shared embedding is the target's): NaN/Inf values
    and an invalid d2t/t2d map (FC-02, `vocab_map_problems`: ids past the tokenizer's length the
    manifest records included)."""
    problems = [
        f"{name} holds NaN or Inf"
        for name, t in state_dict_for_layout(model, "sglang").items()
        if not all_finite(t)
    ]
    return problems + vocab_map_problems(model, manifest)


def all_finite(t: torch.Tensor, chunk: int = 1 << 22) -> bool:
    """No NaN or Inf in `t` (True for non-float tensors), checked `chunk` elements at a time:
    isfinite of a whole bf16 weight allocates float32 temporaries of its size (a drafter's lm_head:
    hundreds of MB), chunks keep the check to a few MB whatever the tensor."""
    if not t.is_floating_point():
        return True
    flat = t.detach().reshape(-1)
    return all(bool(torch.isfinite(part).all()) for part in flat.split(chunk))


def tensor_digest(t: torch.Tensor) -> str:
    """sha256 of a tensor's raw bytes (dtype and shape included), for bit-exact comparisons."""
    h = hashlib.sha256(f"{t.dtype}{tuple(t.shape)}".encode())
    h.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy())  # hashed in place
    return h.hexdigest()


def convert_draft(
    src: str | Path,
    dst: str | Path,
    *,
    layout: str,
    target_num_layers: int | None = None,
    target_class: str | None = None,
    sglang_version: str | None = None,
    aux_layers: list[int] | None = None,
    target_architectures: list[str] | None = None,
    target_name_or_path: str | None = None,
) -> Converted:
    """Rewrite a drafter in `layout`, then re-read both and prove every tensor bit-identical and
    the drafter config the same (the ``sglang`` layout drops the manifest, so its config.json
    alone must rebuild the drafter).

    A specdraft-layout destination needs the source's manifest; speculators carries it too.
    Aux ids are read and written by the rule of `target_class` (default: the manifest's, else
    "llama") and `sglang_version`; the written file's two id lists name the same layers.
    A speculators destination records `target_name_or_path` (the --target directory) and
    `target_architectures` as its verifier, as export does (replacing another the source names:
    `verifier_replaced_note`), else the verifier the source records (its own speculators
    verifier, or the manifest's target); None when nothing names it (vLLM started on the drafter
    then has no target).
    Returns how many tensors are bit-identical to the source's, and the derived ones (the source
    has none: `derived_tensors`); raises CheckpointError when a tensor differs or is
    missing (case FC-01), or the re-read config differs. Costs about the source's size in memory
    (the written file is re-read one tensor at a time, `verify_written`).
    """
    check_output_dir(dst, source=src)
    if layout == "specdraft" and not has_manifest(src):  # before asking for the target
        with_target = (
            ""
            if target_num_layers
            else ", with --target DIR (without a manifest the aux ids need it)"
        )
        raise CheckpointError(
            f"{src}: no {MANIFEST_FILE}, which the specdraft layout carries and --target "
            f"cannot supply; convert to --layout sglang or speculators instead{with_target}"
        )
    ids = {"target_class": target_class or "llama", "sglang_version": sglang_version}
    source = load_draft(src, target_num_layers=target_num_layers, aux_layers=aux_layers, **ids)
    if target_class is None and source.manifest is not None:
        ids["target_class"] = (source.manifest.target or {}).get("target_class") or "llama"
    verifier = {} if is_training_checkpoint(src) else source_verifier(read_config(Path(src)))
    recorded = (source.manifest.target if source.manifest is not None else None) or {}
    name = target_name_or_path or verifier.get("name_or_path") or recorded.get("name_or_path")
    architectures = (
        target_architectures
        if target_name_or_path
        else (
            [recorded["architecture"]]
            if recorded.get("architecture")
            else verifier.get("architectures")
        )
    )
    save_draft(
        source.model,
        dst,
        layout=layout,
        manifest=source.manifest,
        verifier=name,
        verifier_architectures=architectures,
        **ids,
    )
    _, manifest, written = read_draft_config(dst, source.model.cfg.target_num_layers, **ids)
    written = owned_embedding_config(written, manifest, state_dict_for_layout(source.model, layout))
    if written != source.model.cfg:
        want, have = source.model.cfg.to_dict(), written.to_dict()
        differ = [f"{k} {want[k]!r} -> {have.get(k)!r}" for k in want if want[k] != have.get(k)]
        raise CheckpointError(
            f"{dst}: the drafter config reads back differently: {', '.join(differ)}"
        )
    return Converted(
        verify_written(source.model, dst, layout) - len(source.derived), source.derived
    )


def verify_written(expected: Eagle3Draft, out_dir: str | Path, layout: str) -> int:
    """Prove `out_dir`/model.safetensors (as `save_draft` and export write it) holds exactly
    `expected`'s tensors in `layout`, bit for bit. Each tensor is read back through its own
    `open_safetensors` handle and let go before the next, so proving costs one tensor's size.
    Returns how many; CheckpointError names the first that differs, is missing or is not expected."""
    want = state_dict_for_layout(expected, layout)
    file = Path(out_dir) / WEIGHTS_FILE
    with open_safetensors(file, "write it again", CheckpointError) as f:
        names = set(f.keys())
    if names != set(want):
        raise CheckpointError(
            key_mismatch_message(file, layout, sorted(names - set(want)), sorted(set(want) - names))
        )
    for name, tensor in want.items():
        with open_safetensors(file, "write it again", CheckpointError) as f:
            same = tensor_digest(f.get_tensor(name)) == tensor_digest(tensor)
        if not same:
            raise CheckpointError(f"{file}: tensor {name} differs after writing")
    return len(want)


# ---------------------------------------------------------------------------------------------
# Training checkpoints (written by specdraft.train.run_dir)


def checkpoint_paths(out_dir: str | Path) -> list[Path]:
    """Complete checkpoints under out_dir/checkpoints, oldest first: step-N.pt files (one
    process) and step-N directories (several ranks); temp names start with "." and are skipped."""
    return sorted((Path(out_dir) / CHECKPOINT_DIR).glob("step-*"))


def load_training_checkpoint(path: str | Path, aux_layers: list[int] | None = None) -> LoadedDraft:
    """The drafter of a training checkpoint (a step-N.pt file or a sharded step-N directory
    under RUN/checkpoints), on the CPU in fp32, with the manifest the checkpoint carries; its
    `training` records the step and checkpoint, the config, and the newest train and validation
    metrics (each with its own step). Layout "specdraft".

    Raises CheckpointError naming the file for a torch.save file that is no specdraft training
    checkpoint (no step and config), for a checkpoint that carries no manifest (written
    by specdraft before checkpoints did; every command's drafter config comes from it): the
    command that finishes its run is named instead;
    and for `aux_layers` (--aux-layers) other than its training layers (`refuse_other_aux_layers`).
    """
    path = Path(path)
    progress = torch.load(
        path / PROGRESS_FILE if path.is_dir() else path, map_location="cpu", weights_only=False
    )
    if not isinstance(progress, dict) or not {"step", "config"} <= set(progress):
        raise CheckpointError(
            f"{path}: a torch.save file but no specdraft training checkpoint (no step and "
            f"config); pass {SOURCE_FORMS}"
        )
    if "manifest" not in progress:
        run = path.parent.parent
        finish = (
            f"finish its run (specdraft train SOURCE {run} --resume) and pass {run / 'draft'} instead"
            if path.parent.name == CHECKPOINT_DIR
            else "finish the run that wrote it and pass its draft/ instead"
        )
        raise CheckpointError(
            f"{path}: this checkpoint carries no drafter manifest (written by an older "
            f"specdraft), and its drafter is built from one, so no command can read it; {finish}"
        )
    manifest = Manifest(**progress["manifest"])
    draft = Eagle3Draft(DraftConfig.from_dict(manifest.draft))
    refuse_other_aux_layers(path, draft.cfg.aux_layers, aux_layers)
    model_state = _sharded_model_state(path, draft) if path.is_dir() else progress["model"]
    draft.load_state_dict(
        {k.removeprefix("draft."): v for k, v in model_state.items()}, strict=True
    )
    draft.embedding_loaded = True
    manifest.training = {
        "steps": progress["step"],
        "checkpoint": str(path),
        **progress["records"],
        "extensions": progress["extensions"],
        "config": progress["config"],
    }
    return LoadedDraft(model=draft, manifest=manifest, layout="specdraft", path=path)


def _sharded_model_state(path: Path, draft: Eagle3Draft) -> dict[str, torch.Tensor]:
    """The drafter's full tensors from a torch.distributed.checkpoint directory, read in this
    one process (shards of any world size are gathered into `draft`-shaped tensors)."""
    state = {"model": {f"draft.{k}": v.clone() for k, v in draft.state_dict().items()}}
    read_sharded(state, path, one_process=True)
    return state["model"]


def read_sharded(state: dict[str, Any], path: Path, one_process: bool) -> None:
    """Load the torch.distributed.checkpoint directory `path` into `state` in place, resharded to
    `state`'s tensors: each rank its shards (a collective), or with `one_process` whole tensors
    read here, whatever number of ranks wrote them."""
    import warnings

    import torch.distributed.checkpoint as dcp

    with (
        warnings.catch_warnings()
    ):  # "... assuming the intent is to load in a single process": it is
        warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        dcp.load(state, checkpoint_id=path, no_dist=one_process)
