"""`--method dflash` as a Trainer runs it: the drafter built for the data's target, its block loss
as one module's forward (`DFlashModel`) and a batch's inputs with their anchors (`DFlashObjective`).

The anchors of a sample are a function of (seed, step, sample id) only (`anchor_seed`), so a resumed
run, another number of ranks or another micro-batch split draws the same blocks; validation draws
one fixed set (step -1).
"""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Any

import torch
from torch import nn

from specdraft.checkpoint import Manifest
from specdraft.dflash import DFlashConfig, DFlashDraft
from specdraft.errors import UnusableInput
from specdraft.train.dflash_loss import (
    Blocks,
    block_counts,
    dflash_loss,
    sample_anchors,
    target_tokens,
    weighted_block_loss,
)
from specdraft.train.errors import BadTrainSetting
from specdraft.train.settings import TrainConfig
from specdraft.train.sources import Batch, TargetInfo

VALIDATION_STEP = -1  # the anchor draw of every validation pass


def default_mask_token(info: TargetInfo) -> int:
    """The first id past the tokenizer, where z-lab's recipe adds '<|MASK|>' (Qwen3: 151669), when
    the target's embedding has that row. Raises BadTrainSetting naming the --config key
    otherwise, with the id `specdraft demo` would train with (`suggested_mask_token`)."""
    vocab_size = info.embed_weight.shape[0]
    if info.vocab_limit is None or info.vocab_limit >= vocab_size:
        known = "unknown" if info.vocab_limit is None else str(info.vocab_limit)
        suggested = suggested_mask_token(info)
        example = "ID" if suggested is None else str(suggested)
        why = "" if suggested is None else " (the tokenizer's unknown token, as the demo uses)"
        raise BadTrainSetting(
            f"--method dflash needs a mask token: the tokenizer's length ({known}) leaves no spare "
            f"row of the target's {vocab_size}-row embedding; give its id as --config key "
            f'draft_overrides {{"mask_token_id": {example}}}{why}'
        )
    return info.vocab_limit


def suggested_mask_token(info: TargetInfo) -> int | None:
    """The mask token `specdraft demo --method dflash` would use on the target directory the
    data records (`targets.mask_token.dflash_mask_token`), or None when that directory is not
    on this machine or offers none."""
    from specdraft.targets.mask_token import dflash_mask_token

    path = (info.manifest_fields.get("target") or {}).get("name_or_path")
    if not path or not Path(path).is_dir():
        return None
    try:
        return dflash_mask_token(path)
    except (UnusableInput, OSError, ValueError):  # no tokenizer there, or none transformers reads
        return None


def build_dflash_draft(config: TrainConfig, info: TargetInfo) -> DFlashDraft:
    """A fresh, seeded DFlash drafter on `info`'s target states, with the target's embedding and
    lm_head. `config.draft_overrides` replace DFlashConfig fields (mask_token_id among them).
    Raises BadTrainSetting without a usable mask token, DraftError for a bad field, RuntimeError
    for training data that gives no lm_head (every TrainData of specdraft gives it)."""
    if info.lm_head_weight is None:
        raise RuntimeError("--method dflash needs the target's lm_head: TargetInfo.lm_head_weight")
    overrides = dict(config.draft_overrides)
    mask = overrides.pop("mask_token_id", None)
    cfg = DFlashConfig.from_target(
        info.config,
        info.aux_layers,
        default_mask_token(info) if mask is None else mask,
        block_size=config.block_size,
        **overrides,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        draft = DFlashDraft(cfg)
    draft.load_target_head(
        info.embed_weight.detach().float().cpu(), info.lm_head_weight.detach().float().cpu()
    )
    return draft


class DFlashModel(nn.Module):
    """The drafter with its block loss as one forward (sharded by FSDP2 as `trainer.TTTModel` is).
    Returns TTTOutput's fields as a dict; with target_ids ([B, T], `target_tokens`), its blocks'
    acceptance against the target's greedy tokens and, with replay (validation), an engine's
    rounds walked over each row (`dflash_loss`)."""

    def __init__(self, draft: DFlashDraft, loss_decay_gamma: float | None) -> None:
        super().__init__()
        self.draft = draft
        self.loss_decay_gamma = loss_decay_gamma

    def forward(
        self,
        input_ids: torch.Tensor,
        aux_hidden: torch.Tensor,
        loss_mask: torch.Tensor,
        anchors: torch.Tensor,
        keep: torch.Tensor,
        target_ids: torch.Tensor | None = None,
        replay: bool = False,
    ) -> dict[str, torch.Tensor]:
        blocks = Blocks(anchors, keep)
        out = dflash_loss(
            self.draft,
            input_ids,
            aux_hidden,
            loss_mask,
            blocks,
            self.loss_decay_gamma,
            target_ids,
            replay,
        )
        return {f.name: getattr(out, f.name) for f in fields(out)}


def anchor_seed(seed: int, step: int, sample_id: int) -> int:
    """The seed of one sample's anchor draw at optimizer step `step` (VALIDATION_STEP:
    validation's)."""
    return ((seed * 1_000_003 + step + 1) * 1_000_033 + sample_id) % 2**63


class DFlashObjective:
    """`--method dflash`: the model a Trainer trains, the manifest, a batch's inputs, its counts
    and loss over K = block_size - 1 block positions (`dflash_loss`)."""

    def __init__(self, config: TrainConfig, info: TargetInfo, command: str | None) -> None:
        self.config = config
        draft = build_dflash_draft(config, info)
        self.model = DFlashModel(draft, config.loss_decay_gamma)
        self.num_positions = config.block_size - 1
        self.manifest = Manifest(
            draft=draft.cfg.to_dict(),
            aux_layers=list(info.aux_layers),
            training_command=command,
            extra={"method": "dflash"},
            **info.manifest_fields,
        )

    def inputs(self, batch: Batch, step: int) -> dict[str, Any]:
        """The model's keyword inputs for `batch` at optimizer step `step`, anchors drawn, and the
        target's greedy tokens (`target_tokens`: what the blocks' acceptance is counted against)."""
        c = self.config
        seeds = [anchor_seed(c.seed, step, i) for i in batch.sample_ids]
        blocks = sample_anchors(batch.loss_mask, c.block_size, c.num_anchors, seeds)
        return {
            "input_ids": batch.input_ids,
            "aux_hidden": batch.aux_hidden,
            "loss_mask": batch.loss_mask,
            "anchors": blocks.anchors,
            "keep": blocks.keep,
            "target_ids": target_tokens(batch.input_ids, batch.target_logits),
        }

    def counts(self, inputs: dict[str, Any]) -> torch.Tensor:
        """[K] supervised positions of these inputs, without the drafter."""
        blocks = Blocks(inputs["anchors"], inputs["keep"])
        return block_counts(
            inputs["input_ids"], inputs["loss_mask"], blocks, self.config.block_size
        )

    def loss(self, sums: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """The weighted mean of per-position loss sums [K] over counts [K]
        (`weighted_block_loss`)."""
        return weighted_block_loss(sums, counts, self.config.loss_decay_gamma)
