"""The trainer: data order, optimizer, schedule, validation, checkpoints and resume.

The only file that knows about epochs. One entry point, `train`, runs on one process or under
`torchrun` (torch.distributed: gloo on the CPU, nccl on GPUs; the draft sharded with FSDP2).
A global batch of `batch_size` sequences is split across ranks (rank r takes every world-th
sequence), each rank's share into `grad_accum_steps` micro-batches, and every micro-batch's
loss is normalised by the whole step's global count of supervised positions, so N processes
and M micro-batches compute the same loss and gradients as one batch on one process.

Resume is exact: a checkpoint holds the draft, optimizer, scheduler, RNG states and the data
position; the data order is a function of (seed, epoch), so a resumed run repeats the same
batches and, on the CPU in fp32, ends with the same weights bit for bit. A resumed run may
change its length (extend it): the lr schedule is then recomputed for the new total from the
checkpoint's step on (`Trainer._fit_schedule`). One process writes a checkpoint as one file;
several ranks write a torch.distributed.checkpoint directory, each rank its own shards. Either
kind resumes on any number of ranks: weights and optimizer state are resharded on load and the
run goes on from the checkpoint's step. Such a run may change grad_accum_steps too (to keep the
memory of a forward on fewer ranks): like the number of ranks, it splits a batch without
changing its loss or gradients, only the order of float sums, so the weights then agree with
an uninterrupted run to rounding, not bit for bit. Each checkpoint carries the drafter's
manifest, so `specdraft export` can write the drafter of any of them
(`load_training_checkpoint`). Rank 0 writes metrics and the final drafter.

    specdraft train STORE RUN [--config cfg.json] [--resume]
    specdraft train DATA RUN --online --target TARGET_DIR ...
    torchrun --nproc-per-node 2 -m specdraft.cli train STORE RUN ...
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import shutil
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from specdraft.checkpoint import CheckpointError, LoadedDraft, Manifest, save_draft, tensor_digest
from specdraft.conventions import build_vocab_map
from specdraft.data.records import skipped_line
from specdraft.draft import DraftConfig, Eagle3Draft
from specdraft.train.loss import TTTMetrics, TTTOutput, supervised_counts, ttt_loss, weighted_loss
from specdraft.train.sources import Batch, OnlineSource, TargetInfo, TrainData, describe_target, open_data, same_target

PRECISIONS = ("fp32", "bf16")
CHECKPOINT_DIR = "checkpoints"
PROGRESS_FILE = "trainer.pt"  # inside a sharded checkpoint directory: Trainer.progress_state()
METRICS_FILE = "metrics.jsonl"
# What a run directory holds; an OUT with other files only is not one, and is refused.
RUN_ENTRIES = frozenset({CHECKPOINT_DIR, METRICS_FILE, "tensorboard", "draft"})
# TrainConfig fields a resumed run may change: they do not change the weights it ends with.
BOOKKEEPING_FIELDS = frozenset({"eval_every", "save_every", "keep_checkpoints", "device"})
# ... and the run's length, which a resumed run may extend (the lr schedule is recomputed for it).
RUN_LENGTH_FIELDS = frozenset({"total_steps", "epochs"})
# ... and how a rank splits its share of a batch, which changes the weights by float rounding only
# (as the number of ranks does): a run resumed on other ranks may need another split to fit memory.
BATCH_SPLIT_FIELDS = frozenset({"grad_accum_steps"})
# The `specdraft train` flag of each TrainConfig field it sets (cli.py); errors name these, and
# any other field by its --config key, since users type flags, not field names.
FLAG_OF_FIELD = {"total_steps": "--steps", "epochs": "--epochs", "lr": "--lr", "batch_size": "--batch-size",
                 "grad_accum_steps": "--grad-accum-steps", "max_length": "--max-length",
                 "ttt_steps": "--ttt-steps", "draft_vocab_size": "--draft-vocab-size",
                 "precision": "--precision", "aux_layers": "--aux-layers", "warmup_steps": "--warmup-steps",
                 "save_every": "--save-every"}


def flag(name: str) -> str:
    """How a user sets TrainConfig field `name`: its `specdraft train` flag, else its --config key."""
    return FLAG_OF_FIELD.get(name, f"--config key {name}")


class TrainingError(RuntimeError):
    """Training cannot go on (non-finite loss, a batch without supervision); names the samples."""


@dataclass(frozen=True)
class TrainConfig:
    """Hyper-parameters of one training run (grouped by stage). Unset sizes come from the target.

    Length of the run: exactly one of `total_steps` (optimizer steps) or `epochs` (passes over
    the training split; the last partial global batch of an epoch is dropped); neither = 1 epoch.
    `batch_size` counts sequences per optimizer step over all ranks; each rank runs its share as
    `grad_accum_steps` micro-batches of batch_size / (world size · grad_accum_steps) sequences,
    which must divide exactly. `aux_layers` picks an online target's layers (a store or TrainData
    holding other layers is an error). `precision` "bf16" autocasts on CUDA only (fp32 master
    weights); on the CPU it is an error. `draft_overrides` replace DraftConfig fields derived
    from the target.
    """

    # optimisation
    lr: float = 1e-4
    warmup_steps: int = 100
    total_steps: int | None = None
    epochs: int | None = None
    batch_size: int = 8
    grad_accum_steps: int = 1
    max_length: int = 2048
    grad_clip: float = 1.0
    weight_decay: float = 0.0
    min_lr_ratio: float = 0.0
    # training-time test
    ttt_steps: int = 7
    step_weight: float = 0.8
    # drafter
    draft_vocab_size: int | None = None
    aux_layers: tuple[int, ...] | None = None
    draft_overrides: dict[str, Any] = field(default_factory=dict)
    # data and bookkeeping
    val_fraction: float = 0.05
    seed: int = 0
    eval_every: int = 500
    save_every: int = 500
    keep_checkpoints: int = 2
    precision: str = "fp32"
    device: str = "auto"

    def __post_init__(self) -> None:
        positive = ("lr", "batch_size", "grad_accum_steps", "max_length", "ttt_steps", "eval_every",
                    "save_every", "keep_checkpoints")
        for name in positive:
            if getattr(self, name) <= 0:
                raise ValueError(f"{flag(name)} {getattr(self, name)}: must be positive")
        if not math.isfinite(self.lr):  # nan passes `<= 0`; torch's optimizer would say "Invalid learning rate"
            raise ValueError(f"{flag('lr')} {self.lr}: must be a finite positive number")
        if self.total_steps is not None and self.epochs is not None:
            raise ValueError(f"total_steps {self.total_steps} and epochs {self.epochs} both set (--config): keep "
                             "one run length, or pass --steps or --epochs, which replaces both")
        for name in ("total_steps", "epochs"):
            if getattr(self, name) is not None and getattr(self, name) <= 0:
                raise ValueError(f"{flag(name)} {getattr(self, name)}: must be positive")
        if not 0.0 <= self.val_fraction < 1.0:
            raise ValueError(f"{flag('val_fraction')} {self.val_fraction}: must be in [0, 1)")
        if self.precision not in PRECISIONS:
            raise ValueError(f"{flag('precision')} {self.precision!r}: choose one of {', '.join(PRECISIONS)}")
        for name in ("warmup_steps", "grad_clip", "weight_decay"):
            if getattr(self, name) < 0:
                raise ValueError(f"{flag(name)} {getattr(self, name)}: must be >= 0")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"{flag('min_lr_ratio')} {self.min_lr_ratio}: must be in [0, 1]")
        if not 0.0 < self.step_weight <= 1.0:
            raise ValueError(f"{flag('step_weight')} {self.step_weight}: must be in (0, 1]")
        if self.aux_layers is not None:
            object.__setattr__(self, "aux_layers", tuple(self.aux_layers))

    def num_steps(self, batches_per_epoch: int) -> int:
        """Total optimizer steps for a training split of `batches_per_epoch` global batches."""
        return self.total_steps or (self.epochs or 1) * batches_per_epoch

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict of every field."""
        d = asdict(self)
        d["aux_layers"] = list(self.aux_layers) if self.aux_layers is not None else None
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainConfig:
        """Inverse of `to_dict`; an unknown key is a ValueError naming it."""
        unknown = sorted(set(d) - set(cls.__dataclass_fields__))
        if unknown:
            raise ValueError(f"TrainConfig: unknown keys {unknown}")
        return cls(**d)


