"""The Trainer: drafter, optimizer and schedule of one run on one rank; the training step.

A global batch of `batch_size` sequences is split across ranks (rank r takes every world-th
sequence), each rank's share into `grad_accum_steps` micro-batches, and every micro-batch's loss
is normalised by the whole step's global count of supervised positions, so N processes and M
micro-batches compute the same loss and gradients as one batch on one process. Under several
ranks the draft is sharded with FSDP2. What a checkpoint holds of a Trainer and how a resume
restores it: `state.TrainerState`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import fields
from typing import Any

import torch
from torch import nn

from specdraft.checkpoint import Manifest, tensor_digest
from specdraft.data.labels import draft_loss_mask
from specdraft.data.vocab import build_vocab_map
from specdraft.draft import Eagle3Draft
from specdraft.train.config import (
    TrainConfig,
    draft_config,
    lr_lambda,
    permutation_seed,
    resolved_config,
    split_samples,
)
from specdraft.train.dflash_train import VALIDATION_STEP, DFlashObjective
from specdraft.train.dist import Ranks, resolve_device
from specdraft.train.errors import BadTrainSetting, TrainingError
from specdraft.train.loss import supervised_counts, ttt_loss, weighted_loss
from specdraft.train.metrics import TTTMetrics, TTTOutput
from specdraft.train.sources import Batch, TargetInfo, TrainData
from specdraft.train.state import TrainerState


def build_draft(config: TrainConfig, info: TargetInfo, token_counts: torch.Tensor) -> Eagle3Draft:
    """A fresh drafter for `info`'s target (`config.draft_config`): seeded init, vocab map from
    loss-masked counts (of the training split), the target's embedding (unless the drafter owns
    one)."""
    cfg = draft_config(config, info)
    vocab = build_vocab_map(token_counts, cfg.draft_vocab_size, info.vocab_limit)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        draft = Eagle3Draft(cfg)
    draft.d2t.copy_(vocab.d2t)
    draft.t2d.copy_(vocab.t2d)
    if not cfg.owns_embedding:
        draft.load_target_embedding(info.embed_weight.detach().float().cpu())
    return draft


def draft_manifest(draft: Eagle3Draft, info: TargetInfo, command: str | None) -> Manifest:
    """The manifest of a drafter trained on `info`'s target (training metrics still None)."""
    return Manifest(
        draft=draft.cfg.to_dict(),
        aux_layers=list(info.aux_layers),
        draft_vocab_hash=tensor_digest(draft.d2t),
        training_command=command,
        **info.manifest_fields,
    )


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


