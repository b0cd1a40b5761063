"""The three drafter layouts as tables: file names, key prefixes, the tensors each stores.

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

Each layout's config.json is written by `config_write` and read back by `config_read`; the
manifest is `manifest.Manifest`. CheckpointError, the package's error, names the file
(InvalidCheckpointFile: a config.json or manifest that is not valid).
"""

from __future__ import annotations

from pathlib import Path

import torch

from specdraft.conventions import ENGINE_NAMES
from specdraft.conventions.config_reads import LLAMA_EAGLE3_ARCHITECTURES
from specdraft.conventions.engines import (
    engines_serving_architecture,
    engines_serving_speculators,
)
from specdraft.dflash import DFLASH_ARCHITECTURE
from specdraft.draft import Eagle3Draft
from specdraft.errors import SpecdraftError, UnusableInput

LAYOUTS = ("specdraft", "sglang", "speculators")
MANIFEST_FILE = "specdraft_manifest.json"
WEIGHTS_FILE = "model.safetensors"
OFFICIAL_ARCHITECTURES = ("LlamaForCausalLMEagle3",)
# The architectures read as the official drafter, in the official layout: vLLM's own name of it
# too (`conventions.config_reads.LLAMA_EAGLE3_ARCHITECTURES`); files are written with the official.
READ_ARCHITECTURES = LLAMA_EAGLE3_ARCHITECTURES
# Decoder-layer prefix of each layout (the only name that differs between them).
LAYER_PREFIX = {"specdraft": "midlayer.", "sglang": "midlayer.", "speculators": "layers.0."}
# The two names of the decoder layer a file may use in any layout (convert's --layer-names): vLLM
# 0.32 and SGLang >= 0.5.12 read either (`conventions.DRAFT_LOADING`); NVIDIA ModelOpt's
# EagleExporter and TorchSpec write `layers.0` under the official architecture.
LAYER_NAMES = ("midlayer", "layers.0")
# SGLang's legacy names of the fc_norm tensors (sglang 0.5.23 srt/models/llama_eagle3.py
# `legacy_name_map`), read as the current names.
LEGACY_TENSOR_NAMES = {
    "aux_norm_low.": "fc_norm.0.",
    "aux_norm_mid.": "fc_norm.1.",
    "aux_norm_high.": "fc_norm.2.",
}
SOURCE_FORMS = (
    "a drafter directory (config.json, model.safetensors) or a training checkpoint "
    "(RUN/checkpoints/step-N.pt)"
)  # what load_draft reads: export's CHECKPOINT, the engine's --draft


class CheckpointError(SpecdraftError, ValueError):
    """A draft checkpoint that cannot be loaded exactly as written; the message names the file."""


class InvalidCheckpointFile(CheckpointError, UnusableInput):
    """A drafter's config.json or manifest that is no valid file of its kind (not JSON, no
    object, keys it must hold missing or unknown): an unusable input, which the CLI exits 2 for
    in every command, as doctor does."""


def dflash_refusal(where: str | Path) -> CheckpointError:
    """The one line for a DFlash drafter (its config, manifest or training checkpoint) given to a
    command or option that reads EAGLE-3 drafters only; inspect, export, doctor, generate, serve
    and tune read a DFlash drafter's directory, and all but doctor its run's training checkpoints
    (`checkpoint.dflash.is_dflash_drafter`)."""
    return CheckpointError(
        f"{where}: a DFlash drafter ({DFLASH_ARCHITECTURE}), which this reads as EAGLE-3 only; "
        "inspect, export, doctor, generate, serve and tune take its drafter directory (RUN/draft, "
        "or an export), all but doctor its RUN/checkpoints/step-N.pt too"
    )


class UnreadableCheckpointFile(SpecdraftError, OSError):
    """A drafter file the OS would not let specdraft read (permissions, a directory in its place);
    the message names the file and the fix. An OSError, as the error it replaces, whose
    `strerror` keeps the OS's reason for callers that print their own line."""

    def __init__(self, message: str, strerror: str | None = None) -> None:
        super().__init__(message)
        self.strerror = strerror


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


def state_dict_for_layout(
    model: Eagle3Draft, layout: str, layer_names: str | None = None
) -> dict[str, torch.Tensor]:
    """The tensors one layout stores, under that layout's names (contiguous, detached), the
    decoder layer under `layer_names` (one of LAYER_NAMES; None: the layout's own, LAYER_PREFIX).

    The shared embedding is left out unless the drafter owns it (SGLang and vLLM take the
    target's embedding when the widths match).
    """
    check_layout(layout)
    prefix = layer_prefix(layout, layer_names)
    out = {}
    for name, tensor in model.state_dict().items():
        if name == "embed_tokens.weight" and not model.cfg.owns_embedding:
            continue
        if name.startswith("midlayer."):
            name = prefix + name[len("midlayer.") :]
        out[name] = tensor.detach().contiguous()
    return out


def check_layout(layout: str) -> None:
    """Raise CheckpointError (a ValueError) unless `layout` is one of LAYOUTS."""
    if layout not in LAYOUTS:
        raise CheckpointError(f"unknown layout {layout!r}: choose one of {', '.join(LAYOUTS)}")


def layer_prefix(layout: str, layer_names: str | None = None) -> str:
    """The decoder-layer prefix a file of `layout` is written with: `layer_names` + "." (one of
    LAYER_NAMES), else the layout's own (LAYER_PREFIX); CheckpointError for another name."""
    if layer_names is None:
        return LAYER_PREFIX[layout]
    if layer_names not in LAYER_NAMES:
        raise CheckpointError(
            f"unknown layer names {layer_names!r}: choose one of {', '.join(LAYER_NAMES)}"
        )
    return layer_names + "."


def file_layer_names(tensors) -> str | None:
    """The one of LAYER_NAMES a file names its decoder layer with (None: neither, or both)."""
    found = [n for n in LAYER_NAMES if any(k.startswith(n + ".") for k in tensors)]
    return found[0] if len(found) == 1 else None


def canonical_tensor_names(
    tensors: dict[str, torch.Tensor], layout: str
) -> dict[str, torch.Tensor]:
    """`tensors` under `layout`'s names, as the engines read them: SGLang's legacy fc_norm names
    (`LEGACY_TENSOR_NAMES`) renamed to the current ones, and a decoder layer stored under the
    other of LAYER_NAMES only (ModelOpt's and TorchSpec's `layers.0.*` in the official layout)
    renamed to the layout's prefix. A file using both names is left as it is (the loader names
    the strays)."""
    own = LAYER_PREFIX[layout]
    names = file_layer_names(tensors)
    other = names + "." if names is not None and names + "." != own else None

    def rename(name: str) -> str:
        for legacy, new in LEGACY_TENSOR_NAMES.items():
            if name.startswith(legacy):
                return new + name[len(legacy) :]
        if other is not None and name.startswith(other):
            return own + name[len(other) :]
        return name

    return {rename(name): tensor for name, tensor in tensors.items()}