# ---------------------------------------------------------------------------------------------
# Processes

@dataclass(frozen=True)
class _Dist:
    """This process's place in the run: rank, world size, device."""

    rank: int
    world: int
    device: torch.device
    owns_group: bool
    last_barrier: list[Any] = field(default_factory=list, repr=False)  # see barrier()

    @property
    def main(self) -> bool:
        return self.rank == 0

    def sum(self, t: torch.Tensor) -> torch.Tensor:
        """Sum over ranks (a copy; identity on one process)."""
        t = t.detach().clone()
        if self.world > 1:
            t = t.to(self.device)
            dist.all_reduce(t)
        return t

    def barrier(self) -> None:
        """Wait for every rank (no-op on one process).

        The barrier's Work is kept until the next barrier, so that this thread frees it: a
        gloo barrier holds the collectives before it, and freeing their tensors takes the GIL,
        which a gloo worker thread cannot get once Python is exiting (the process then aborts:
        "terminate called without an active exception", after a 2-rank CPU run's last barrier).
        """
        if self.world > 1:
            work = dist.barrier(async_op=True)
            work.wait()
            self.last_barrier[:] = [work]


def resolve_device(device: str, local_rank: int = 0) -> torch.device:
    """"auto" -> cuda (this rank's GPU) when available, else cpu; "cuda" -> cuda:local_rank."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    return torch.device("cuda", local_rank) if dev.type == "cuda" and dev.index is None else dev


def setup_dist(device: str) -> _Dist:
    """Rank, world size and device from torchrun's environment; joins the process group."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    dev = resolve_device(device, local)
    owns = world > 1 and not dist.is_initialized()
    if owns:
        if dev.type == "cuda":
            torch.cuda.set_device(dev)
        dist.init_process_group("nccl" if dev.type == "cuda" else "gloo")
    return _Dist(rank, world, dev, owns)


def batch_order(train_ids: Sequence[int], epoch: int, config: TrainConfig) -> list[list[int]]:
    """The global batches of one epoch: a (seed, epoch)-seeded permutation, full batches only."""
    g = torch.Generator().manual_seed(permutation_seed(config.seed, epoch))
    order = [train_ids[i] for i in torch.randperm(len(train_ids), generator=g).tolist()]
    b = config.batch_size
    return [order[i:i + b] for i in range(0, len(order) - b + 1, b)]


def permutation_seed(seed: int, epoch: int) -> int:
    """Seed of epoch `epoch`'s shuffle (stored in checkpoints as the data position)."""
    return seed * 1_000_003 + epoch + 1


def split_samples(num_samples: int, config: TrainConfig) -> tuple[list[int], list[int]]:
    """(train ids, validation ids): a seeded permutation, the first val_fraction held out."""
    g = torch.Generator().manual_seed(config.seed)
    perm = torch.randperm(num_samples, generator=g).tolist()
    num_val = math.ceil(config.val_fraction * num_samples) if config.val_fraction else 0
    return sorted(perm[num_val:]), sorted(perm[:num_val])


