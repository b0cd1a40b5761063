"""A training run's directory: checkpoints (written, pruned, resumed from), metrics log, final drafter.

    RUN/checkpoints/step-N.pt     one process: the whole training state (torch.save)
    RUN/checkpoints/step-N/       several ranks: torch.distributed.checkpoint shards + PROGRESS_FILE
    RUN/metrics.jsonl             one JSON record per train step / validation
    RUN/tensorboard/              the same scalars
    RUN/draft/                    the final drafter (specdraft layout)

Resume is exact: a checkpoint holds the draft, optimizer, scheduler, RNG states and the data
position; the data order is a function of (seed, epoch), so a resumed run repeats the same
batches and, on the CPU in fp32, ends with the same weights bit for bit. Either kind of
checkpoint resumes on any number of ranks (weights and optimizer state are resharded on load);
a run resumed with another grad_accum_steps or number of ranks agrees with an uninterrupted one
to rounding. Each checkpoint carries the drafter's manifest, so `specdraft export` can write the
drafter of any of them (`specdraft.checkpoint.load_training_checkpoint`, which reads them).
Every file is written under a temporary name and renamed (`specdraft.files`); rank 0 writes
metrics and the final drafter.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from specdraft.checkpoint import (
    CHECKPOINT_DIR,
    PROGRESS_FILE,
    Manifest,
    checkpoint_paths,
    save_draft,
)
from specdraft.checkpoint.dflash import save_dflash_draft
from specdraft.dflash import DFlashDraft
from specdraft.draft import Eagle3Draft
from specdraft.errors import SettingsMismatch
from specdraft.files import atomic_write, atomic_write_text, replace_dir
from specdraft.train.errors import RunDirInUse
from specdraft.train.sources import TargetInfo
from specdraft.train.store_data import describe_target, same_target

METRICS_FILE = "metrics.jsonl"
# What a run directory holds; an OUT with other files only is not one, and is refused.
RUN_ENTRIES = frozenset({CHECKPOINT_DIR, METRICS_FILE, "tensorboard", "draft"})


def checkpoint_config(path: Path) -> dict[str, Any]:
    """The TrainConfig dict a checkpoint of `checkpoint_paths` was written with (its weights are
    mapped, not read)."""
    return checkpoint_progress(path)["config"]


def checkpoint_progress(path: Path) -> dict[str, Any]:
    """A checkpoint's state (`Trainer.progress_state` keys; weights mapped, not read)."""
    path = Path(path)
    return torch.load(
        path / PROGRESS_FILE if path.is_dir() else path,
        map_location="cpu",
        weights_only=False,
        mmap=not path.is_dir(),
    )