class Eagle3Objective:
    """`--method eagle3`: the model a Trainer trains (`TTTModel`), the manifest, a batch's inputs,
    its counts and loss over K = ttt_steps unroll steps (`loss.ttt_loss`)."""

    def __init__(
        self, config: TrainConfig, info: TargetInfo, token_counts: torch.Tensor, command: str | None
    ) -> None:
        self.config = config
        draft = build_draft(config, info, token_counts)
        self.model = TTTModel(draft)
        self.num_positions = config.ttt_steps
        self.manifest = draft_manifest(draft, info, command)

    def inputs(self, batch: Batch, step: int) -> dict[str, Any]:
        """The model's keyword inputs for `batch` (the same at every step)."""
        c = self.config
        return {
            "input_ids": batch.input_ids,
            "aux_hidden": batch.aux_hidden,
            "target_logits": batch.target_logits,
            "loss_mask": batch.loss_mask,
            "ttt_steps": c.ttt_steps,
            "step_weight": c.step_weight,
        }

    def counts(self, inputs: dict[str, Any]) -> torch.Tensor:
        """[K] supervised positions of these inputs, without running the drafter."""
        return supervised_counts(
            self.model.draft, inputs["target_logits"], inputs["loss_mask"], self.config.ttt_steps
        )

    def loss(self, sums: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """sum_k step_weight**k · sums[k] / counts[k] (`loss.weighted_loss`)."""
        return weighted_loss(sums, counts, self.config.step_weight)


def objective_for(
    config: TrainConfig, data: TrainData, train_ids: Sequence[int], command: str | None
) -> Eagle3Objective | DFlashObjective:
    """The objective of `config.method`, its drafter built for `data`'s target (the EAGLE-3 vocab
    map from the training split's token counts: validation held out)."""
    if config.method == "dflash":
        return DFlashObjective(config, data.info, command)
    return Eagle3Objective(config, data.info, data.token_counts(train_ids), command)


def micro_batch_size(config: TrainConfig, ranks: Ranks) -> int:
    """Sequences per forward on one rank: batch_size / (world x grad_accum_steps). Raises
    BadTrainSetting when the batch does not split so (naming a --grad-accum-steps that does)."""
    parts = ranks.world * config.grad_accum_steps
    if config.batch_size % parts:
        fits = [
            g
            for g in range(config.grad_accum_steps - 1, 0, -1)
            if config.batch_size % (ranks.world * g) == 0
        ]
        raise BadTrainSetting(
            f"--batch-size {config.batch_size} does not split into {ranks.world} rank(s) x "
            f"--grad-accum-steps {config.grad_accum_steps} micro-batches: use a multiple of {parts}"
            + (f" or --grad-accum-steps {fits[0]}" if fits else "")
        )
    return config.batch_size // parts


class Trainer(TrainerState):
    """Drafter, optimizer and schedule of one run on one rank, with verb methods.

    ranks: this process's place in a torchrun job (default: one process on config.device).
    command: the training command, recorded in the manifest (`self.manifest`, which checkpoints
    carry so that `specdraft export` can write the drafter of any of them).
    Raises BadTrainSetting (a ValueError) for a batch size that ranks and micro-batches cannot
    share, bf16 off CUDA, or too little data.
    """

    def __init__(
        self,
        config: TrainConfig,
        data: TrainData,
        ranks: Ranks | None = None,
        command: str | None = None,
    ) -> None:
        ranks = ranks or Ranks(0, 1, resolve_device(config.device), False)
        config = resolved_config(config, data.info)  # what checkpoints store and resume compares
        self.config, self.data, self.ranks = config, data, ranks
        self.micro_batch_size = micro_batch_size(config, ranks)
        if config.precision == "bf16" and ranks.device.type != "cuda":
            raise BadTrainSetting(
                "--precision bf16 autocasts on CUDA only; use --precision fp32 on the CPU"
            )
        self.train_ids, self.val_ids = split_samples(len(data), config)
        self.batches_per_epoch = len(self.train_ids) // config.batch_size
        if self.batches_per_epoch == 0:
            raise BadTrainSetting(
                f"{len(self.train_ids)} training samples are fewer than one batch of "
                f"--batch-size {config.batch_size}: lower --batch-size or add data"
            )
        self.total_steps = config.num_steps(self.batches_per_epoch)
        self.objective = objective_for(config, data, self.train_ids, command)
        self.manifest = self.objective.manifest
        self.model = self.objective.model.to(ranks.device)
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
        self.settings_note: str | None = None  # one line when a resume resolved old defaults

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

    def forward(self, inputs: dict[str, Any], replay: bool = False) -> TTTOutput:
        """Loss and counts of one batch's `objective.inputs` on this rank (counts local to the
        rank); with `replay`, also a chain engine's rounds walked over each row (validation)."""
        bf16 = self.config.precision == "bf16"
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            out = self.model(**inputs, replay=replay)
        return TTTOutput(**out)

    def train_step(self, sample_ids: list[int]) -> dict[str, Any]:
        """One optimizer step on a global batch; returns its metrics record (global counts).

        The step's micro-batches are loaded first and their supervised positions per TTT step
        counted over all ranks (`_load_step`); every micro-batch's loss is then normalised by these
        whole-step counts (`accumulate`), so the summed gradient is the gradient of one batch. The
        inputs (target logits, aux states) of all micro-batches are held for the step; the
        drafter's activations for one micro-batch at a time.
        Raises TrainingError naming the batch's sample ids when the loss is NaN/Inf or the
        batch has no supervised position (FC-07).
        """
        c = self.config
        batches, totals = self._load_step(sample_ids)
        self.optimizer.zero_grad(set_to_none=True)
        local = TTTMetrics.zeros(self.objective.num_positions)
        for i, batch in enumerate(batches):
            local.add(self.accumulate(batch, totals, sync=i == len(batches) - 1))
        metrics = _global(local, self.ranks)
        loss_value = float(self.objective.loss(metrics.loss_sums, metrics.total))
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

    def _load_step(self, sample_ids: list[int]) -> tuple[list[dict[str, Any]], torch.Tensor]:
        """This rank's micro-batches of the global batch `sample_ids` as the objective's inputs,
        and the step's supervised positions per TTT step (block position) [K] summed over every
        micro-batch and rank. Raises TrainingError when the step has none."""
        c, ranks = self.config, self.ranks
        batches = [
            self.objective.inputs(self.data.batch(ids, c.max_length, ranks.device), self.step)
            for ids in self.micro_batches(sample_ids)
        ]
        totals = ranks.sum(sum(self.objective.counts(b) for b in batches))
        if int(totals[0]) == 0:
            raise TrainingError(self._unsupervised_message(batches, sample_ids))
        return batches, totals

    def _unsupervised_message(self, batches: list[dict[str, Any]], sample_ids: list[int]) -> str:
        """Why the step's batch has no supervised position: no label in an assistant turn (the
        loss mask, or the chat template that made it), or (EAGLE-3) labels whose target argmax is
        outside the draft vocabulary every time (it is too small). batches: the objective's inputs.
        A collective (every rank gets here)."""
        masks = (b["loss_mask"] for b in batches)
        labelled = int(self.ranks.sum(sum(draft_loss_mask(m, 0).sum() for m in masks)))
        head = f"step {self.step}: batch of samples {sample_ids} has no supervised position"
        if labelled == 0 or self.config.method == "dflash":
            return (
                f"{head} (no label in an assistant turn); check the loss mask / chat template "
                f"or drop these samples"
            )
        draft_vocab = self.model.draft.cfg.draft_vocab_size
        return (
            f"{head}: at each of its {labelled} labelled positions the target's argmax is outside "
            f"the draft vocabulary (--draft-vocab-size {draft_vocab}, the most frequent labels); "
            f"pass a larger --draft-vocab-size (default: the tokenizer's length)"
        )

    def accumulate(self, batch: dict[str, Any], totals: torch.Tensor, sync: bool) -> TTTOutput:
        """Forward and backward of one micro-batch; adds its share to the parameters' gradients.

        batch: the micro-batch's `objective.inputs`. totals: [K] supervised positions per TTT
        step (DFlash: block position) of the whole optimizer step (all micro-batches, all ranks).
        The loss is `objective.loss` of this micro-batch's loss sums over totals (EAGLE-3:
        sum_k w_k · KL sum at step k / totals[k]), times the world size since FSDP averages
        gradients over ranks.
        sync=False (every micro-batch but the step's last) keeps FSDP2 from reduce-scattering:
        gradients accumulate unsharded on each rank and are reduced once, after the last.
        Returns the micro-batch's output (counts local to this rank).
        """
        if self.ranks.world > 1:
            self.model.set_requires_gradient_sync(sync)
        out = self.forward(batch)
        loss = self.objective.loss(out.step_loss_sums, totals)
        (loss * self.ranks.world).backward()
        return out

    @torch.no_grad()
    def evaluate(self) -> TTTMetrics:
        """Per-step counts over the validation split, summed over ranks, in chunks of one
        micro-batch per rank (a rank without a sample in the last chunk runs a duplicate whose
        counts are dropped, so FSDP's collectives stay matched)."""
        c, ranks = self.config, self.ranks
        metrics = TTTMetrics.zeros(self.objective.num_positions)
        size = self.micro_batch_size * ranks.world
        for i in range(0, len(self.val_ids), size):
            chunk = self.val_ids[i : i + size]
            mine = chunk[ranks.rank :: ranks.world]
            batch = self.data.batch(mine or chunk[:1], c.max_length, ranks.device)
            out = self.forward(self.objective.inputs(batch, VALIDATION_STEP), replay=True)
            if mine:
                metrics.add(out)
        return _global(metrics, ranks)


def _global(local: TTTMetrics, ranks: Ranks) -> TTTMetrics:
    """`local`'s counts and loss sums summed over ranks (on the CPU)."""
    return TTTMetrics(*(ranks.sum(getattr(local, f.name)).cpu() for f in fields(local)))


def _full(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's full value (FSDP2's grad norm); plain tensors pass through."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t