def lr_lambda(step: int, warmup: int, total: int, min_ratio: float) -> float:
    """Multiplier of the base lr at `step`: linear warmup from 0, then cosine to min_ratio."""
    if step < warmup:
        return (step + 1) / (warmup + 1)
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def build_draft(config: TrainConfig, info: TargetInfo, token_counts: torch.Tensor) -> Eagle3Draft:
    """A fresh drafter for `info`'s target: seeded init, vocab map from loss-masked counts,
    the target's embedding (unless the drafter owns one)."""
    cfg = DraftConfig.from_target(info.config, info.aux_layers, config.draft_vocab_size,
                                  **config.draft_overrides)
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

    def forward(self, input_ids: torch.Tensor, aux_hidden: torch.Tensor, target_logits: torch.Tensor,
                loss_mask: torch.Tensor, ttt_steps: int, step_weight: float,
                replay: bool = False) -> dict[str, torch.Tensor]:
        out = ttt_loss(self.draft, input_ids, aux_hidden, target_logits, loss_mask,
                       ttt_steps=ttt_steps, step_weight=step_weight, replay=replay)
        return {f.name: getattr(out, f.name) for f in fields(out)}


class Trainer:
    """Drafter, optimizer and schedule of one run on one rank, with verb methods.

    ranks: this process's place in a torchrun job (default: one process on config.device).
    command: the training command, recorded in the manifest (`self.manifest`, which checkpoints
    carry so that `specdraft export` can write the drafter of any of them).
    Raises ValueError for a batch size that ranks and micro-batches cannot share, bf16 off CUDA,
    or too little data.
    """

    def __init__(self, config: TrainConfig, data: TrainData, ranks: _Dist | None = None,
                 command: str | None = None) -> None:
        ranks = ranks or _Dist(0, 1, resolve_device(config.device), False)
        self.config, self.data, self.ranks = config, data, ranks
        parts = ranks.world * config.grad_accum_steps
        if config.batch_size % parts:
            fits = [g for g in range(config.grad_accum_steps - 1, 0, -1) if config.batch_size % (ranks.world * g) == 0]
            raise ValueError(f"--batch-size {config.batch_size} does not split into {ranks.world} rank(s) x "
                             f"--grad-accum-steps {config.grad_accum_steps} micro-batches: use a multiple of {parts}"
                             + (f" or --grad-accum-steps {fits[0]}" if fits else ""))
        self.micro_batch_size = config.batch_size // parts  # sequences per forward on one rank
        if config.precision == "bf16" and ranks.device.type != "cuda":
            raise ValueError("--precision bf16 autocasts on CUDA only; use --precision fp32 on the CPU")
        self.train_ids, self.val_ids = split_samples(len(data), config)
        self.batches_per_epoch = len(self.train_ids) // config.batch_size
        if self.batches_per_epoch == 0:
            raise ValueError(f"{len(self.train_ids)} training samples are fewer than one batch of "
                             f"--batch-size {config.batch_size}: lower --batch-size or add data")
        self.total_steps = config.num_steps(self.batches_per_epoch)
        draft = build_draft(config, data.info, data.token_counts())
        self.manifest = draft_manifest(draft, data.info, command)
        self.model = TTTModel(draft).to(ranks.device)
        if ranks.world > 1:
            from torch.distributed.fsdp import fully_shard
            fully_shard(self.model)
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=config.lr, betas=(0.9, 0.95),
                                           weight_decay=config.weight_decay)
        self.scheduler = self._schedule(last_step=-1)
        self.step = 0
        # newest metrics records ("train": train_step's, "validation": evaluate's), kept in checkpoints
        self.records: dict[str, dict[str, Any] | None] = {"train": None, "validation": None}
        # run-length changes on resume: {"step", "from_total_steps", "to_total_steps"} each
        self.extensions: list[dict[str, int]] = []
        self.resume_note: str | None = None  # one line for the user when a resume changed the schedule

    def _schedule(self, last_step: int) -> torch.optim.lr_scheduler.LambdaLR:
        """The lr schedule over `total_steps` (`lr_lambda`), positioned after optimizer step
        `last_step` (-1: a fresh run; else the optimizer's lr is set for step last_step + 1)."""
        c = self.config
        return torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: lr_lambda(s, c.warmup_steps, self.total_steps, c.min_lr_ratio),
            last_epoch=last_step)

    def position(self, step: int) -> dict[str, int]:
        """Data position of optimizer step `step`: epoch, batch index, permutation seed."""
        epoch = step // self.batches_per_epoch
        return {"epoch": epoch, "batch_index": step % self.batches_per_epoch,
                "permutation_seed": permutation_seed(self.config.seed, epoch)}

    def micro_batches(self, sample_ids: Sequence[int]) -> list[list[int]]:
        """This rank's share of a global batch (every world-th sample, from this rank) as
        consecutive micro-batches of `micro_batch_size` sample ids (grad_accum_steps of them
        for a full batch)."""
        mine = list(sample_ids[self.ranks.rank::self.ranks.world])
        m = self.micro_batch_size
        return [mine[i:i + m] for i in range(0, len(mine), m)]

    def forward(self, batch: Batch, replay: bool = False) -> TTTOutput:
        """TTT loss and counts of one batch on this rank (counts local to the rank); with
        `replay`, also a chain engine's rounds (validation)."""
        bf16 = self.config.precision == "bf16"
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            out = self.model(batch.input_ids, batch.aux_hidden, batch.target_logits, batch.loss_mask,
                             self.config.ttt_steps, self.config.step_weight, replay)
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
        batches = [self.data.batch(ids, c.max_length, ranks.device) for ids in self.micro_batches(sample_ids)]
        totals = ranks.sum(sum(supervised_counts(self.model.draft, b.target_logits, b.loss_mask, c.ttt_steps)
                               for b in batches))
        if int(totals[0]) == 0:
            raise TrainingError(f"step {self.step}: batch of samples {sample_ids} has no supervised "
                                f"position (no label in an assistant turn inside the draft vocabulary); "
                                f"check the loss mask / chat template or drop these samples")
        self.optimizer.zero_grad(set_to_none=True)
        local = TTTMetrics.zeros(c.ttt_steps)
        for i, batch in enumerate(batches):
            local.add(self.accumulate(batch, totals, sync=i == len(batches) - 1))
        metrics = _global(local, ranks)
        loss_value = float(weighted_loss(metrics.loss_sums, metrics.total, c.step_weight))
        if not math.isfinite(loss_value):
            raise TrainingError(f"step {self.step}: loss is {loss_value} on the batch of samples "
                                f"{sample_ids}; check these samples' captured states for NaN/Inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(
            [p for p in self.model.parameters() if p.requires_grad], c.grad_clip or float("inf"))
        lr = self.scheduler.get_last_lr()[0]
        with _deferred_interrupt():  # a Ctrl-C checkpoint holds a whole update or none
            self.optimizer.step()
            self.scheduler.step()
            self.step += 1
        return {"step": self.step, "split": "train", "loss": loss_value, "lr": lr,
                "grad_norm": float(_full(grad_norm)), **metrics.to_dict()}

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
            chunk = self.val_ids[i:i + size]
            mine = chunk[ranks.rank::ranks.world]
            out = self.forward(self.data.batch(mine or chunk[:1], c.max_length, ranks.device), replay=True)
            if mine:
                metrics.add(out)
        return _global(metrics, ranks)

    def progress_state(self) -> dict[str, Any]:
        """The state besides weights and optimizer: step, config, number of samples of the data,
        scheduler, RNG, data position, newest metrics, run-length changes, and the drafter's
        manifest (as a dict; training None; its data_hash keys the data, `check_same_data`)."""
        rng = {"torch": torch.get_rng_state(), "python": random.getstate(),
               "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}
        return {"step": self.step, "config": self.config.to_dict(), "num_samples": len(self.data),
                "scheduler": self.scheduler.state_dict(), "rng": rng, "data": self.position(self.step),
                "records": dict(self.records), "extensions": list(self.extensions),
                "manifest": asdict(self.manifest)}

    def state(self) -> dict[str, Any]:
        """Full (unsharded, CPU) training state: `progress_state()` plus "model" and "optimizer";
        a collective: every rank must call it."""
        from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                             get_optimizer_state_dict)
        opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return {**self.progress_state(), "model": get_model_state_dict(self.model, options=opts),
                "optimizer": get_optimizer_state_dict(self.model, self.optimizer, options=opts)}

    def sharded_state(self) -> dict[str, Any]:
        """{"model", "optimizer"}: this rank's shards (DTensors) of the draft and the optimizer
        state, which torch.distributed.checkpoint saves, and loads into in place."""
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model, optimizer = get_state_dict(self.model, self.optimizer)
        return {"model": model, "optimizer": optimizer}

    def load_state(self, state: dict[str, Any], source: Path) -> None:
        """Restore `state()` (full tensors, as one process writes them) on any number of ranks:
        under FSDP2 each rank keeps its shards. A checkpoint whose settings differ in anything that
        shapes the weights (all but BOOKKEEPING_FIELDS, RUN_LENGTH_FIELDS and BATCH_SPLIT_FIELDS)
        is a ValueError naming the flags; a run length that differs is taken (`_fit_schedule`)."""
        from torch.distributed.checkpoint.state_dict import (StateDictOptions, set_model_state_dict,
                                                             set_optimizer_state_dict)
        self._check_config(state["config"], source)
        opts = StateDictOptions(full_state_dict=True)
        set_model_state_dict(self.model, state["model"], options=opts)
        set_optimizer_state_dict(self.model, self.optimizer, state["optimizer"], options=opts)
        self._restore_progress(state, source)

    def load_sharded_state(self, path: Path) -> None:
        """Restore a directory written by `write_sharded_checkpoint` by any number of ranks, on
        this run's ranks (one process reads whole tensors); a collective. Raises as `load_state`."""
        from torch.distributed.checkpoint.state_dict import set_state_dict

        progress = torch.load(path / PROGRESS_FILE, map_location="cpu", weights_only=False)
        self._check_config(progress["config"], path)
        state = self.sharded_state()
        _read_sharded(state, path, one_process=self.ranks.world == 1)
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optimizer"])
        self._restore_progress(progress, path)

    def _check_config(self, saved: dict[str, Any], source: Path) -> None:
        differ = [k for k, v in self.config.to_dict().items()
                  if k not in BOOKKEEPING_FIELDS | RUN_LENGTH_FIELDS | BATCH_SPLIT_FIELDS and saved.get(k) != v]
        if differ:
            changes = ", ".join(f"{flag(k)} {saved.get(k)!r} -> {getattr(self.config, k)!r}" for k in differ)
            raise ValueError(f"{source}: this checkpoint was trained with other settings ({changes}); leave them "
                             f"out to resume with the checkpoint's values (only the run length, --steps / --epochs, "
                             f"may change, as may --grad-accum-steps), or train into a new OUT directory")

    def _restore_progress(self, progress: dict[str, Any], source: Path) -> None:
        self.scheduler.load_state_dict(progress["scheduler"])
        torch.set_rng_state(progress["rng"]["torch"])
        random.setstate(progress["rng"]["python"])
        if progress["rng"]["cuda"] is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(progress["rng"]["cuda"])
        self.step = progress["step"]
        if progress["data"] != self.position(self.step):
            raise ValueError(self._moved_data(progress["data"], source))
        # checkpoints of specdraft before these keys hold neither: nothing recorded yet
        self.records = dict(progress.get("records", self.records))
        self.extensions = list(progress.get("extensions", []))
        self._fit_schedule(TrainConfig.from_dict(progress["config"]).num_steps(self.batches_per_epoch), source)

    def _moved_data(self, saved: dict[str, int], source: Path) -> str:
        """Why the checkpoint `source`'s data position `saved` (`position`) is not this run's at its
        step, in a user's terms: the training split has another number of batches per epoch (the
        data changed; a checkpoint with a data hash is refused before, by `check_same_data`)."""
        epoch, index, now = saved["epoch"], saved["batch_index"], self.position(self.step)
        if (epoch, index) == (now["epoch"], now["batch_index"]):  # same split, another shuffle
            return (f"{source}: this checkpoint's data order (shuffle seed {saved['permutation_seed']}) is not "
                    f"this specdraft's ({now['permutation_seed']}): train into a new OUT directory")
        # step = epoch * batches per epoch + index; in epoch 0 only a lower bound is known
        was = f"{(self.step - index) // epoch}" if epoch else f"at least {index + 1}"
        return (f"{source}: the training split now has {self.batches_per_epoch} batches of --batch-size "
                f"{self.config.batch_size} per epoch ({len(self.train_ids)} training samples), but had {was} when "
                f"this checkpoint was written (its step {self.step} was batch {index + 1} of epoch {epoch + 1}): "
                f"the data changed since; resume with the store (or --online data file) it was trained on, or "
                f"train into a new OUT directory")

    def _fit_schedule(self, saved_total: int, source: Path) -> None:
        """Continue a checkpoint of a `saved_total`-step run as a `total_steps` run.

        The lr schedule (warm-up over the same warmup_steps, then cosine decay) is recomputed for
        the new total and the optimizer's lr set to its value at the checkpoint's step: steps
        before it keep the lr they had, steps from it on follow the new curve. The change is
        appended to `extensions` (the manifest records them) and described in `resume_note`.
        Raises ValueError for a total below the checkpoint's step.
        """
        if self.step > self.total_steps:
            raise ValueError(f"{source} is at step {self.step}, past this run's {self.total_steps} steps: pass "
                             f"--steps {self.step} or more (or train into a new OUT directory)")
        if saved_total == self.total_steps or self.step == self.total_steps:  # no step left to schedule
            return
        old_lr = self.scheduler.get_last_lr()[0]
        self.scheduler = self._schedule(last_step=self.step - 1)
        self.extensions.append({"step": self.step, "from_total_steps": saved_total,
                                "to_total_steps": self.total_steps})
        c = self.config
        self.resume_note = (f"run length {saved_total} -> {self.total_steps} steps: the learning-rate schedule "
                            f"(warm-up {c.warmup_steps} steps, cosine decay to {c.min_lr_ratio} x lr {c.lr}) is "
                            f"recomputed for {self.total_steps} steps; step {self.step + 1} runs at lr "
                            f"{self.scheduler.get_last_lr()[0]:.3g} (the old schedule: {old_lr:.3g})")

    def full_draft(self, model_state: dict[str, torch.Tensor]) -> Eagle3Draft:
        """A CPU Eagle3Draft holding `model_state` (from `state()["model"]`), strictly loaded."""
        draft = Eagle3Draft(self.model.draft.cfg)
        draft.load_state_dict({k.removeprefix("draft."): v for k, v in model_state.items()}, strict=True)
        draft.embedding_loaded = True
        return draft