def check_run_dir(out_dir: Path) -> None:
    """RunDirInUse (a FileExistsError) unless `out_dir` is missing, empty or a run directory
    (RUN_ENTRIES): a file, or a directory of other files only, would get checkpoints mixed into it."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise RunDirInUse(
            f"{out_dir} is a file; the run directory OUT must be a directory (it receives "
            "checkpoints/, metrics.jsonl, tensorboard/, draft/): give a new directory"
        )
    entries = sorted(p.name for p in out_dir.iterdir()) if out_dir.is_dir() else []
    if entries and not RUN_ENTRIES & set(entries):
        shown = ", ".join(entries[:3]) + (", ..." if len(entries) > 3 else "")
        raise RunDirInUse(
            f"{out_dir} holds no training run but other files ({shown}): give a new or empty "
            f"directory as OUT (--resume continues a run directory)"
        )


def check_same_data(
    saved: dict[str, Any], info: TargetInfo, num_samples: int, source: Path
) -> None:
    """Refuse to resume the checkpoint `source`, whose state is `saved` (`Trainer.progress_state`),
    on data of another target (`sources.same_target`), other aux layers, or other samples than
    `info`'s (`num_samples` of them): the data hash the checkpoint's manifest records
    (`specdraft.data.data_hash`, from the store's index or the --online data as rendered) against
    `info`'s. Its weights and its place in the data order fit its own data only, and the manifest
    would record the new data as the drafter's. What a checkpoint does not record (older
    specdraft: no manifest, no data hash, no sample count) is not checked. Raises SettingsMismatch
    (a ValueError) naming what differs."""
    manifest = saved.get("manifest") or {}
    target, layers = manifest.get("target"), tuple(manifest.get("aux_layers") or ())
    now = info.manifest_fields.get("target")
    diffs = []
    if target and now and not same_target(target, now):
        diffs.append(f"target {describe_target(target)} -> {describe_target(now)}")
    if layers and layers != tuple(info.aux_layers):
        diffs.append(
            f"aux layers {','.join(map(str, layers))} -> {','.join(map(str, info.aux_layers))}"
        )
    was_hash, now_hash = manifest.get("data_hash"), info.manifest_fields.get("data_hash")
    if was_hash and now_hash and was_hash != now_hash:
        diffs.append(
            f"data hash {_describe_data(was_hash, saved.get('num_samples'))} -> "
            f"{_describe_data(now_hash, num_samples)}"
        )
    if diffs:
        raise SettingsMismatch(
            f"{source}: this checkpoint was trained on other data ({'; '.join(diffs)}): resume with "
            f"the store (or --online data file and --target) it was trained on, or train into a new "
            f"OUT directory"
        )


def _describe_data(digest: str, num_samples: int | None) -> str:
    """A data hash in a few words: its first 12 hex digits, and the sample count when known."""
    return f"{digest[:12]} ({num_samples} samples)" if num_samples is not None else digest[:12]


def write_checkpoint(state: dict[str, Any], out_dir: Path, keep: int) -> Path:
    """Write `state` atomically (`files.atomic_write`); keep the newest `keep` checkpoints."""
    path = Path(out_dir) / CHECKPOINT_DIR / f"step-{state['step']:08d}.pt"
    atomic_write(path, lambda tmp: torch.save(state, tmp))
    _prune(out_dir, keep)
    return path


def write_sharded_checkpoint(trainer: Any, out_dir: Path) -> Path:
    """Write a trainer.Trainer's state with torch.distributed.checkpoint, atomically; a collective.

    Every rank writes its shards of the draft and optimizer (`Trainer.sharded_state`) into
    out_dir/checkpoints/.step-N.tmp and rank 0 adds PROGRESS_FILE (`Trainer.progress_state`);
    after a barrier rank 0 puts the directory in place as step-N (`files.replace_dir`) and keeps the newest
    `keep_checkpoints`. A run killed while writing leaves only the temp directory, which the
    next write of that step replaces. Returns the checkpoint directory.
    """
    import torch.distributed.checkpoint as dcp

    ranks = trainer.ranks
    folder = Path(out_dir) / CHECKPOINT_DIR
    path = folder / f"step-{trainer.step:08d}"
    tmp = (
        folder / f".{path.name}.tmp"
    )  # one name for all ranks (not files.temp_path's per-process one)
    if ranks.main:
        folder.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)
    ranks.barrier()
    dcp.save(trainer.sharded_state(), checkpoint_id=tmp)
    if ranks.main:
        torch.save(trainer.progress_state(), tmp / PROGRESS_FILE)
    ranks.barrier()
    if ranks.main:
        replace_dir(tmp, path)
        _prune(out_dir, trainer.config.keep_checkpoints)
    ranks.barrier()
    return path


def _prune(out_dir: Path, keep: int) -> None:
    """Delete all but the newest `keep` checkpoints (files or directories)."""
    for old in checkpoint_paths(out_dir)[:-keep]:
        if old.is_dir():
            shutil.rmtree(old)
        else:
            old.unlink()


class MetricsLog:
    """metrics.jsonl (one JSON record per line) plus TensorBoard scalars, on rank 0 only.

    On resume from step s, records after s (written by the interrupted run) are dropped from
    both, so the log reads as one uninterrupted run.
    """

    def __init__(self, out_dir: Path, enabled: bool, resume_step: int | None) -> None:
        self.path, self.enabled, self.writer = Path(out_dir) / METRICS_FILE, enabled, None
        if not enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if resume_step is not None and self.path.exists():
            keep = [
                ln
                for ln in self.path.read_text().splitlines()
                if ln and json.loads(ln)["step"] <= resume_step
            ]
            atomic_write_text(self.path, "".join(ln + "\n" for ln in keep))
        elif resume_step is None:
            self.path.unlink(missing_ok=True)
        from torch.utils.tensorboard import SummaryWriter  # lazy: tensorboard is an extra

        self.writer = SummaryWriter(str(Path(out_dir) / "tensorboard"), purge_step=resume_step)

    def write(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        split, step = record["split"], record["step"]
        for key in ("loss", "lr", "grad_norm", "tau"):
            if key in record:
                self.writer.add_scalar(f"{split}/{key}", record[key], step)
        for key in ("accuracy", "alpha", "step_losses"):
            for k, value in enumerate(record.get(key, [])):
                self.writer.add_scalar(f"{split}/{key}/{k}", value, step)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def save_final_draft(
    draft: Eagle3Draft | DFlashDraft, out_dir: Path, manifest: Manifest, training: dict[str, Any]
) -> Path:
    """Save the trained drafter in the specdraft layout with `manifest`, its `training` set."""
    manifest = replace(manifest, training=training)
    if isinstance(draft, DFlashDraft):
        return save_dflash_draft(draft, out_dir, manifest)
    return save_draft(draft, out_dir, layout="specdraft", manifest=manifest)


def resume_from(trainer: Any, out_dir: Path, resume: bool) -> int | None:
    """Load out_dir's newest checkpoint into a trainer.Trainer when resuming; returns its step (None:
    a fresh run). RunDirInUse (a FileExistsError) for checkpoints there without `resume`."""
    paths = checkpoint_paths(out_dir)
    if paths and not resume:
        raise RunDirInUse(
            f"{out_dir} already holds checkpoints ({paths[-1].name}): pass --resume to "
            f"continue its run (with its settings), or train into a new OUT directory"
        )
    if not paths:
        return None
    if paths[-1].is_dir():
        trainer.load_sharded_state(paths[-1])
    else:
        trainer.load_state(torch.load(paths[-1], map_location="cpu", weights_only=False), paths[-1])
    return trainer.step


def save_checkpoint(trainer: Any, out_dir: Path) -> None:
    """Checkpoint the current step: one file on one process, a sharded directory on several."""
    if trainer.ranks.world > 1:
        write_sharded_checkpoint(trainer, out_dir)
    else:
        write_checkpoint(trainer.state(), out_dir, trainer.config.keep_checkpoints)


def interrupted_message(out_dir: str | Path) -> str:
    """What a Ctrl-C kept of the run in out_dir, and how to go on (the CLI prints it after "interrupted; ")."""
    saved = checkpoint_paths(out_dir)
    if saved:
        return f"newest checkpoint: {saved[-1]}: continue with the same command and --resume"
    return "before the first checkpoint (--save-every): nothing to resume"
