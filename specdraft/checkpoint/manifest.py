"""What a drafter records of its training (the manifest, specdraft_manifest.json), and what
loading a drafter gives back (`LoadedDraft`: the model with its manifest, layout and path)."""

from __future__ import annotations

import json
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from specdraft import __version__
from specdraft.checkpoint.layouts import (
    MANIFEST_FIX,
    InvalidCheckpointFile,
    UnreadableCheckpointFile,
    dflash_refusal,
)
from specdraft.draft import Eagle3Draft
from specdraft.files import unreadable


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

    def target_class(self) -> str | None:
        """The target's rule class as recorded (`targets.classes.recorded_target_class`: from the
        recorded architecture first, so a record written before the "qwen" class reads Qwen2 /
        Qwen3 as "qwen", not the "llama" it says); None when the record names neither."""
        from specdraft.targets.classes import recorded_target_class

        return recorded_target_class(self.target or {})

    def to_json(self) -> str:
        """Pretty JSON with sorted keys."""
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    @classmethod
    def read(cls, path: Path, *, dflash: bool = False) -> Manifest:
        """Read a manifest file; bad JSON (or not text), no object, unknown or missing keys raise
        InvalidCheckpointFile naming the file, a file the OS will not read
        UnreadableCheckpointFile. A DFlash drafter's manifest is refused (`dflash_refusal`)
        unless the caller reads DFlash drafters (`dflash`)."""
        try:
            data = json.loads(Path(path).read_text())
        except json.JSONDecodeError as e:
            raise InvalidCheckpointFile(f"{path}: not valid JSON ({e}); {MANIFEST_FIX}") from e
        except UnicodeDecodeError as e:
            raise InvalidCheckpointFile(
                f"{path}: not valid JSON ({unreadable(e)}); {MANIFEST_FIX}"
            ) from e
        except OSError as e:
            reason = unreadable(e)
            raise UnreadableCheckpointFile(
                f"{path}: cannot be read ({reason}); {MANIFEST_FIX}", reason
            ) from e
        if not isinstance(data, dict):
            raise InvalidCheckpointFile(
                f"{path}: not a JSON object (a {type(data).__name__}); {MANIFEST_FIX}"
            )
        if (data.get("extra") or {}).get("method") == "dflash" and not dflash:
            raise dflash_refusal(path)
        unknown = sorted(set(data) - set(cls.__dataclass_fields__))
        if unknown:
            raise InvalidCheckpointFile(
                f"{path}: unknown manifest keys {unknown} (a newer specdraft's?): upgrade "
                f"specdraft, or {MANIFEST_FIX}"
            )
        missing = sorted(
            f.name
            for f in fields(cls)
            if f.name not in data and f.default is MISSING and f.default_factory is MISSING
        )
        if missing:
            raise InvalidCheckpointFile(f"{path}: manifest keys {missing} missing; {MANIFEST_FIX}")
        return cls(**data)


@dataclass
class LoadedDraft:
    """A drafter read from disk: the model, its manifest (None outside specdraft layout), its layout,
    and the tensors specdraft derived because the file lacks them (`derived_tensors`)."""

    model: Eagle3Draft
    manifest: Manifest | None
    layout: str
    path: Path
    derived: tuple[str, ...] = ()
