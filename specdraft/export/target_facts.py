"""What export and doctor need to know about the target (`TargetFacts`), and where it came
from: the target directory's config.json, else the manifest's record of it at training."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specdraft.checkpoint import (
    CheckpointError,
    Manifest,
)
from specdraft.draft_config import rope_from_hf_config


@dataclass(frozen=True)
class TargetFacts:
    """What export and doctor need to know about the target, and where it came from.

    source: "target DIR" (its config.json) or "manifest". target_class: one of
    `conventions.TARGET_CLASSES` | None (unknown). rope_* / max_position_embeddings: None when the source does not say.
    """

    num_layers: int
    hidden_size: int
    vocab_size: int
    target_class: str | None
    architecture: str | None
    rope_theta: float | None
    rope_scaling: dict[str, Any] | None
    max_position_embeddings: int | None
    name_or_path: str | None
    source: str

    @classmethod
    def from_target_dir(cls, path: str | Path, trust_remote_code: bool = False) -> TargetFacts:
        """Read a transformers target directory's config.json (nothing else is loaded), as
        published (`target.read_target_config`: no prompt, no quantization kernels; remote code
        only with `trust_remote_code`)."""
        from specdraft.targets.config import (
            read_target_config,
            target_class_of,
        )  # the engines' class table

        path = Path(path)
        full = read_target_config(path, trust_remote_code)
        text = full.get_text_config()
        theta, scaling = rope_from_hf_config(lambda k, d=None: getattr(text, k, d))
        architecture = (full.architectures or [None])[0]
        return cls(
            text.num_hidden_layers,
            text.hidden_size,
            text.vocab_size,
            target_class_of(architecture, text.model_type),
            architecture,
            theta,
            scaling,
            getattr(text, "max_position_embeddings", None),
            str(path.resolve()),
            f"target {path}",
        )

    @classmethod
    def from_manifest(cls, manifest: Manifest) -> TargetFacts:
        """The target as the manifest recorded it at training (CheckpointError when too thin)."""
        from specdraft.targets.config import recorded_target_class

        t, draft = manifest.target or {}, manifest.draft or {}
        num_layers = t.get("num_layers") or draft.get("target_num_layers")
        hidden = t.get("hidden_size") or draft.get("target_hidden_size")
        vocab = t.get("vocab_size") or draft.get("vocab_size")
        if not (num_layers and hidden and vocab):
            raise CheckpointError(
                "the manifest does not record the target's layer count, hidden "
                "size and vocabulary; pass the target (--target DIR)"
            )
        target_class = recorded_target_class(t)  # older manifests: Llava, Qwen as "llama"
        return cls(
            num_layers,
            hidden,
            vocab,
            target_class,
            t.get("architecture"),
            t.get("rope_theta"),
            t.get("rope_scaling"),
            t.get("max_position_embeddings"),
            t.get("name_or_path"),
            "manifest",
        )


def resolve_target(target: str | Path | None, manifest: Manifest | None) -> TargetFacts | None:
    """TargetFacts from the target directory when given, else from the manifest, else None."""
    if target is not None:
        return TargetFacts.from_target_dir(target)
    return TargetFacts.from_manifest(manifest) if manifest is not None else None