def _global(local: TTTMetrics, ranks: _Dist) -> TTTMetrics:
    """`local`'s counts and loss sums summed over ranks (on the CPU)."""
    return TTTMetrics(*(ranks.sum(getattr(local, f.name)).cpu() for f in fields(local)))


def _full(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's full value (FSDP2's grad norm); plain tensors pass through."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


# ---------------------------------------------------------------------------------------------
# Files: checkpoints, metrics, the final drafter

def checkpoint_paths(out_dir: Path) -> list[Path]:
    """Complete checkpoints under out_dir/checkpoints, oldest first: step-N.pt files (one
    process) and step-N directories (several ranks); temp names start with "." and are skipped."""
    return sorted((Path(out_dir) / CHECKPOINT_DIR).glob("step-*"))


def checkpoint_config(path: Path) -> dict[str, Any]:
    """The TrainConfig dict a checkpoint of `checkpoint_paths` was written with (its weights are
    mapped, not read)."""
    return _checkpoint_progress(path)["config"]


def _checkpoint_progress(path: Path) -> dict[str, Any]:
    """A checkpoint's state (`Trainer.progress_state` keys; weights mapped, not read)."""
    path = Path(path)
    return torch.load(path / PROGRESS_FILE if path.is_dir() else path, map_location="cpu",
                      weights_only=False, mmap=not path.is_dir())


