"""The training loop and its one entry point, `train`: data order, validation, checkpoints.

The only file that knows about epochs. `train` runs on one process or under `torchrun`
(torch.distributed: gloo on the CPU, nccl on GPUs).

Resume: the checkpoint may come from another number of ranks (a step-N.pt file of one process, a
sharded step-N directory of several): it is resharded to this run's. The run length
(total_steps / epochs) may differ from the checkpoint's: the run is extended (or shortened, not
below the checkpoint's step) and the lr schedule recomputed for the new total from the
checkpoint's step on (`Trainer._fit_schedule`); grad_accum_steps may differ; every other setting
that shapes the weights must match (`config.resume_config` takes them from the checkpoint).

Stop: Ctrl-C (SIGINT) or SIGTERM, in one process or under torchrun, lets every rank finish its
step (metrics line and any checkpoint included), then all checkpoint that step and raise
KeyboardInterrupt (`dist.interrupt_flag`); a second signal aborts at once, unsaved.

The step and its batch split over ranks and micro-batches:
`trainer`; what a checkpoint holds: `state`; the files of a run: `run_dir`; settings: `config`;
ranks and signals: `dist`.

    specdraft train STORE RUN [--config cfg.json] [--resume]
    specdraft train DATA RUN --online --target TARGET_DIR ...
    torchrun --nproc-per-node 2 -m specdraft.cli train STORE RUN ...
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from specdraft.checkpoint import checkpoint_paths
from specdraft.data.records import skipped_line
from specdraft.train.config import TrainConfig, batch_order, refuse_changed_early
from specdraft.train.dist import Ranks, interrupt_flag, setup_dist
from specdraft.train.errors import BadTrainSetting
from specdraft.train.progress import training_progress
from specdraft.train.run_dir import (
    MetricsLog,
    check_run_dir,
    check_same_data,
    checkpoint_progress,
    resume_from,
    save_checkpoint,
    save_final_draft,
)
from specdraft.train.sources import OnlineData, OnlineSource, TrainData, serving_note
from specdraft.train.store_data import StoreData
from specdraft.train.trainer import Trainer


@dataclass
class TrainResult:
    """What a run produced. `validation` is the final validation summary (TTTMetrics.to_dict),
    None without a validation split; `draft_dir` is None on ranks other than 0."""

    steps: int
    train_loss: float | None
    validation: dict[str, Any] | None
    draft_dir: Path | None
    metrics_path: Path


def open_data(
    source: str | Path | OnlineSource | TrainData,
    target_config: Any = None,
    aux_layers: Sequence[int] | None = None,
    device: str | torch.device = "cpu",
) -> TrainData:
    """A TrainData for `source`: a capture store directory, an OnlineSource (its target loaded
    onto `device`), or a TrainData as is.

    target_config: for a store, see StoreData. aux_layers: the layers asked for (None = the
    source's); a store or TrainData that holds other layers is a BadTrainSetting (a ValueError)
    naming both.
    """
    if isinstance(source, OnlineSource):
        return OnlineData.load(source, aux_layers, device)
    data = StoreData(source, target_config) if isinstance(source, (str, Path)) else source
    if aux_layers is not None and tuple(aux_layers) != data.info.aux_layers:
        held = ",".join(map(str, data.info.aux_layers))
        raise BadTrainSetting(
            f"--aux-layers {','.join(map(str, aux_layers))} asked for, but the training data holds "
            f"layers {held}: drop --aux-layers (or pass --aux-layers {held}), or capture those layers"
        )
    return data


def train(
    config: TrainConfig,
    source: str | Path | OnlineSource | TrainData,
    out_dir: str | Path,
    *,
    resume: bool = False,
    command: str | None = None,
    progress: bool = True,
    on_step: Callable[[int], None] | None = None,
    target_config: Any = None,
    on_note: Callable[[str], None] | None = None,
) -> TrainResult:
    """Train an EAGLE-3 drafter; under torchrun, on every rank (same arguments).

    source: a capture store directory (offline), an OnlineSource (target directory and data
    file: the target runs in the loop, loaded on each rank's device) or a TrainData such as
    OnlineData.
    out_dir: receives checkpoints/, metrics.jsonl, tensorboard/ and the final draft/.
    resume: continue from the newest checkpoint in out_dir (from scratch when there is none; what
    a resume may change, and how Ctrl-C and SIGTERM stop a run: the module doc); without it an
    out_dir that already holds checkpoints is refused, as is an out_dir that is a file or a
    directory of other files (no run entry, `run_dir.RUN_ENTRIES`): RunDirInUse (a
    FileExistsError). Resuming on data of another target, aux layers or samples (data hash) than
    the checkpoint's is a SettingsMismatch (a ValueError) naming both (`run_dir.check_same_data`).
    command: recorded in the manifest as the training command. on_step(step) runs after each
    optimizer step and any checkpoint it triggers. target_config: the target's config or
    directory, for a store whose recorded target path does not resolve here. on_note(line)
    receives one-line notes for the user on rank 0 (bad records skipped, a recomputed schedule).
    Raises TrainingError (non-finite loss / unsupervised batch, naming its sample ids),
    BadTrainSetting and SettingsMismatch (ValueErrors) for inconsistent settings and, from an
    OnlineSource, DataError (a ValueError) for a bad data file, naming the file and record.
    """
    out_dir = Path(out_dir)
    check_run_dir(out_dir)  # before loading anything
    ranks = setup_dist(config.device)
    try:
        trainer, resumed = _start(
            config, source, out_dir, resume, command, target_config, ranks, on_note
        )
        log = MetricsLog(out_dir, ranks.main, resumed)
        try:
            return _run(trainer, out_dir, log, progress, on_step)
        finally:
            log.close()
    finally:
        if ranks.owns_group:
            dist.destroy_process_group()


def _start(
    config: TrainConfig,
    source: str | Path | OnlineSource | TrainData,
    out_dir: Path,
    resume: bool,
    command: str | None,
    target_config: Any,
    ranks: Ranks,
    on_note: Callable[[str], None] | None,
) -> tuple[Trainer, int | None]:
    """`train`'s Trainer on its data, resumed from out_dir's newest checkpoint when `resume`, and
    the step it resumed from (None: a fresh run); on rank 0, the notes for the user to `on_note`."""
    data = _training_data(config, source, out_dir, resume, target_config, ranks)
    notes = on_note is not None and ranks.main
    if notes and (line := serving_note(data.info)):
        on_note(f"warning: {line}")
    trainer = Trainer(config, data, ranks, command)
    resumed = resume_from(trainer, out_dir, resume)
    if notes:
        if isinstance(source, OnlineSource) and data.num_skipped:
            on_note(skipped_line(data.num_skipped, source.data))
        for line in (trainer.settings_note, trainer.resume_note):
            if line:
                on_note(line)
        if (line := warmup_note(trainer)) is not None:
            on_note(line)
    return trainer, resumed


def warmup_note(trainer: Trainer) -> str | None:
    """Said before the first step when the lr warm-up outlasts the run: the learning rate would
    never reach --lr (a short run on little data then learns almost nothing); None otherwise."""
    c, total = trainer.config, trainer.total_steps
    if c.warmup_steps < total or trainer.step >= total:
        return None
    return (
        f"warm-up {c.warmup_steps} steps >= this run's {total} steps: the learning rate would never "
        f"reach {c.lr}; pass --warmup-steps {max(1, total // 10)} (a tenth of the run), or train "
        "longer (--steps / --epochs)"
    )


def _training_data(
    config: TrainConfig,
    source: str | Path | OnlineSource | TrainData,
    out_dir: Path,
    resume: bool,
    target_config: Any,
    ranks: Ranks,
) -> TrainData:
    """`train`'s data on this rank's device; resuming, checked against the newest checkpoint's
    (`run_dir.check_same_data`) before the aux layers asked for are, and the settings too
    (`config.refuse_changed_early`: before a drafter of other settings, another --method, is
    built)."""
    newest = checkpoint_paths(out_dir)[-1:] if resume else []
    # resuming on a store: its target and layers checked against the checkpoint's, then the layers asked
    aux = None if newest and not isinstance(source, OnlineSource) else config.aux_layers
    data = open_data(source, target_config, aux, ranks.device)
    if newest:
        progress = checkpoint_progress(newest[0])
        check_same_data(progress, data.info, len(data), newest[0])
        refuse_changed_early(config, progress["config"], data.info, newest[0])
    return open_data(data, aux_layers=config.aux_layers)


def _run(
    trainer: Trainer,
    out_dir: Path,
    log: MetricsLog,
    progress: bool,
    on_step: Callable[[int], None] | None,
) -> TrainResult:
    """The steps from `trainer.step` to its total, each logged, evaluated and checkpointed as the
    config says; a stop request (`dist.interrupt_flag`) checkpoints the step it ends and raises
    KeyboardInterrupt. Then the final validation and drafter (`_finish`)."""
    c, ranks = trainer.config, trainer.ranks
    last: dict[str, Any] | None = None
    validation: dict[str, Any] | None = None
    with (
        training_progress(progress and ranks.main, trainer.total_steps, trainer.step) as advance,
        interrupt_flag(ranks) as interrupted,
    ):
        while trainer.step < trainer.total_steps:
            pos = trainer.position(trainer.step)
            batch = batch_order(trainer.train_ids, pos["epoch"], c)[pos["batch_index"]]
            last = trainer.records["train"] = trainer.train_step(batch)
            log.write(last)
            if trainer.val_ids and (
                trainer.step % c.eval_every == 0 or trainer.step == trainer.total_steps
            ):
                validation = {"step": trainer.step, "split": "val", **trainer.evaluate().to_dict()}
                trainer.records["validation"] = validation
                log.write(validation)
            saved = trainer.step % c.save_every == 0 or trainer.step == trainer.total_steps
            if saved:
                save_checkpoint(trainer, out_dir)
            advance(last)
            if on_step is not None:
                on_step(trainer.step)
            if interrupted():  # every rank, here, at the same step
                if not saved:
                    save_checkpoint(trainer, out_dir)
                raise KeyboardInterrupt
    draft_dir, validation = _finish(trainer, out_dir, validation)
    return TrainResult(
        trainer.step, last["loss"] if last else None, validation, draft_dir, log.path
    )


def _finish(
    trainer: Trainer, out_dir: Path, validation: dict[str, Any] | None
) -> tuple[Path | None, dict[str, Any] | None]:
    """After the last step: the final validation (run again when a resume began after the last
    step's), and the drafter saved with its training record by rank 0 (None on other ranks); a
    collective. Returns (the drafter's directory, the validation record)."""
    if validation is None and trainer.val_ids:  # resumed after the last step's evaluation
        validation = {"step": trainer.step, "split": "val", **trainer.evaluate().to_dict()}
    state = trainer.state()
    draft_dir = None
    if trainer.ranks.main:
        training = {
            "steps": trainer.step,
            "train": trainer.records["train"],
            "validation": validation,
            "extensions": trainer.extensions,
            "config": trainer.config.to_dict(),
        }
        draft_dir = save_final_draft(
            trainer.full_draft(state["model"]), out_dir / "draft", trainer.manifest, training
        )
    trainer.ranks.barrier()
    return draft_dir, validation
