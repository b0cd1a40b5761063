"""The trainer: data order, optimizer, schedule, validation; one entry point, `train`.

The only file that knows about epochs. `train` runs on one process or under `torchrun`
(torch.distributed: gloo on the CPU, nccl on GPUs; the draft sharded with FSDP2). A global
batch of `batch_size` sequences is split across ranks (rank r takes every world-th sequence),
each rank's share into `grad_accum_steps` micro-batches, and every micro-batch's loss is
normalised by the whole step's global count of supervised positions, so N processes and M
micro-batches compute the same loss and gradients as one batch on one process. A resumed run
may change its length: the lr schedule is then recomputed for the new total from the
checkpoint's step on (`Trainer._fit_schedule`). Checkpoints, resume and the files of a run:
`run_dir`; settings: `config`; ranks and signals: `dist`.

    specdraft train STORE RUN [--config cfg.json] [--resume]
    specdraft train DATA RUN --online --target TARGET_DIR ...
    torchrun --nproc-per-node 2 -m specdraft.cli train STORE RUN ...
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from specdraft.checkpoint import (
    PROGRESS_FILE,
    Manifest,
    checkpoint_paths,
    read_sharded,
    tensor_digest,
)
from specdraft.data.records import skipped_line
from specdraft.data.vocab import build_vocab_map
from specdraft.draft import DraftConfig, Eagle3Draft
from specdraft.errors import SpecdraftError
from specdraft.train.config import (
    TrainConfig,
    batch_order,
    lr_lambda,
    permutation_seed,
    refuse_changed_settings,
    split_samples,
)
from specdraft.train.dist import Ranks, interrupt_flag, resolve_device, setup_dist
from specdraft.train.loss import TTTMetrics, TTTOutput, supervised_counts, ttt_loss, weighted_loss
from specdraft.train.progress import training_progress
from specdraft.train.run_dir import (
    MetricsLog,
    check_run_dir,
    check_same_data,
    checkpoint_progress,
    moved_data,
    resume_from,
    save_checkpoint,
    save_final_draft,
)
from specdraft.train.sources import (
    Batch,
    OnlineSource,
    TargetInfo,
    TrainData,
    open_data,
    serving_note,
)


class TrainingError(SpecdraftError, RuntimeError):
    """Training cannot go on (non-finite loss, a batch without supervision); names the samples."""


def build_draft(config: TrainConfig, info: TargetInfo, token_counts: torch.Tensor) -> Eagle3Draft:
    """A fresh drafter for `info`'s target: seeded init, vocab map from loss-masked counts (of
    the training split), the target's embedding (unless the drafter owns one). The draft
    vocabulary defaults to the usable one: the tokenizer's length (`info.vocab_limit`; a
    target's vocab_size may pad past it), else the target's vocabulary."""
    cfg = DraftConfig.from_target(
        info.config,
        info.aux_layers,
        config.draft_vocab_size or info.vocab_limit,
        **config.draft_overrides,
    )
    vocab = build_vocab_map(token_counts, cfg.draft_vocab_size, info.vocab_limit)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        draft = Eagle3Draft(cfg)
    draft.d2t.copy_(vocab.d2t)
    draft.t2d.copy_(vocab.t2d)
    if not cfg.owns_embedding:
        draft.load_target_embedding(info.embed_weight.detach().float().cpu())
    return draft


# ---------------------------------------------------------------------------------------------
# The trainer


class TTTModel(nn.Module):
    """The drafter with the whole TTT unroll and loss as one forward.

    FSDP2 gathers parameters around a module's forward and may free them after its backward
    part; the unroll calls the drafter ttt_steps times, so sharding the drafter itself would
    free parameters that later steps' backward still needs. Sharding this wrapper gathers them
    once per micro-batch. Returns TTTOutput's fields as a dict (FSDP hooks the tensors).
    """

    def __init__(self, draft: Eagle3Draft) -> None:
        super().__init__()
        self.draft = draft

    def forward(
        self,
        input_ids: torch.Tensor,
        aux_hidden: torch.Tensor,
        target_logits: torch.Tensor,
        loss_mask: torch.Tensor,
        ttt_steps: int,
        step_weight: float,
        replay: bool = False,
    ) -> dict[str, torch.Tensor]:
        out = ttt_loss(
            self.draft,
            input_ids,
            aux_hidden,
            target_logits,
            loss_mask,
            ttt_steps=ttt_steps,
            step_weight=step_weight,
            replay=replay,
        )
        return {f.name: getattr(out, f.name) for f in fields(out)}


class Trainer:
    """Drafter, optimizer and schedule of one run on one rank, with verb methods.

    ranks: this process's place in a torchrun job (default: one process on config.device).
    command: the training command, recorded in the manifest (`self.manifest`, which checkpoints
    carry so that `specdraft export` can write the drafter of any of them).
    Raises ValueError for a batch size that ranks and micro-batches cannot share, bf16 off CUDA,
    or too little data.
    """

    def __init__(
        self,
        config: TrainConfig,
        data: TrainData,
        ranks: Ranks | None = None,
        command: str | None = None,
    ) -> None:
        ranks = ranks or Ranks(0, 1, resolve_device(config.device), False)
        self.config, self.data, self.ranks = config, data, ranks
        parts = ranks.world * config.grad_accum_steps
        if config.batch_size % parts:
            fits = [
                g
                for g in range(config.grad_accum_steps - 1, 0, -1)
                if config.batch_size % (ranks.world * g) == 0
            ]
            raise ValueError(
                f"--batch-size {config.batch_size} does not split into {ranks.world} rank(s) x "
                f"--grad-accum-steps {config.grad_accum_steps} micro-batches: use a multiple of {parts}"
                + (f" or --grad-accum-steps {fits[0]}" if fits else "")
            )
        self.micro_batch_size = config.batch_size // parts  # sequences per forward on one rank
        if config.precision == "bf16" and ranks.device.type != "cuda":
            raise ValueError(
                "--precision bf16 autocasts on CUDA only; use --precision fp32 on the CPU"
            )
        self.train_ids, self.val_ids = split_samples(len(data), config)
        self.batches_per_epoch = len(self.train_ids) // config.batch_size
        if self.batches_per_epoch == 0:
            raise ValueError(
                f"{len(self.train_ids)} training samples are fewer than one batch of "
                f"--batch-size {config.batch_size}: lower --batch-size or add data"
            )
        self.total_steps = config.num_steps(self.batches_per_epoch)
        draft = build_draft(
            config, data.info, data.token_counts(self.train_ids)
        )  # validation held out
        self.manifest = draft_manifest(draft, data.info, command)
        self.model = TTTModel(draft).to(ranks.device)
        if ranks.world > 1:
            from torch.distributed.fsdp import fully_shard

            fully_shard(self.model)
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            params, lr=config.lr, betas=(0.9, 0.95), weight_decay=config.weight_decay
        )
        self.scheduler = self._schedule(last_step=-1)
        self.step = 0
        # newest metrics records ("train": train_step's, "validation": evaluate's), kept in checkpoints
        self.records: dict[str, dict[str, Any] | None] = {"train": None, "validation": None}
        # run-length changes on resume: {"step", "from_total_steps", "to_total_steps"} each
        self.extensions: list[dict[str, int]] = []
        self.resume_note: str | None = (
            None  # one line for the user when a resume changed the schedule
        )

    def _schedule(self, last_step: int) -> torch.optim.lr_scheduler.LambdaLR:
        """The lr schedule over `total_steps` (`lr_lambda`), positioned after optimizer step
        `last_step` (-1: a fresh run; else the optimizer's lr is set for step last_step + 1)."""
        c = self.config
        return torch.optim.lr_scheduler.LambdaLR(
            self.optimizer,
            lambda s: lr_lambda(s, c.warmup_steps, self.total_steps, c.min_lr_ratio),
            last_epoch=last_step,
        )

    def position(self, step: int) -> dict[str, int]:
        """Data position of optimizer step `step`: epoch, batch index, permutation seed."""
        epoch = step // self.batches_per_epoch
        return {
            "epoch": epoch,
            "batch_index": step % self.batches_per_epoch,
            "permutation_seed": permutation_seed(self.config.seed, epoch),
        }

    def micro_batches(self, sample_ids: Sequence[int]) -> list[list[int]]:
        """This rank's share of a global batch (every world-th sample, from this rank) as
        consecutive micro-batches of `micro_batch_size` sample ids (grad_accum_steps of them
        for a full batch)."""
        mine = list(sample_ids[self.ranks.rank :: self.ranks.world])
        m = self.micro_batch_size
        return [mine[i : i + m] for i in range(0, len(mine), m)]

    def forward(self, batch: Batch, replay: bool = False) -> TTTOutput:
        """TTT loss and counts of one batch on this rank (counts local to the rank); with
        `replay`, also a chain engine's rounds (validation)."""
        bf16 = self.config.precision == "bf16"
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            out = self.model(
                batch.input_ids,
                batch.aux_hidden,
                batch.target_logits,
                batch.loss_mask,
                self.config.ttt_steps,
                self.config.step_weight,
                replay,
            )
        return TTTOutput(**out)

    def train_step(self, sample_ids: list[int]) -> dict[str, Any]:
        """One optimizer step on a global batch; returns its metrics record (global counts).

        The step's micro-batches are loaded first and their supervised positions per TTT step
        counted over all ranks; every micro-batch's loss is then normalised by these whole-step
        counts (`accumulate`), so the summed gradient is the gradient of one batch. The inputs
        (target logits, aux states) of all micro-batches are held for the step; the drafter's
        activations for one micro-batch at a time.
        Raises TrainingError naming the batch's sample ids when the loss is NaN/Inf or the
        batch has no supervised position (FC-07).
        """
        c, ranks = self.config, self.ranks
        batches = [
            self.data.batch(ids, c.max_length, ranks.device)
            for ids in self.micro_batches(sample_ids)
        ]
        totals = ranks.sum(
            sum(
                supervised_counts(self.model.draft, b.target_logits, b.loss_mask, c.ttt_steps)
                for b in batches
            )
        )
        if int(totals[0]) == 0:
            raise TrainingError(
                f"step {self.step}: batch of samples {sample_ids} has no supervised "
                f"position (no label in an assistant turn inside the draft vocabulary); "
                f"check the loss mask / chat template or drop these samples"
            )
        self.optimizer.zero_grad(set_to_none=True)
        local = TTTMetrics.zeros(c.ttt_steps)
        for i, batch in enumerate(batches):
            local.add(self.accumulate(batch, totals, sync=i == len(batches) - 1))
        metrics = _global(local, ranks)
        loss_value = float(weighted_loss(metrics.loss_sums, metrics.total, c.step_weight))
        if not math.isfinite(loss_value):
            raise TrainingError(
                f"step {self.step}: loss is {loss_value} on the batch of samples "
                f"{sample_ids}; check these samples' captured states for NaN/Inf"
            )
        grad_norm = torch.nn.utils.clip_grad_norm_(
            [p for p in self.model.parameters() if p.requires_grad], c.grad_clip or float("inf")
        )
        lr = self.scheduler.get_last_lr()[0]
        self.optimizer.step()
        self.scheduler.step()
        self.step += 1
        return {
            "step": self.step,
            "split": "train",
            "loss": loss_value,
            "lr": lr,
            "grad_norm": float(_full(grad_norm)),
            **metrics.to_dict(),
        }

    def accumulate(self, batch: Batch, totals: torch.Tensor, sync: bool) -> TTTOutput:
        """Forward and backward of one micro-batch; adds its share to the parameters' gradients.

        totals: [K] supervised positions per TTT step of the whole optimizer step (all
        micro-batches, all ranks). The loss is sum_k w_k · (this micro-batch's KL sum at step k)
        / totals[k], times the world size since FSDP averages gradients over ranks.
        sync=False (every micro-batch but the step's last) keeps FSDP2 from reduce-scattering:
        gradients accumulate unsharded on each rank and are reduced once, after the last.
        Returns the micro-batch's output (counts local to this rank).
        """
        if self.ranks.world > 1:
            self.model.set_requires_gradient_sync(sync)
        out = self.forward(batch)
        loss = weighted_loss(out.step_loss_sums, totals, self.config.step_weight)
        (loss * self.ranks.world).backward()
        return out

    @torch.no_grad()
    def evaluate(self) -> TTTMetrics:
        """Per-step counts over the validation split, summed over ranks, in chunks of one
        micro-batch per rank (a rank without a sample in the last chunk runs a duplicate whose
        counts are dropped, so FSDP's collectives stay matched)."""
        c, ranks = self.config, self.ranks
        metrics = TTTMetrics.zeros(c.ttt_steps)
        size = self.micro_batch_size * ranks.world
        for i in range(0, len(self.val_ids), size):
            chunk = self.val_ids[i : i + size]
            mine = chunk[ranks.rank :: ranks.world]
            out = self.forward(
                self.data.batch(mine or chunk[:1], c.max_length, ranks.device), replay=True
            )
            if mine:
                metrics.add(out)
        return _global(metrics, ranks)

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
        shapes the weights is a ValueError naming the flags (`config.refuse_changed_settings`); a
        run length that differs is taken (`_fit_schedule`)."""
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        refuse_changed_settings(self.config, state["config"], source)
        opts = StateDictOptions(full_state_dict=True)
        set_model_state_dict(self.model, state["model"], options=opts)
        set_optimizer_state_dict(self.model, self.optimizer, state["optimizer"], options=opts)
        self._restore_progress(state, source)

    def load_sharded_state(self, path: Path) -> None:
        """Restore a directory written by `run_dir.write_sharded_checkpoint` by any number of ranks, on
        this run's ranks (one process reads whole tensors); a collective. Raises as `load_state`."""
        from torch.distributed.checkpoint.state_dict import set_state_dict

        progress = torch.load(path / PROGRESS_FILE, map_location="cpu", weights_only=False)
        refuse_changed_settings(self.config, progress["config"], path)
        state = self.sharded_state()
        read_sharded(state, path, one_process=self.ranks.world == 1)
        set_state_dict(
            self.model,
            self.optimizer,
            model_state_dict=state["model"],
            optim_state_dict=state["optimizer"],
        )
        self._restore_progress(progress, path)

    def _restore_progress(self, progress: dict[str, Any], source: Path) -> None:
        self.scheduler.load_state_dict(progress["scheduler"])
        torch.set_rng_state(progress["rng"]["torch"])
        random.setstate(progress["rng"]["python"])
        if progress["rng"]["cuda"] is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(progress["rng"]["cuda"])
        self.step = progress["step"]
        if progress["data"] != self.position(self.step):
            raise ValueError(moved_data(self, progress["data"], source))
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
        Raises ValueError for a total below the checkpoint's step.
        """
        if self.step > self.total_steps:
            raise ValueError(
                f"{source} is at step {self.step}, past this run's {self.total_steps} steps: pass "
                f"--steps {self.step} or more (or train into a new OUT directory)"
            )
        if (
            saved_total == self.total_steps or self.step == self.total_steps
        ):  # no step left to schedule
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

    def full_draft(self, model_state: dict[str, torch.Tensor]) -> Eagle3Draft:
        """A CPU Eagle3Draft holding `model_state` (from `state()["model"]`), strictly loaded."""
        draft = Eagle3Draft(self.model.draft.cfg)
        draft.load_state_dict(
            {k.removeprefix("draft."): v for k, v in model_state.items()}, strict=True
        )
        draft.embedding_loaded = True
        return draft


def _global(local: TTTMetrics, ranks: Ranks) -> TTTMetrics:
    """`local`'s counts and loss sums summed over ranks (on the CPU)."""
    return TTTMetrics(*(ranks.sum(getattr(local, f.name)).cpu() for f in fields(local)))


def _full(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's full value (FSDP2's grad norm); plain tensors pass through."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def draft_manifest(draft: Eagle3Draft, info: TargetInfo, command: str | None) -> Manifest:
    """The manifest of a drafter trained on `info`'s target (training metrics still None)."""
    return Manifest(
        draft=draft.cfg.to_dict(),
        aux_layers=list(info.aux_layers),
        draft_vocab_hash=tensor_digest(draft.d2t),
        training_command=command,
        **info.manifest_fields,
    )


# ---------------------------------------------------------------------------------------------
# Entry point


@dataclass
class TrainResult:
    """What a run produced. `validation` is the final validation summary (TTTMetrics.to_dict),
    None without a validation split; `draft_dir` is None on ranks other than 0."""

    steps: int
    train_loss: float | None
    validation: dict[str, Any] | None
    draft_dir: Path | None
    metrics_path: Path


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
    resume: continue from the newest checkpoint in out_dir (from scratch when there is none);
    without it an out_dir that already holds checkpoints is refused (FileExistsError), as is an
    out_dir that is a file or a directory of other files (no run entry, `run_dir.RUN_ENTRIES`). Resuming on
    data of another target, aux layers or samples (data hash) than the checkpoint's is a ValueError
    naming both (`run_dir.check_same_data`). Ctrl-C (SIGINT) or SIGTERM, in one process or under
    torchrun, lets every rank finish its step (metrics line and any checkpoint included), then all
    checkpoint that step and raise KeyboardInterrupt (`dist.interrupt_flag`); a second signal
    aborts at once, unsaved. The checkpoint may come from another number
    of ranks (a step-N.pt file of one process, a sharded step-N directory of several): it is
    resharded to this run's. The run length (total_steps / epochs) may differ from the
    checkpoint's: the run is extended (or shortened, not below the checkpoint's step) and the lr
    schedule recomputed for the new total (`Trainer._fit_schedule`); grad_accum_steps may differ;
    every other setting that shapes the weights must match (`config.resume_config` takes them from the checkpoint).
    command: recorded in the manifest as the training command. on_step(step) runs after each
    optimizer step and any checkpoint it triggers. target_config: the target's config or
    directory, for a store whose recorded target path does not resolve here. on_note(line)
    receives one-line notes for the user on rank 0 (bad records skipped, a recomputed schedule).
    Raises TrainingError (non-finite loss / unsupervised batch, naming its sample ids) and
    ValueError for inconsistent settings or, from an OnlineSource, a bad data file (DataError,
    naming the file and record).
    """
    out_dir = Path(out_dir)
    check_run_dir(out_dir)  # before loading anything
    ranks = setup_dist(config.device)
    try:
        newest = checkpoint_paths(out_dir)[-1:] if resume else []
        # resuming on a store: its target and layers checked against the checkpoint's, then the layers asked
        aux = None if newest and not isinstance(source, OnlineSource) else config.aux_layers
        data = open_data(source, target_config, aux, ranks.device)
        if newest:
            check_same_data(checkpoint_progress(newest[0]), data.info, len(data), newest[0])
        data = open_data(data, aux_layers=config.aux_layers)
        if on_note is not None and ranks.main and (line := serving_note(data.info)):
            on_note(f"warning: {line}")
        trainer = Trainer(config, data, ranks, command)
        resumed = resume_from(trainer, out_dir, resume)
        if on_note is not None and ranks.main:
            if isinstance(source, OnlineSource) and data.num_skipped:
                on_note(skipped_line(data.num_skipped, source.data))
            if trainer.resume_note:
                on_note(trainer.resume_note)
        log = MetricsLog(out_dir, ranks.main, resumed)
        try:
            return _run(trainer, out_dir, log, progress, on_step)
        finally:
            log.close()
    finally:
        if ranks.owns_group:
            dist.destroy_process_group()


def _run(
    trainer: Trainer,
    out_dir: Path,
    log: MetricsLog,
    progress: bool,
    on_step: Callable[[int], None] | None,
) -> TrainResult:
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
    if validation is None and trainer.val_ids:  # resumed after the last step's evaluation
        validation = {"step": trainer.step, "split": "val", **trainer.evaluate().to_dict()}
    state = trainer.state()
    draft_dir = None
    if ranks.main:
        training = {
            "steps": trainer.step,
            "train": trainer.records["train"],
            "validation": validation,
            "extensions": trainer.extensions,
            "config": c.to_dict(),
        }
        draft_dir = save_final_draft(
            trainer.full_draft(state["model"]), out_dir / "draft", trainer.manifest, training
        )
    ranks.barrier()
    return TrainResult(
        trainer.step, last["loss"] if last else None, validation, draft_dir, log.path
    )