def check_run_dir(out_dir: Path) -> None:
    """FileExistsError unless `out_dir` is missing, empty or a run directory (RUN_ENTRIES): a file,
    or a directory of other files only, would get checkpoints mixed into it."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise FileExistsError(f"{out_dir} is a file; the run directory OUT must be a directory (it receives "
                              "checkpoints/, metrics.jsonl, tensorboard/, draft/): give a new directory")
    entries = sorted(p.name for p in out_dir.iterdir()) if out_dir.is_dir() else []
    if entries and not RUN_ENTRIES & set(entries):
        shown = ", ".join(entries[:3]) + (", ..." if len(entries) > 3 else "")
        raise FileExistsError(f"{out_dir} holds no training run but other files ({shown}): give a new or empty "
                              f"directory as OUT (--resume continues a run directory)")


def check_same_data(saved: dict[str, Any], info: TargetInfo, num_samples: int, source: Path) -> None:
    """Refuse to resume the checkpoint `source`, whose state is `saved` (`Trainer.progress_state`),
    on data of another target (`sources.same_target`), other aux layers, or other samples than
    `info`'s (`num_samples` of them): the data hash the checkpoint's manifest records
    (`specdraft.data.render.data_hash`, from the store's index or the --online data as rendered) against
    `info`'s. Its weights and its place in the data order fit its own data only, and the manifest
    would record the new data as the drafter's. What a checkpoint does not record (older
    specdraft: no manifest, no data hash, no sample count) is not checked."""
    manifest = saved.get("manifest") or {}
    target, layers = manifest.get("target"), tuple(manifest.get("aux_layers") or ())
    now = info.manifest_fields.get("target")
    diffs = []
    if target and now and not same_target(target, now):
        diffs.append(f"target {describe_target(target)} -> {describe_target(now)}")
    if layers and layers != tuple(info.aux_layers):
        diffs.append(f"aux layers {','.join(map(str, layers))} -> {','.join(map(str, info.aux_layers))}")
    was_hash, now_hash = manifest.get("data_hash"), info.manifest_fields.get("data_hash")
    if was_hash and now_hash and was_hash != now_hash:
        diffs.append(f"data hash {_describe_data(was_hash, saved.get('num_samples'))} -> "
                     f"{_describe_data(now_hash, num_samples)}")
    if diffs:
        raise ValueError(f"{source}: this checkpoint was trained on other data ({'; '.join(diffs)}): resume with "
                         f"the store (or --online data file and --target) it was trained on, or train into a new "
                         f"OUT directory")


def _describe_data(digest: str, num_samples: int | None) -> str:
    """A data hash in a few words: its first 12 hex digits, and the sample count when known."""
    return f"{digest[:12]} ({num_samples} samples)" if num_samples is not None else digest[:12]


def resume_config(out_dir: str | Path, given: dict[str, Any]) -> TrainConfig:
    """The config of `--resume`: the newest checkpoint's under out_dir, with the settings `given`
    (TrainConfig fields the user set: flags and --config keys) in its place. A run length given
    (total_steps or epochs) replaces both of the checkpoint's; `device` is this machine's, never
    the checkpoint's. `TrainConfig.from_dict(given)` when out_dir holds no checkpoint yet.
    Settings given that differ from the checkpoint's are refused later, by `Trainer.load_state`.
    """
    paths = checkpoint_paths(Path(out_dir))
    if not paths:
        return TrainConfig.from_dict(given)
    saved = {k: v for k, v in checkpoint_config(paths[-1]).items()
             if k in TrainConfig.__dataclass_fields__ and k != "device"}
    if "total_steps" in given or "epochs" in given:
        saved.update(total_steps=None, epochs=None)
    return TrainConfig.from_dict({**saved, **given})


def write_checkpoint(state: dict[str, Any], out_dir: Path, keep: int) -> Path:
    """Write `state` atomically (temp file, then os.replace); keep the newest `keep` checkpoints."""
    folder = Path(out_dir) / CHECKPOINT_DIR
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"step-{state['step']:08d}.pt"
    tmp = folder / f".{path.name}.tmp-{os.getpid()}"
    torch.save(state, tmp)
    os.replace(tmp, path)
    _prune(out_dir, keep)
    return path


def write_sharded_checkpoint(trainer: Trainer, out_dir: Path) -> Path:
    """Write the trainer's state with torch.distributed.checkpoint, atomically; a collective.

    Every rank writes its shards of the draft and optimizer (`Trainer.sharded_state`) into
    out_dir/checkpoints/.step-N.tmp and rank 0 adds PROGRESS_FILE (`Trainer.progress_state`);
    after a barrier rank 0 renames the directory to step-N and keeps the newest
    `keep_checkpoints`. A run killed while writing leaves only the temp directory, which the
    next write of that step replaces. Returns the checkpoint directory.
    """
    import torch.distributed.checkpoint as dcp

    ranks = trainer.ranks
    folder = Path(out_dir) / CHECKPOINT_DIR
    path = folder / f"step-{trainer.step:08d}"
    tmp = folder / f".{path.name}.tmp"
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
        os.replace(tmp, path)
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
            keep = [ln for ln in self.path.read_text().splitlines()
                    if ln and json.loads(ln)["step"] <= resume_step]
            tmp = self.path.with_name(f".{self.path.name}.tmp-{os.getpid()}")
            tmp.write_text("".join(ln + "\n" for ln in keep))
            os.replace(tmp, self.path)
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


def draft_manifest(draft: Eagle3Draft, info: TargetInfo, command: str | None) -> Manifest:
    """The manifest of a drafter trained on `info`'s target (training metrics still None)."""
    return Manifest(draft=draft.cfg.to_dict(), aux_layers=list(info.aux_layers),
                    draft_vocab_hash=tensor_digest(draft.d2t), training_command=command,
                    **info.manifest_fields)


