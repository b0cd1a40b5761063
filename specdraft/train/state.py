"""What a checkpoint holds of a `trainer.Trainer`, and how a resume restores it.

The state of a run: the draft and optimizer (full tensors from one process, or each rank's
shards), the lr schedule, the RNG states, the data position, the newest metrics records, the
run-length changes and the drafter's manifest. Either form loads on any number of ranks
(resharded). A checkpoint whose settings differ in anything that shapes the weights is refused
(`config.refuse_changed_settings`), as is one whose data position does not fit this run's data
(`moved_data`); a run length that differs is taken, its lr schedule recomputed (`_fit_schedule`).
"""

from __future__ import annotations

import random
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from specdraft.checkpoint import PROGRESS_FILE, read_sharded
from specdraft.dflash import DFlashDraft
from specdraft.draft import Eagle3Draft
from specdraft.errors import SettingsMismatch
from specdraft.train.config import TrainConfig, refuse_changed_settings, resolve_saved


class TrainerState:
    """The checkpoint methods of a `trainer.Trainer` (which defines the attributes they use:
    config, data, ranks, model, optimizer, scheduler, step, records, extensions, manifest)."""

    def progress_state(self) -> dict[str, Any]:
        """The state besides weights and optimizer: step, config, number of samples of the data,
        scheduler, RNG, data position, newest metrics, run-length changes, and the drafter's
        manifest (as a dict; training None; its data_hash keys the data, `check_same_data`)."""
        rng = {
            "torch": torch.get_rng_state(),
            "python": random.getstate(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
        }
        return {
            "step": self.step,
            "config": self.config.to_dict(),
            "num_samples": len(self.data),
            "scheduler": self.scheduler.state_dict(),
            "rng": rng,
            "data": self.position(self.step),
            "records": dict(self.records),
            "extensions": list(self.extensions),
            "manifest": asdict(self.manifest),
        }

    def state(self) -> dict[str, Any]:
        """Full (unsharded, CPU) training state: `progress_state()` plus "model" and "optimizer";
        a collective: every rank must call it."""
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
            get_optimizer_state_dict,
        )

        opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return {
            **self.progress_state(),
            "model": get_model_state_dict(self.model, options=opts),
            "optimizer": get_optimizer_state_dict(self.model, self.optimizer, options=opts),
        }

    def sharded_state(self) -> dict[str, Any]:
        """{"model", "optimizer"}: this rank's shards (DTensors) of the draft and the optimizer
        state, which torch.distributed.checkpoint saves, and loads into in place."""
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model, optimizer = get_state_dict(self.model, self.optimizer)
        return {"model": model, "optimizer": optimizer}

    def load_state(self, state: dict[str, Any], source: Path) -> None:
        """Restore `state()` (full tensors, as one process writes them) on any number of ranks:
        under FSDP2 each rank keeps its shards. A checkpoint whose settings differ in anything that
        shapes the weights is a SettingsMismatch (a ValueError) naming the flags
        (`config.refuse_changed_settings`); a run length that differs is taken (`_fit_schedule`)."""
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        refuse_changed_settings(self.config, self._saved_settings(state["config"], source), source)
        opts = StateDictOptions(full_state_dict=True)
        set_model_state_dict(self.model, state["model"], options=opts)
        set_optimizer_state_dict(self.model, self.optimizer, state["optimizer"], options=opts)
        self._restore_progress(state, source)

    def load_sharded_state(self, path: Path) -> None:
        """Restore a directory written by `run_dir.write_sharded_checkpoint` by any number of ranks, on
        this run's ranks (one process reads whole tensors); a collective. Raises as `load_state`."""
        from torch.distributed.checkpoint.state_dict import set_state_dict

        progress = torch.load(path / PROGRESS_FILE, map_location="cpu", weights_only=False)
        refuse_changed_settings(self.config, self._saved_settings(progress["config"], path), path)
        state = self.sharded_state()
        read_sharded(state, path, one_process=self.ranks.world == 1)
        set_state_dict(
            self.model,
            self.optimizer,
            model_state_dict=state["model"],
            optim_state_dict=state["optimizer"],
        )
        self._restore_progress(progress, path)

    def _saved_settings(self, saved: dict[str, Any], source: Path) -> dict[str, Any]:
        """A checkpoint's settings, its unresolved defaults resolved (`config.resolve_saved`,
        said in `settings_note`)."""
        saved, self.settings_note = resolve_saved(saved, self.data.info, source)
        return saved

    def _restore_progress(self, progress: dict[str, Any], source: Path) -> None:
        self.scheduler.load_state_dict(progress["scheduler"])
        torch.set_rng_state(progress["rng"]["torch"])
        random.setstate(progress["rng"]["python"])
        if progress["rng"]["cuda"] is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(progress["rng"]["cuda"])
        self.step = progress["step"]
        if progress["data"] != self.position(self.step):
            raise SettingsMismatch(moved_data(self, progress["data"], source))
        # checkpoints of specdraft before these keys hold neither: nothing recorded yet
        self.records = dict(progress.get("records", self.records))
        self.extensions = list(progress.get("extensions", []))
        self._fit_schedule(
            TrainConfig.from_dict(progress["config"]).num_steps(self.batches_per_epoch), source
        )

    def _fit_schedule(self, saved_total: int, source: Path) -> None:
        """Continue a checkpoint of a `saved_total`-step run as a `total_steps` run.

        The lr schedule (warm-up over the same warmup_steps, then cosine decay) is recomputed for
        the new total and the optimizer's lr set to its value at the checkpoint's step: steps
        before it keep the lr they had, steps from it on follow the new curve. The change is
        appended to `extensions` (the manifest records them) and described in `resume_note`.
        Raises SettingsMismatch (a ValueError) for a total below the checkpoint's step.
        """
        if self.step > self.total_steps:
            raise SettingsMismatch(
                f"{source} is at step {self.step}, past this run's {self.total_steps} steps: pass "
                f"--steps {self.step} or more (or train into a new OUT directory)"
            )
        if saved_total == self.total_steps or self.step == self.total_steps:  # no step left
            return
        old_lr = self.scheduler.get_last_lr()[0]
        self.scheduler = self._schedule(last_step=self.step - 1)
        self.extensions.append(
            {"step": self.step, "from_total_steps": saved_total, "to_total_steps": self.total_steps}
        )
        c = self.config
        self.resume_note = (
            f"run length {saved_total} -> {self.total_steps} steps: the learning-rate schedule "
            f"(warm-up {c.warmup_steps} steps, cosine decay to {c.min_lr_ratio} x lr {c.lr}) is "
            f"recomputed for {self.total_steps} steps; step {self.step + 1} runs at lr "
            f"{self.scheduler.get_last_lr()[0]:.3g} (the old schedule: {old_lr:.3g})"
        )

    def full_draft(self, model_state: dict[str, torch.Tensor]) -> Eagle3Draft | DFlashDraft:
        """A CPU drafter of this run's class holding `model_state` (from `state()["model"]`),
        strictly loaded (a DFlash drafter without the target's embedding and lm_head, which
        it does not save)."""
        draft = type(self.model.draft)(self.model.draft.cfg)
        draft.load_state_dict(
            {k.removeprefix("draft."): v for k, v in model_state.items()}, strict=True
        )
        if isinstance(draft, Eagle3Draft):
            draft.embedding_loaded = True
        return draft


