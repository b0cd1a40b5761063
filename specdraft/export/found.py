"""Exports already on disk: where specdraft writes a drafter's exports, and whether a directory
there is an export of that very drafter, so that a launch line names the export a user has
rather than a new folder."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from specdraft.checkpoint import MANIFEST_FILE, CheckpointError, Manifest


def export_dir_beside_run(draft_dir: Path, engine: str) -> Path:
    """Where the demo writes `engine`'s export of its drafter RUN/draft: EXPORTS/ENGINE beside the
    run, OUT/export/ENGINE for OUT/train/draft."""
    return Path(draft_dir).parent.parent / "export" / engine


def suggested_export_dir(draft_dir: Path | str, engine: str) -> Path:
    """Where tune's `specdraft export` line writes a new export: DRAFT-ENGINE beside DRAFT."""
    return Path(f"{str(draft_dir).rstrip('/')}-{engine}")


def existing_export(draft_dir: Path | str, engine: str) -> Path | None:
    """An export of `draft_dir` for `engine` ("sglang" | "vllm") already on disk at
    `export_dir_beside_run` or `suggested_export_dir`: a directory whose manifest records an
    export for `engine` (extra["export"]["engine"], as `export_draft` writes it) and is otherwise
    the source's own manifest (the same training record: the same drafter). None when there is
    none, or when `draft_dir` has no readable manifest."""
    source = _manifest(Path(draft_dir))
    if source is None:
        return None
    for candidate in (
        export_dir_beside_run(Path(draft_dir), engine),
        suggested_export_dir(draft_dir, engine),
    ):
        found = _manifest(candidate)
        if found is None or found.extra.get("export", {}).get("engine") != engine:
            continue
        if _without_export(found) == _without_export(source):
            return candidate
    return None


def _manifest(directory: Path) -> Manifest | None:
    try:
        return Manifest.read(directory / MANIFEST_FILE)
    except (CheckpointError, OSError, ValueError):
        return None


def _without_export(manifest: Manifest) -> Manifest:
    extra = {k: v for k, v in manifest.extra.items() if k != "export"}
    return dataclasses.replace(manifest, extra=extra)