def is_training_checkpoint(path: str | Path) -> bool:
    """Whether `path` looks like a checkpoint of `checkpoint_paths`: a torch.save file (a zip
    archive, as write_checkpoint writes) or a directory holding PROGRESS_FILE (sharded)."""
    path = Path(path)
    return (path / PROGRESS_FILE).is_file() if path.is_dir() else path.is_file() and zipfile.is_zipfile(path)


def load_training_checkpoint(path: str | Path) -> LoadedDraft:
    """The drafter of a training checkpoint (a step-N.pt file or a sharded step-N directory
    under RUN/checkpoints), on the CPU in fp32, with the manifest the checkpoint carries; its
    `training` records the step and checkpoint, the config, and the newest train and validation
    metrics (each with its own step). Layout "specdraft".

    Raises CheckpointError naming the file for a checkpoint that carries no manifest (written
    by specdraft before checkpoints did): the command that finishes its run is named instead.
    """
    path = Path(path)
    progress = torch.load(path / PROGRESS_FILE if path.is_dir() else path, map_location="cpu",
                          weights_only=False)
    if "manifest" not in progress:
        run = path.parent.parent
        raise CheckpointError(f"{path}: this checkpoint carries no drafter manifest (written by an older "
                              f"specdraft), so it cannot be exported; finish its run (specdraft train SOURCE "
                              f"{run} --resume) and export {run / 'draft'}")
    manifest = Manifest(**progress["manifest"])
    draft = Eagle3Draft(DraftConfig.from_dict(manifest.draft))
    model_state = _sharded_model_state(path, draft) if path.is_dir() else progress["model"]
    draft.load_state_dict({k.removeprefix("draft."): v for k, v in model_state.items()}, strict=True)
    draft.embedding_loaded = True
    manifest.training = {"steps": progress["step"], "checkpoint": str(path), **progress["records"],
                         "extensions": progress["extensions"], "config": progress["config"]}
    return LoadedDraft(model=draft, manifest=manifest, layout="specdraft", path=path)


