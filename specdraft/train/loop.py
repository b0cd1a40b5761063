"""The trainer: data order, optimizer, schedule, validation, checkpoints and resume.

The only file that knows about epochs. One entry point, `train`, runs on one process or under
`torchrun` (torch.distributed: gloo on the CPU, nccl on GPUs; the draft sharded with FSDP2).
A global batch of `batch_size` sequences is split across ranks (rank r takes every world-th
sequence) and the loss is normalised by the global count of supervised positions, so N
processes compute the same loss and gradients as one. Rank 0 writes checkpoints and metrics.

Resume is exact: a checkpoint holds the draft, optimizer, scheduler, RNG states and the data
position; the data order is a function of (seed, epoch), so a resumed run repeats the same
batches and, on the CPU in fp32, ends with the same weights bit for bit.

    specdraft train STORE RUN [--config cfg.json] [--resume]
    torchrun --nproc-per-node 2 -m specdraft.cli train STORE RUN ...
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from specdraft.conventions import build_vocab_map
from specdraft.draft import DraftConfig, Eagle3Draft
from specdraft.train.loss import TTTMetrics, TTTOutput, ttt_loss, weighted_loss
from specdraft.train.sources import Batch, TargetInfo, TrainData, open_data

PRECISIONS = ("fp32", "bf16")
CHECKPOINT_DIR = "checkpoints"
METRICS_FILE = "metrics.jsonl"
# TrainConfig fields a resumed run may change: they do not change the weights it ends with.
BOOKKEEPING_FIELDS = frozenset({"eval_every", "save_every", "keep_checkpoints", "device"})


class TrainingError(RuntimeError):
    """Training cannot go on (non-finite loss, a batch without supervision); names the samples."""


@dataclass(frozen=True)
class TrainConfig:
    """Hyper-parameters of one training run (grouped by stage). Unset sizes come from the target.

    Length of the run: exactly one of `total_steps` (optimizer steps) or `epochs` (passes over
    the training split; the last partial global batch of an epoch is dropped); neither = 1 epoch.
    `batch_size` counts sequences per optimizer step over all ranks (a multiple of the world
    size). `precision` "bf16" autocasts on CUDA only (fp32 master weights); on the CPU it is an
    error. `draft_overrides` replace DraftConfig fields derived from the target.
    """

    # optimisation
    lr: float = 1e-4
    warmup_steps: int = 100
    total_steps: int | None = None
    epochs: int | None = None
    batch_size: int = 8
    max_length: int = 2048
    grad_clip: float = 1.0
    weight_decay: float = 0.0
    min_lr_ratio: float = 0.0
    # training-time test
    ttt_steps: int = 7
    step_weight: float = 0.8
    # drafter
    draft_vocab_size: int | None = None
    aux_layers: tuple[int, ...] | None = None  # online targets only; a store fixes its layers
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
        positive = ("lr", "batch_size", "max_length", "ttt_steps", "eval_every", "save_every",
                    "keep_checkpoints")
        for name in positive:
            if getattr(self, name) <= 0:
                raise ValueError(f"TrainConfig.{name} = {getattr(self, name)}: must be positive")
        if self.total_steps is not None and self.epochs is not None:
            raise ValueError("TrainConfig: set total_steps or epochs, not both")
        for name in ("total_steps", "epochs"):
            if getattr(self, name) is not None and getattr(self, name) <= 0:
                raise ValueError(f"TrainConfig.{name} = {getattr(self, name)}: must be positive")
        if not 0.0 <= self.val_fraction < 1.0:
            raise ValueError(f"TrainConfig.val_fraction = {self.val_fraction}: must be in [0, 1)")
        if self.precision not in PRECISIONS:
            raise ValueError(f"TrainConfig.precision = {self.precision!r}: choose one of {PRECISIONS}")
        if self.warmup_steps < 0 or self.grad_clip < 0 or self.weight_decay < 0:
            raise ValueError("TrainConfig: warmup_steps, grad_clip and weight_decay must be >= 0")
        if not 0.0 <= self.min_lr_ratio <= 1.0 or not 0.0 < self.step_weight <= 1.0:
            raise ValueError("TrainConfig: min_lr_ratio must be in [0, 1] and step_weight in (0, 1]")
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
        if self.world > 1:
            dist.barrier()


def resolve_device(device: str, local_rank: int = 0) -> torch.device:
    """"auto" -> cuda (this rank's GPU) when available, else cpu; "cuda" -> cuda:local_rank."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    return torch.device("cuda", local_rank) if dev.type == "cuda" and dev.index is None else dev


def _setup_dist(device: str) -> _Dist:
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
    once per optimizer step. Returns TTTOutput's fields as a dict (FSDP hooks the tensors).
    """

    def __init__(self, draft: Eagle3Draft) -> None:
        super().__init__()
        self.draft = draft

    def forward(self, input_ids: torch.Tensor, aux_hidden: torch.Tensor, target_logits: torch.Tensor,
                loss_mask: torch.Tensor, ttt_steps: int, step_weight: float) -> dict[str, torch.Tensor]:
        out = ttt_loss(self.draft, input_ids, aux_hidden, target_logits, loss_mask,
                       ttt_steps=ttt_steps, step_weight=step_weight)
        return {f.name: getattr(out, f.name) for f in fields(out)}


class Trainer:
    """Drafter, optimizer and schedule of one run on one rank, with verb methods.

    ranks: this process's place in a torchrun job (default: one process on config.device).
    Raises ValueError for a batch size that ranks cannot share, bf16 off CUDA, or too little data.
    """

    def __init__(self, config: TrainConfig, data: TrainData, ranks: _Dist | None = None) -> None:
        ranks = ranks or _Dist(0, 1, resolve_device(config.device), False)
        self.config, self.data, self.ranks = config, data, ranks
        if config.batch_size % ranks.world:
            raise ValueError(f"TrainConfig.batch_size {config.batch_size} is not a multiple of the "
                             f"world size {ranks.world}")
        if config.precision == "bf16" and ranks.device.type != "cuda":
            raise ValueError("TrainConfig.precision 'bf16' autocasts on CUDA only; use 'fp32' on the CPU")
        self.train_ids, self.val_ids = split_samples(len(data), config)
        self.batches_per_epoch = len(self.train_ids) // config.batch_size
        if self.batches_per_epoch == 0:
            raise ValueError(f"{len(self.train_ids)} training samples are fewer than one batch of "
                             f"{config.batch_size}: lower batch_size or add data")
        self.total_steps = config.num_steps(self.batches_per_epoch)
        self.model = TTTModel(build_draft(config, data.info, data.token_counts())).to(ranks.device)
        if ranks.world > 1:
            from torch.distributed.fsdp import fully_shard
            fully_shard(self.model)
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=config.lr, betas=(0.9, 0.95),
                                           weight_decay=config.weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: lr_lambda(s, config.warmup_steps, self.total_steps,
                                                config.min_lr_ratio))
        self.step = 0

    def position(self, step: int) -> dict[str, int]:
        """Data position of optimizer step `step`: epoch, batch index, permutation seed."""
        epoch = step // self.batches_per_epoch
        return {"epoch": epoch, "batch_index": step % self.batches_per_epoch,
                "permutation_seed": permutation_seed(self.config.seed, epoch)}

    def forward(self, sample_ids: Sequence[int]) -> tuple[TTTOutput, Batch]:
        """TTT loss of this rank's share of `sample_ids` (every world-th, from this rank)."""
        batch = self.data.batch(sample_ids, self.config.max_length, self.ranks.device)
        bf16 = self.config.precision == "bf16"
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            out = self.model(batch.input_ids, batch.aux_hidden, batch.target_logits, batch.loss_mask,
                             self.config.ttt_steps, self.config.step_weight)
        return TTTOutput(**out), batch

    def train_step(self, sample_ids: list[int]) -> dict[str, Any]:
        """One optimizer step on a global batch; returns its metrics record (global counts).

        Raises TrainingError naming the batch's sample ids when the loss is NaN/Inf or the
        batch has no supervised position (FC-07).
        """
        c, ranks = self.config, self.ranks
        out, _ = self.forward(sample_ids[ranks.rank::ranks.world])
        totals, sums = ranks.sum(out.total), ranks.sum(out.step_loss_sums)
        loss_value = float(weighted_loss(sums, totals, c.step_weight))
        if int(totals[0]) == 0:
            raise TrainingError(f"step {self.step}: batch of samples {sample_ids} has no supervised "
                                f"position (no label in an assistant turn inside the draft vocabulary); "
                                f"check the loss mask / chat template or drop these samples")
        if not math.isfinite(loss_value):
            raise TrainingError(f"step {self.step}: loss is {loss_value} on the batch of samples "
                                f"{sample_ids}; check these samples' captured states for NaN/Inf")
        # global normalisation x world: FSDP averages gradients over ranks
        loss = weighted_loss(out.step_loss_sums, totals.to(out.step_loss_sums.device), c.step_weight)
        self.optimizer.zero_grad(set_to_none=True)
        (loss * ranks.world).backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(
            [p for p in self.model.parameters() if p.requires_grad], c.grad_clip or float("inf"))
        lr = self.scheduler.get_last_lr()[0]
        self.optimizer.step()
        self.scheduler.step()
        self.step += 1
        metrics = TTTMetrics.zeros(c.ttt_steps)
        metrics.add(_global(out, ranks))
        return {"step": self.step, "split": "train", "loss": loss_value, "lr": lr,
                "grad_norm": float(_full(grad_norm)), **metrics.to_dict()}

    @torch.no_grad()
    def evaluate(self) -> TTTMetrics:
        """Per-step counts over the validation split (all ranks; a rank without a sample in the
        last chunk runs a duplicate whose counts are dropped, so collectives stay matched)."""
        metrics = TTTMetrics.zeros(self.config.ttt_steps)
        b, ranks = self.config.batch_size, self.ranks
        for i in range(0, len(self.val_ids), b):
            chunk = self.val_ids[i:i + b]
            mine = chunk[ranks.rank::ranks.world]
            out, _ = self.forward(mine or chunk[:1])
            if not mine:
                out = _zero_counts(out)
            metrics.add(_global(out, ranks))
        return metrics

    def state(self) -> dict[str, Any]:
        """Full (unsharded, CPU) training state; a collective: every rank must call it."""
        from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                             get_optimizer_state_dict)
        opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
        rng = {"torch": torch.get_rng_state(), "python": random.getstate(),
               "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}
        return {"step": self.step, "config": self.config.to_dict(),
                "model": get_model_state_dict(self.model, options=opts),
                "optimizer": get_optimizer_state_dict(self.model, self.optimizer, options=opts),
                "scheduler": self.scheduler.state_dict(), "rng": rng,
                "data": self.position(self.step)}

    def load_state(self, state: dict[str, Any], source: Path) -> None:
        """Restore `state()`. A checkpoint whose settings differ in anything that shapes the
        weights (all but BOOKKEEPING_FIELDS) is a ValueError naming the fields."""
        from torch.distributed.checkpoint.state_dict import (StateDictOptions, set_model_state_dict,
                                                             set_optimizer_state_dict)
        differ = sorted(k for k, v in self.config.to_dict().items()
                        if k not in BOOKKEEPING_FIELDS and state["config"].get(k) != v)
        if differ:
            raise ValueError(f"{source}: checkpoint was written with other settings {differ}; "
                             f"resume with the same config or train into a new out_dir")
        opts = StateDictOptions(full_state_dict=True)
        set_model_state_dict(self.model, state["model"], options=opts)
        set_optimizer_state_dict(self.model, self.optimizer, state["optimizer"], options=opts)
        self.scheduler.load_state_dict(state["scheduler"])
        torch.set_rng_state(state["rng"]["torch"])
        random.setstate(state["rng"]["python"])
        if state["rng"]["cuda"] is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["rng"]["cuda"])
        self.step = state["step"]
        if state["data"] != self.position(self.step):
            raise ValueError(f"{source}: data position {state['data']} does not match step {self.step}")

    def full_draft(self, model_state: dict[str, torch.Tensor]) -> Eagle3Draft:
        """A CPU Eagle3Draft holding `model_state` (from `state()["model"]`), strictly loaded."""
        draft = Eagle3Draft(self.model.draft.cfg)
        draft.load_state_dict({k.removeprefix("draft."): v for k, v in model_state.items()}, strict=True)
        draft.embedding_loaded = True
        return draft