def moved_data(trainer: Any, saved: dict[str, int], source: Path) -> str:
    """Why the checkpoint `source`'s data position `saved` (`Trainer.position`) is not the
    Trainer `trainer`'s at its step, in a user's terms: the training split has another number of
    batches per epoch (the data changed; a checkpoint with a data hash is refused before, by
    `run_dir.check_same_data`)."""
    epoch, index, now = saved["epoch"], saved["batch_index"], trainer.position(trainer.step)
    if (epoch, index) == (now["epoch"], now["batch_index"]):  # same split, another shuffle
        return (
            f"{source}: this checkpoint's data order (shuffle seed {saved['permutation_seed']}) is not "
            f"this specdraft's ({now['permutation_seed']}): train into a new OUT directory"
        )
    # step = epoch * batches per epoch + index; in epoch 0 only a lower bound is known
    was = f"{(trainer.step - index) // epoch}" if epoch else f"at least {index + 1}"
    return (
        f"{source}: the training split now has {trainer.batches_per_epoch} batches of --batch-size "
        f"{trainer.config.batch_size} per epoch ({len(trainer.train_ids)} training samples), but had {was} when "
        f"this checkpoint was written (its step {trainer.step} was batch {index + 1} of epoch {epoch + 1}): "
        f"the data changed since; resume with the store (or --online data file) it was trained on, or "
        f"train into a new OUT directory"
    )