def _sharded_model_state(path: Path, draft: Eagle3Draft) -> dict[str, torch.Tensor]:
    """The drafter's full tensors from a torch.distributed.checkpoint directory, read in this
    one process (shards of any world size are gathered into `draft`-shaped tensors)."""
    state = {"model": {f"draft.{k}": v.clone() for k, v in draft.state_dict().items()}}
    _read_sharded(state, path, one_process=True)
    return state["model"]


def _read_sharded(state: dict[str, Any], path: Path, one_process: bool) -> None:
    """Load the torch.distributed.checkpoint directory `path` into `state` in place, resharded to
    `state`'s tensors: each rank its shards (a collective), or with `one_process` whole tensors
    read here, whatever number of ranks wrote them."""
    import warnings

    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():  # "... assuming the intent is to load in a single process": it is
        warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        dcp.load(state, checkpoint_id=path, no_dist=one_process)


def save_final_draft(draft: Eagle3Draft, out_dir: Path, manifest: Manifest, training: dict[str, Any]) -> Path:
    """Save the trained drafter in the specdraft layout with `manifest`, its `training` set."""
    return save_draft(draft, out_dir, layout="specdraft", manifest=replace(manifest, training=training))


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


def train(config: TrainConfig, source: str | Path | OnlineSource | TrainData, out_dir: str | Path, *,
          resume: bool = False, command: str | None = None, progress: bool = True,
          on_step: Callable[[int], None] | None = None, target_config: Any = None,
          on_note: Callable[[str], None] | None = None) -> TrainResult:
    """Train an EAGLE-3 drafter; under torchrun, on every rank (same arguments).

    source: a capture store directory (offline), an OnlineSource (target directory and data
    file: the target runs in the loop, loaded on each rank's device) or a TrainData such as
    OnlineData.
    out_dir: receives checkpoints/, metrics.jsonl, tensorboard/ and the final draft/.
    resume: continue from the newest checkpoint in out_dir (from scratch when there is none);
    without it an out_dir that already holds checkpoints is refused (FileExistsError), as is an
    out_dir that is a file or a directory of other files (no run entry, RUN_ENTRIES). Resuming on
    data of another target, aux layers or samples (data hash) than the checkpoint's is a ValueError
    naming both (`check_same_data`). Ctrl-C (KeyboardInterrupt) in one process checkpoints the
    current step before it propagates (`_checkpoint_on_interrupt`); under torchrun, Ctrl-C
    (SIGINT) or SIGTERM lets every rank finish its step, then all checkpoint that step and raise
    KeyboardInterrupt (`_interrupt_flag`). The checkpoint may come from another number
    of ranks (a step-N.pt file of one process, a sharded step-N directory of several): it is
    resharded to this run's. The run length (total_steps / epochs) may differ from the
    checkpoint's: the run is extended (or shortened, not below the checkpoint's step) and the lr
    schedule recomputed for the new total (`Trainer._fit_schedule`); grad_accum_steps may differ;
    every other setting that shapes the weights must match (`resume_config` takes them from the checkpoint).
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
            check_same_data(_checkpoint_progress(newest[0]), data.info, len(data), newest[0])
        data = open_data(data, aux_layers=config.aux_layers)
        trainer = Trainer(config, data, ranks, command)
        resumed = _resume(trainer, out_dir, resume)
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


def _resume(trainer: Trainer, out_dir: Path, resume: bool) -> int | None:
    """Load the newest checkpoint when resuming; returns its step (None: fresh run)."""
    paths = checkpoint_paths(out_dir)
    if paths and not resume:
        raise FileExistsError(f"{out_dir} already holds checkpoints ({paths[-1].name}): pass --resume to "
                              f"continue its run (with its settings), or train into a new OUT directory")
    if not paths:
        return None
    if paths[-1].is_dir():
        trainer.load_sharded_state(paths[-1])
    else:
        trainer.load_state(torch.load(paths[-1], map_location="cpu", weights_only=False), paths[-1])
    return trainer.step


def _run(trainer: Trainer, out_dir: Path, log: MetricsLog, progress: bool,
         on_step: Callable[[int], None] | None) -> TrainResult:
    c, ranks = trainer.config, trainer.ranks
    last: dict[str, Any] | None = None
    validation: dict[str, Any] | None = None
    with _progress(progress and ranks.main, trainer.total_steps, trainer.step) as advance, \
            _checkpoint_on_interrupt(trainer, out_dir), _interrupt_flag(ranks) as interrupted:
        while trainer.step < trainer.total_steps:
            pos = trainer.position(trainer.step)
            batch = batch_order(trainer.train_ids, pos["epoch"], c)[pos["batch_index"]]
            last = trainer.records["train"] = trainer.train_step(batch)
            log.write(last)
            if trainer.val_ids and (trainer.step % c.eval_every == 0 or trainer.step == trainer.total_steps):
                validation = {"step": trainer.step, "split": "val", **trainer.evaluate().to_dict()}
                trainer.records["validation"] = validation
                log.write(validation)
            saved = trainer.step % c.save_every == 0 or trainer.step == trainer.total_steps
            if saved:
                _save(trainer, out_dir)
            advance(last["loss"])
            if on_step is not None:
                on_step(trainer.step)
            if interrupted():  # several ranks: all of them, here, at the same step
                if not saved:
                    _save(trainer, out_dir)
                raise KeyboardInterrupt
    if validation is None and trainer.val_ids:  # resumed after the last step's evaluation
        validation = {"step": trainer.step, "split": "val", **trainer.evaluate().to_dict()}
    state = trainer.state()
    draft_dir = None
    if ranks.main:
        training = {"steps": trainer.step, "train": trainer.records["train"], "validation": validation,
                    "extensions": trainer.extensions, "config": c.to_dict()}
        draft_dir = save_final_draft(trainer.full_draft(state["model"]), out_dir / "draft",
                                     trainer.manifest, training)
    ranks.barrier()
    return TrainResult(trainer.step, last["loss"] if last else None, validation, draft_dir, log.path)


@contextlib.contextmanager
def _checkpoint_on_interrupt(trainer: Trainer, out_dir: Path):
    """On Ctrl-C (KeyboardInterrupt) in one process, checkpoint the current step unless its
    checkpoint exists, then re-raise: `--resume` goes on from there. A step in progress is
    dropped whole (its optimizer update is never interrupted: `_deferred_interrupt`). Several
    ranks checkpoint in the loop instead, at a step they agree on (`_interrupt_flag`): a
    KeyboardInterrupt that reaches here on several ranks (a second Ctrl-C) saves nothing, as a
    collective after it may hang."""
    try:
        yield
    except KeyboardInterrupt:
        saved = checkpoint_paths(out_dir)
        done = saved and saved[-1].name == f"step-{trainer.step:08d}.pt"
        if trainer.ranks.world == 1 and trainer.step > 0 and not done:
            write_checkpoint(trainer.state(), out_dir, trainer.config.keep_checkpoints)
        raise


@contextlib.contextmanager
def _interrupt_flag(ranks: _Dist):
    """On several ranks, turn the first SIGINT or SIGTERM into a request to stop; yields
    interrupted(), which every rank calls at each step boundary: true on all ranks when any
    rank was signalled (one int all-reduced with MAX on the group's device, beside the step's
    own syncs). The caller then checkpoints the step (a collective) and raises
    KeyboardInterrupt. One process keeps Python's KeyboardInterrupt (interrupted() is False).

    Under torchrun (torch.distributed.elastic, torch 2.13): workers are started in sessions of
    their own (SubprocessHandler: start_new_session), so a terminal's Ctrl-C reaches torchrun
    only. Its agent catches SIGINT, SIGTERM, SIGHUP and SIGQUIT (TORCHELASTIC_SIGNALS_TO_HANDLE)
    and sends that signal to every worker's process group (SubprocessContext._close), so a
    worker sees SIGINT for Ctrl-C and SIGTERM when torchrun itself is terminated. Then it waits
    --shutdown-timeout seconds (TORCH_ELASTIC_SHUTDOWN_TIMEOUT, default 30) for all workers
    together and SIGKILLs those left: the rest of the step, its evaluation and the checkpoint
    must fit in that time (a killed write leaves the previous checkpoint). A second Ctrl-C to
    torchrun, during that wait, makes it send SIGTERM. Ranks may be signalled at different
    points of a step; the handler only sets a flag, so no collective is cut short.

    A second SIGINT or SIGTERM on a rank puts the previous handlers back and re-raises the
    signal: KeyboardInterrupt (SIGINT) or the default exit (SIGTERM), at once, unsaved. Handlers
    live in the main thread only; elsewhere nothing is caught (but the ranks still agree)."""
    import signal
    import threading

    if ranks.world == 1:
        yield lambda: False
        return
    caught: list[int] = []
    previous: dict[int, Any] = {}

    def restore() -> None:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        previous.clear()

    def on_signal(signum: int, frame: Any) -> None:
        if caught:  # the second: abort as without this handler
            restore()
            signal.raise_signal(signum)
            return
        caught.append(signum)

    def interrupted() -> bool:
        flag = torch.tensor([int(bool(caught))], device=ranks.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())

    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGINT, signal.SIGTERM):
            if signal.getsignal(signum) is not None:  # None: a handler installed outside Python
                previous[signum] = signal.signal(signum, on_signal)
    try:
        yield interrupted
    finally:
        restore()


@contextlib.contextmanager
def _deferred_interrupt():
    """Hold Ctrl-C (SIGINT) back until the block ends, then raise KeyboardInterrupt: the block
    (an optimizer update) runs whole. Only Python's own KeyboardInterrupt handler is held back,
    in the main thread (signal handlers live there); another one, such as `_interrupt_flag`'s
    on several ranks (which raises nothing), is left in place."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield  # not ours to hold
        return
    caught = []
    previous = signal.signal(signal.SIGINT, lambda *a: caught.append(True))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if caught:
        raise KeyboardInterrupt


def _save(trainer: Trainer, out_dir: Path) -> None:
    """Checkpoint the current step: one file on one process, a sharded directory on several."""
    if trainer.ranks.world > 1:
        write_sharded_checkpoint(trainer, out_dir)
    else:
        write_checkpoint(trainer.state(), out_dir, trainer.config.keep_checkpoints)


@contextlib.contextmanager
def _progress(enabled: bool, total: int, start: int):
    """Rich progress bar; yields advance(loss)."""
    if not enabled:
        yield lambda loss: None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    columns = (TextColumn("train"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(elapsed_when_finished=True),
               TextColumn("loss {task.fields[loss]}"))  # time left while running, time taken once done
    with Progress(*columns, transient=False) as bar:
        task = bar.add_task("train", total=total, completed=start, loss="-")
        yield lambda loss: bar.update(task, advance=1, loss=f"{loss:.4f}")
