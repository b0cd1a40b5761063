"""Strict load of a drafter in any of the three layouts: the layout detected from its files,
its DraftConfig (`config_read`), its tensors (`weights`), the model built on them.

Every loader in the field drops unknown keys silently. Here a key that matches nothing, a
parameter that nothing fills, a tensor of the wrong shape, or a config flag specdraft does not
implement is an error naming them (cases S1, FC-01).
"""

from __future__ import annotations

from pathlib import Path

import torch

from specdraft.checkpoint.config_read import (
    config_from_files,
    fc_width_hint,
    owned_embedding_config,
)
from specdraft.checkpoint.dflash_forms import weights_kind
from specdraft.checkpoint.dirs import (
    classify_dir,
    is_training_checkpoint,
    plain_architecture_message,
    read_config,
    unimplemented_architecture_message,
    wrong_dir_message,
)
from specdraft.checkpoint.layouts import (
    DRAFTER_CONFIG_FIX,
    LAYER_PREFIX,
    MANIFEST_FILE,
    READ_ARCHITECTURES,
    CheckpointError,
    canonical_tensor_names,
    dflash_refusal,
    state_dict_for_layout,
)
from specdraft.checkpoint.manifest import LoadedDraft, Manifest
from specdraft.checkpoint.training import load_training_checkpoint
from specdraft.checkpoint.weights import read_weights
from specdraft.conventions.config_reads import TRAINER_ARCHITECTURE
from specdraft.data.vocab import t2d_from_d2t
from specdraft.dflash import DFLASH_ARCHITECTURE
from specdraft.draft import Eagle3Draft
from specdraft.draft_config import DraftConfig
from specdraft.draft_rope import rope_inv_freq


def detect_layout(path: Path) -> str:
    """Layout of a checkpoint directory, from its files; CheckpointError when none matches. The
    official EAGLE-3 trainer's drafter config (architectures LlamaForCausalLM and a drafter key,
    `conventions.config_reads.TRAINER_ARCHITECTURE`) is the official layout, as vLLM reads it."""
    config = read_config(path)
    if config.get("speculators_model_type") is not None:
        if config["speculators_model_type"] != "eagle3":
            raise CheckpointError(
                f"{path}/config.json: speculators_model_type "
                f"{config['speculators_model_type']!r} is not an EAGLE-3 drafter"
            )
        return "speculators"
    architectures = config.get("architectures") or []
    if DFLASH_ARCHITECTURE in architectures:
        raise dflash_refusal(f"{path}/config.json")
    if any(a in READ_ARCHITECTURES for a in architectures):
        return "specdraft" if (path / MANIFEST_FILE).exists() else "sglang"
    if (
        any("eagle" in str(a).lower() for a in architectures)
        and classify_dir(path).kind == "drafter"
    ):
        raise CheckpointError(unimplemented_architecture_message(path, architectures))
    wrong = wrong_dir_message(path, "drafter")
    if wrong:
        raise CheckpointError(wrong)
    if classify_dir(path).kind == "drafter":  # a drafter key (e.g. draft_vocab_size), a plain class
        if architectures == [TRAINER_ARCHITECTURE]:  # the official trainer's: vLLM's drafter
            return "specdraft" if (path / MANIFEST_FILE).exists() else "sglang"
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
    of a manifest-less file are read by `config_read.aux_layers_of_config` (target class, SGLang
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
    derived = derived_tensors(tensors, cfg.vocab_size)  # before build_draft adds them
    model = build_draft(cfg, tensors, layout, files.entry)
    model.to(device=device, dtype=dtype)
    return LoadedDraft(model=model, manifest=manifest, layout=layout, path=path, derived=derived)


def derived_tensors(tensors: dict[str, torch.Tensor], vocab_size: int) -> tuple[str, ...]:
    """The tensors specdraft derives for a file that lacks them: `t2d` from a 1-D `d2t` (NVIDIA
    ModelOpt exports write only d2t; t2d is the mask of d2t's target ids, `data.vocab.t2d_from_d2t`);
    both as the identity map when the file has neither and its lm_head.weight has `vocab_size`
    rows, the target's whole vocabulary (TorchSpec's full-vocabulary drafters: vLLM reads no d2t
    as the identity, `conventions.config_reads.ABSENT_DRAFT_VOCAB_READ`)."""
    if "t2d" not in tensors and "d2t" in tensors and tensors["d2t"].dim() == 1:
        return ("t2d",)
    head = tensors.get("lm_head.weight")
    if "d2t" in tensors or "t2d" in tensors or head is None or head.dim() != 2:
        return ()
    return ("d2t", "t2d") if head.shape[0] == vocab_size else ()


def draft_tensors(
    cfg: DraftConfig, tensors: dict[str, torch.Tensor], layout: str, file: Path
) -> dict[str, torch.Tensor]:
    """The tensors specdraft loads from a file named in `layout`: the file's own (SGLang's legacy
    fc_norm names, and a decoder layer under the other of `LAYER_NAMES`, read as the layout's:
    `canonical_tensor_names`), plus the tensors `derived_tensors` names. The one rule the loader and doctor read a file by: any name that
    matches no parameter, parameter not in the file, or tensor of the wrong shape is a
    CheckpointError naming `file` and them (cases S1, FC-01)."""
    tensors = canonical_tensor_names(tensors, layout)
    derived = derived_tensors(tensors, cfg.vocab_size)
    if "d2t" in derived:  # the identity map: offsets 0, every target id a draft id
        tensors["d2t"] = torch.zeros(cfg.vocab_size, dtype=torch.int64)
        tensors["t2d"] = torch.ones(cfg.vocab_size, dtype=torch.bool)
    elif "t2d" in derived:
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
    if weights_kind(unmatched) == "dflash":
        parts.append(
            f"these are a DFlash drafter's tensors (hidden_norm, layers.N.self_attn.q_norm): its "
            f"config.json should name {DFLASH_ARCHITECTURE} (specdraft export RUN/draft OUT writes it)"
        )
    want = LAYER_PREFIX[layout]
    for other in set(LAYER_PREFIX.values()) - {want}:
        if any(k.startswith(other) for k in unmatched):
            parts.append(
                f"the decoder layer is stored under '{other}*' but this layout reads "
                f"'{want}*': rename them (specdraft convert --layout {layout})"
            )
    return "; ".join(parts)