def _global(out: TTTOutput, ranks: _Dist) -> TTTOutput:
    """Counts and loss sums summed over ranks (detached)."""
    return TTTOutput(loss=out.loss.detach(), step_loss_sums=ranks.sum(out.step_loss_sums),
                     step_losses=out.step_losses, correct=ranks.sum(out.correct),
                     total=ranks.sum(out.total), cond_correct=ranks.sum(out.cond_correct),
                     cond_total=ranks.sum(out.cond_total))


def _zero_counts(out: TTTOutput) -> TTTOutput:
    z = torch.zeros_like
    return TTTOutput(out.loss, z(out.step_loss_sums), out.step_losses, z(out.correct),
                     z(out.total), z(out.cond_correct), z(out.cond_total))


def _full(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's full value (FSDP2's grad norm); plain tensors pass through."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


# ---------------------------------------------------------------------------------------------
# Files: checkpoints, metrics, the final drafter

def checkpoint_paths(out_dir: Path) -> list[Path]:
    """Complete checkpoints under out_dir/checkpoints, oldest first (temp files are skipped)."""
    return sorted((Path(out_dir) / CHECKPOINT_DIR).glob("step-*.pt"))


def write_checkpoint(state: dict[str, Any], out_dir: Path, keep: int) -> Path:
    """Write `state` atomically (temp file, then os.replace); keep the newest `keep` files."""
    folder = Path(out_dir) / CHECKPOINT_DIR
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"step-{state['step']:08d}.pt"
    tmp = folder / f".{path.name}.tmp-{os.getpid()}"
    torch.save(state, tmp)
    os.replace(tmp, path)
    for old in checkpoint_paths(out_dir)[:-keep]:
        old.unlink()
    return path


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


