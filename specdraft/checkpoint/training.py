"""The training checkpoints a run writes under RUN/checkpoints (by `specdraft.train.run_dir`),
read here so that loading a drafter never imports the trainer: step-N.pt files (one process)
and sharded step-N directories (torch.distributed.checkpoint, several ranks)."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import torch

from specdraft.checkpoint.config_read import refuse_other_aux_layers
from specdraft.checkpoint.dirs import PROGRESS_FILE, is_training_checkpoint
from specdraft.checkpoint.layouts import SOURCE_FORMS, CheckpointError, dflash_refusal
from specdraft.checkpoint.manifest import LoadedDraft, Manifest
from specdraft.checkpoint.weights import DamagedCheckpoint
from specdraft.dflash import DFlashDraft
from specdraft.draft import Eagle3Draft
from specdraft.draft_config import DraftConfig

CHECKPOINT_DIR = "checkpoints"  # a training run's checkpoints: RUN/checkpoints/step-N.pt or step-N/


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
    checkpoint (no step and config), DamagedCheckpoint for one cut short or damaged (torch.load
    fails), CheckpointError for a checkpoint that carries no manifest (written
    by specdraft before checkpoints did; every command's drafter config comes from it): the
    command that finishes its run is named instead; for a DFlash run's (`dflash_refusal`: the
    commands that take DFlash drafters read it with `load_dflash_training_checkpoint`);
    and for `aux_layers` (--aux-layers) other than its training layers (`refuse_other_aux_layers`).
    """
    path = Path(path)
    progress = _progress(path)
    if (progress.get("config") or {}).get("method") == "dflash":
        raise dflash_refusal(path)
    manifest = Manifest(**progress["manifest"])
    draft = Eagle3Draft(DraftConfig.from_dict(manifest.draft))
    refuse_other_aux_layers(path, draft.cfg.aux_layers, aux_layers)
    _fill(draft, path, progress)
    draft.embedding_loaded = True
    manifest.training = _training_record(path, progress)
    return LoadedDraft(model=draft, manifest=manifest, layout="specdraft", path=path)


def load_dflash_training_checkpoint(path: str | Path) -> tuple[DFlashDraft, Manifest]:
    """(drafter, manifest) of a `--method dflash` run's training checkpoint (a step-N.pt file or
    a sharded step-N directory), as `load_training_checkpoint` reads an EAGLE-3 run's: on the CPU
    in fp32, strict, the manifest's `training` the checkpoint's record; the target's embedding
    and lm_head not loaded (`DFlashDraft.load_target_head`). Raises what that raises, and
    CheckpointError naming the file for an EAGLE-3 run's checkpoint."""
    from specdraft.dflash import DFlashConfig

    path = Path(path)
    progress = _progress(path)
    if (progress.get("config") or {}).get("method") != "dflash":
        raise CheckpointError(
            f"{path}: an EAGLE-3 run's training checkpoint, read here as a DFlash drafter's; "
            "give it to a command as an EAGLE-3 drafter"
        )
    manifest = Manifest(**progress["manifest"])
    draft = DFlashDraft(DFlashConfig(**manifest.draft))
    _fill(draft, path, progress)
    manifest.training = _training_record(path, progress)
    return draft, manifest


def training_method(path: str | Path) -> str | None:
    """The --method of the training checkpoint at `path` ("eagle3" | "dflash", from its saved
    config; its tensors memory-mapped, not read), None for a path that is no readable specdraft
    training checkpoint (`is_training_checkpoint`)."""
    path = Path(path)
    if not is_training_checkpoint(path):
        return None
    file = path / PROGRESS_FILE if path.is_dir() else path
    try:
        progress = torch.load(file, map_location="cpu", weights_only=False, mmap=True)
    except (RuntimeError, OSError, EOFError, pickle.UnpicklingError):
        return None
    config = progress.get("config") if isinstance(progress, dict) else None
    return (config.get("method") or "eagle3") if isinstance(config, dict) else None


def _progress(path: Path) -> dict[str, Any]:
    """A training checkpoint's progress state with its manifest; CheckpointError (module doc of
    `load_training_checkpoint`) for a file that is none, or that carries no manifest."""
    progress = _read_progress(path / PROGRESS_FILE if path.is_dir() else path)
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
    return progress


def _fill(draft: torch.nn.Module, path: Path, progress: dict[str, Any]) -> None:
    """Load the checkpoint's model tensors (the trainer's "draft." names) into `draft`, strictly."""
    model_state = _sharded_model_state(path, draft) if path.is_dir() else progress["model"]
    draft.load_state_dict(
        {k.removeprefix("draft."): v for k, v in model_state.items()}, strict=True
    )


def _training_record(path: Path, progress: dict[str, Any]) -> dict[str, Any]:
    """The manifest's `training` of a checkpoint: its step and file, records, extensions, config."""
    return {
        "steps": progress["step"],
        "checkpoint": str(path),
        **progress["records"],
        "extensions": progress["extensions"],
        "config": progress["config"],
    }


def _read_progress(file: Path) -> Any:
    """`torch.load` of a training checkpoint's progress file (the trainer's own pickle: model,
    optimizer, records); DamagedCheckpoint naming `file` when it is cut short or damaged."""
    try:
        return torch.load(file, map_location="cpu", weights_only=False)
    except (RuntimeError, OSError, EOFError, pickle.UnpicklingError) as e:
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise DamagedCheckpoint(
            f"{file}: cannot be read as a training checkpoint, cut short or damaged ({reason}); "
            "pass another of the run's checkpoints, or its draft/"
        ) from None


def _sharded_model_state(path: Path, draft: torch.nn.Module) -> dict[str, torch.Tensor]:
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