def save_final_draft(draft: Eagle3Draft, out_dir: Path, info: TargetInfo,
                     training: dict[str, Any], command: str | None) -> Path:
    """Save the trained drafter in the specdraft layout with its manifest (checkpoint.py)."""
    from specdraft.checkpoint import Manifest, save_draft, tensor_digest

    manifest = Manifest(draft=draft.cfg.to_dict(), aux_layers=list(info.aux_layers),
                        draft_vocab_hash=tensor_digest(draft.d2t), training=training,
                        training_command=command, **info.manifest_fields)
    return save_draft(draft, out_dir, layout="specdraft", manifest=manifest)


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


def train(config: TrainConfig, source: str | Path | TrainData, out_dir: str | Path, *,
          resume: bool = False, command: str | None = None, progress: bool = True,
          on_step: Callable[[int], None] | None = None, target_config: Any = None) -> TrainResult:
    """Train an EAGLE-3 drafter; under torchrun, on every rank (same arguments).

    source: a capture store directory (offline) or a TrainData such as OnlineData (online).
    out_dir: receives checkpoints/, metrics.jsonl, tensorboard/ and the final draft/.
    resume: continue from the newest checkpoint in out_dir (from scratch when there is none);
    without it an out_dir that already holds checkpoints is refused (FileExistsError).
    command: recorded in the manifest as the training command. on_step(step) runs after each
    optimizer step and any checkpoint it triggers. target_config: the target's config or
    directory, for a store whose recorded target path does not resolve here.
    Raises TrainingError (non-finite loss / unsupervised batch, naming its sample ids) and
    ValueError for inconsistent settings.
    """
    out_dir = Path(out_dir)
    ranks = _setup_dist(config.device)
    try:
        data = open_data(source, target_config)
        trainer = Trainer(config, data, ranks)
        resumed = _resume(trainer, out_dir, resume)
        log = MetricsLog(out_dir, ranks.main, resumed)
        try:
            return _run(trainer, out_dir, log, command, progress, on_step)
        finally:
            log.close()
    finally:
        if ranks.owns_group:
            dist.destroy_process_group()


def _resume(trainer: Trainer, out_dir: Path, resume: bool) -> int | None:
    """Load the newest checkpoint when resuming; returns its step (None: fresh run)."""
    paths = checkpoint_paths(out_dir)
    if paths and not resume:
        raise FileExistsError(f"{out_dir} already holds checkpoints ({paths[-1].name}): pass "
                              f"resume=True (--resume) to continue, or choose a new out_dir")
    if not paths:
        return None
    trainer.load_state(torch.load(paths[-1], map_location="cpu", weights_only=False), paths[-1])
    return trainer.step


def _run(trainer: Trainer, out_dir: Path, log: MetricsLog, command: str | None,
         progress: bool, on_step: Callable[[int], None] | None) -> TrainResult:
    c, ranks = trainer.config, trainer.ranks
    last: dict[str, Any] | None = None
    validation: dict[str, Any] | None = None
    with _progress(progress and ranks.main, trainer.total_steps, trainer.step) as advance:
        while trainer.step < trainer.total_steps:
            pos = trainer.position(trainer.step)
            batch = batch_order(trainer.train_ids, pos["epoch"], c)[pos["batch_index"]]
            last = trainer.train_step(batch)
            log.write(last)
            if trainer.val_ids and (trainer.step % c.eval_every == 0 or trainer.step == trainer.total_steps):
                validation = {"step": trainer.step, "split": "val", **trainer.evaluate().to_dict()}
                log.write(validation)
            if trainer.step % c.save_every == 0 or trainer.step == trainer.total_steps:
                _save(trainer, out_dir)
            advance(last["loss"])
            if on_step is not None:
                on_step(trainer.step)
    if validation is None and trainer.val_ids:  # resumed after the last step's evaluation
        validation = {"step": trainer.step, "split": "val", **trainer.evaluate().to_dict()}
    state = trainer.state()
    draft_dir = None
    if ranks.main:
        training = {"steps": trainer.step, "train": last, "validation": validation,
                    "config": c.to_dict()}
        draft_dir = save_final_draft(trainer.full_draft(state["model"]), out_dir / "draft",
                                     trainer.data.info, training, command)
    ranks.barrier()
    return TrainResult(trainer.step, last["loss"] if last else None, validation, draft_dir, log.path)


def _save(trainer: Trainer, out_dir: Path) -> None:
    state = trainer.state()  # collective
    if trainer.ranks.main:
        write_checkpoint(state, out_dir, trainer.config.keep_checkpoints)
    trainer.ranks.barrier()


@contextlib.contextmanager
def _progress(enabled: bool, total: int, start: int):
    """Rich progress bar; yields advance(loss)."""
    if not enabled:
        yield lambda loss: None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    columns = (TextColumn("train"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
               TextColumn("loss {task.fields[loss]}"))
    with Progress(*columns, transient=False) as bar:
        task = bar.add_task("train", total=total, completed=start, loss="-")
        yield lambda loss: bar.update(task, advance=1, loss=f"{loss:.4f}")
