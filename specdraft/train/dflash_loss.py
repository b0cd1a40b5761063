"""DFlash's block-wise training: anchors sampled per sequence, the block mask, the loss and its
counts. Pure functions over tensors, as SpecForge's `OnlineDFlashModel` (specforge/core/dflash.py)
trains it; TTT-free (one drafter forward per batch).

For a sequence x_0 .. x_{T-1} and an anchor a: the block holds x_a then block_size-1 mask tokens
at RoPE positions a .. a+block_size-1; it attends to the target's states at positions < a (the
context an engine has when x_a is the token it just chose) and to its own block, bidirectionally;
blocks never see each other. Block position k (1..block_size-1) predicts x_{a+k}, supervised iff
a+k < T and loss_mask[a+k]. The loss is SpecForge's: cross-entropy on the data token x_{a+k} over
the full vocabulary, a weighted mean over the supervised positions with weight
exp(-(k-1)/loss_decay_gamma) (None: uniform, SpecForge's default).

Beside the loss, two acceptance counts against the target's greedy tokens at T = 0, which training
records and `specdraft doctor` replays:
- each sampled block as the round an engine would run at its anchor (`block_acceptance`):
  per-position acceptance p_k = the share of blocks whose first k drafts all equal the target's
  tokens, tau = 1 + sum_k p_k;
- with replay (validation), the rounds an engine runs walked over each sequence (`engine_rounds`:
  each round's anchor the token after the last accepted one, its block the one training computes
  at that anchor, which is what the engine's block there computes on the text it produced:
  `engine.dflash_block`). These anchors are not uniform: a round starts right after a rejected
  draft, where the text is hard for the drafter, so the rounds' p_k are well below the sampled
  blocks' (benchmarks/RESULTS.md has both beside the engine's).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from specdraft.dflash import DFlashDraft
from specdraft.train.loss import replay_rounds
from specdraft.train.metrics import TTTOutput

# Blocks per drafter forward in `block_outcomes`: the mask is [64·block_size, T + 64·block_size].
BLOCKS_PER_FORWARD = 64


@dataclass
class Blocks:
    """The blocks of one batch (N per row, the rows' unused ones with keep False).

    anchors: [B, N] long positions; keep: [B, N] bool, the block is real."""

    anchors: torch.Tensor
    keep: torch.Tensor


def sample_anchors(
    loss_mask: torch.Tensor,
    block_size: int,
    num_anchors: int,
    seeds: Sequence[int],
) -> Blocks:
    """Up to num_anchors anchors per row, drawn without replacement among the positions a with
    loss_mask[a] whose block ends inside the row's supervised text (a + block_size - 1 <= its
    last loss-masked position), sorted. SpecForge (`_sample_anchor_positions`) bounds a by the
    padded length T - block_size instead, which makes a row's anchors depend on its batch.

    loss_mask: [B, T]; seeds: one int per row, the row's own draw (the same row draws the same
    anchors in any batch, on any rank or micro-batch split). N is the largest row's count (at
    least 1: a row without a valid position keeps no block).
    """
    mask = loss_mask.bool().cpu()
    index = torch.arange(mask.shape[1])
    last = torch.where(mask, index, -1).max(dim=1).values  # [B], -1: nothing supervised
    valid = mask & (index[None, :] <= (last + 1 - block_size)[:, None])
    rows = []
    for row, seed in zip(valid, seeds):
        positions = row.nonzero().flatten()
        g = torch.Generator().manual_seed(seed)
        chosen = positions[torch.randperm(len(positions), generator=g)[:num_anchors]]
        rows.append(chosen.sort().values)
    n = max(1, max(len(r) for r in rows))
    anchors = torch.zeros(len(rows), n, dtype=torch.long)
    keep = torch.zeros(len(rows), n, dtype=torch.bool)
    for i, r in enumerate(rows):
        anchors[i, : len(r)], keep[i, : len(r)] = r, True
    return Blocks(anchors.to(loss_mask.device), keep.to(loss_mask.device))


def block_mask(blocks: Blocks, seq_len: int, block_size: int) -> torch.Tensor:
    """Bool [B, 1, N·block_size, seq_len + N·block_size], True = attend (SpecForge
    `create_dflash_sdpa_mask`): block n's queries see context keys < its anchor and the keys of
    their own block; an unused block sees only its own block (never a row with no key)."""
    b, n = blocks.anchors.shape
    device = blocks.anchors.device
    q_block = torch.arange(n * block_size, device=device) // block_size  # [Q]
    anchor = blocks.anchors.repeat_interleave(block_size, dim=1)  # [B, Q]
    keep = blocks.keep.repeat_interleave(block_size, dim=1)
    ctx = torch.arange(seq_len, device=device)[None, None, :] < anchor[:, :, None]  # [B, Q, S]
    own = (q_block[:, None] == q_block[None, :]).expand(b, -1, -1)  # [B, Q, Q]
    return torch.cat([ctx & keep[:, :, None], own], dim=2)[:, None]


def block_inputs(
    input_ids: torch.Tensor, blocks: Blocks, block_size: int, mask_token_id: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(block_ids [B, N·block_size], position_ids [B, T + N·block_size]): each block the anchor
    token then mask tokens, at positions anchor + 0..block_size-1 after the context's 0..T-1."""
    b, t = input_ids.shape
    offsets = torch.arange(block_size, device=input_ids.device)
    block_ids = torch.full((b, blocks.anchors.shape[1], block_size), mask_token_id)
    block_ids = block_ids.to(input_ids.device)
    block_ids[:, :, 0] = input_ids.gather(1, blocks.anchors)
    positions = (blocks.anchors[:, :, None] + offsets).flatten(1)
    context = torch.arange(t, device=input_ids.device).expand(b, t)
    return block_ids.flatten(1), torch.cat([context, positions], dim=1)


def block_labels(
    input_ids: torch.Tensor, loss_mask: torch.Tensor, blocks: Blocks, block_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(labels [B, N, block_size-1] long, supervised [B, N, block_size-1] bool): x_{a+k} for
    k = 1..block_size-1, supervised iff the block is kept, a+k < T and loss_mask[a+k]."""
    t = input_ids.shape[1]
    index = blocks.anchors[:, :, None] + torch.arange(1, block_size, device=input_ids.device)
    inside = index < t
    safe = index.clamp(max=t - 1).flatten(1)
    labels = input_ids.gather(1, safe).view(index.shape)
    masked = loss_mask.bool().gather(1, safe).view(index.shape)
    return labels, masked & inside & blocks.keep[:, :, None]


def position_weights(block_size: int, gamma: float | None) -> list[float]:
    """Loss weight of block positions k = 1..block_size-1: exp(-(k-1)/gamma), 1 without gamma."""
    return [1.0 if gamma is None else math.exp(-(k - 1) / gamma) for k in range(1, block_size)]


def block_logits(
    draft: DFlashDraft, input_ids: torch.Tensor, aux_hidden: torch.Tensor, blocks: Blocks
) -> torch.Tensor:
    """[B, N, block_size-1, vocab] float32: the drafter's logits at block positions 1.. of each
    block (the anchor's position predicts nothing), under the training mask (`block_mask`: what
    an engine's block at that anchor attends to). input_ids: [B, T] long; aux_hidden:
    [B, T, n·H_target]."""
    bs = draft.cfg.block_size
    block_ids, positions = block_inputs(input_ids, blocks, bs, draft.cfg.mask_token_id)
    mask = block_mask(blocks, input_ids.shape[1], bs)
    hidden = draft(block_ids, aux_hidden, positions, mask)
    b, n = blocks.anchors.shape
    return draft.logits(hidden.view(b, n, bs, -1)[:, :, 1:]).float()


def target_tokens(input_ids: torch.Tensor, target_logits: torch.Tensor) -> torch.Tensor:
    """[B, T] long: the target's greedy token at each position given the tokens before it
    (argmax of its logits at the position before; position 0 keeps its own token)."""
    greedy = target_logits[:, :-1].argmax(-1)
    return torch.cat([input_ids[:, :1], greedy.to(input_ids.dtype)], dim=1)


@torch.no_grad()
def block_acceptance(
    drafts: torch.Tensor, greedy: torch.Tensor, supervised: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rounds [] int64, accepted [K] int64) of blocks seen as an engine's rounds at T = 0:
    rounds = the blocks whose first position is supervised, accepted[k] = those whose drafts
    1..k+1 all equal the target's greedy tokens (and are supervised).

    drafts, greedy: [..., K] long, the drafter's argmax and the target's token at each block
    position; supervised: [..., K] bool (`block_labels`)."""
    hit = (drafts == greedy) & supervised
    prefix = hit.long().cumprod(-1).bool()
    return supervised[..., 0].sum(), prefix.flatten(0, -2).sum(0)


@torch.no_grad()
def block_outcomes(
    draft: DFlashDraft,
    ids: torch.Tensor,
    aux: torch.Tensor,
    greedy: torch.Tensor,
    mask: torch.Tensor,
    anchors: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(drafts, target's tokens, supervised) [N, K] of the blocks at `anchors` [N] long of one
    sequence ids [1, T]: the drafter's argmax at block positions 1..K = block_size - 1, the
    target's greedy tokens there (greedy [1, T], `target_tokens`), whether the position is inside
    the sequence and supervised (mask [1, T] bool). aux: [1, T, n·H_target]. BLOCKS_PER_FORWARD
    blocks per drafter forward."""
    out = []
    for chunk in torch.split(anchors, BLOCKS_PER_FORWARD):
        chosen = Blocks(chunk[None], torch.ones(1, len(chunk), dtype=torch.bool, device=ids.device))
        drafts = block_logits(draft, ids, aux, chosen).argmax(-1)[0]
        labels, supervised = block_labels(greedy, mask, chosen, draft.cfg.block_size)
        out.append((drafts, labels[0], supervised[0]))
    return tuple(torch.cat(parts) for parts in zip(*out))


def walked_rounds(
    outcomes: tuple[torch.Tensor, torch.Tensor, torch.Tensor], mask: torch.Tensor, steps: int
) -> tuple[int, list[int]]:
    """(rounds, accepted [steps]) of a `steps`-draft block engine at T = 0 walked over one
    sequence (`loss.replay_rounds`), from `block_outcomes` at anchors 0..T-1 (the block at anchor
    a is the round after base position a - 1); mask: [T] bool, the tokens the engine generates."""
    drafts, wanted, supervised = outcomes
    t = mask.shape[0]
    hits = torch.zeros(steps, t, dtype=torch.bool)
    hits[:, : t - 1] = ((drafts == wanted) & supervised)[1:, :steps].T.cpu()
    return replay_rounds(hits, mask.bool().cpu())


@torch.no_grad()
def engine_rounds(
    draft: DFlashDraft,
    input_ids: torch.Tensor,
    aux_hidden: torch.Tensor,
    target_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    steps: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rounds [] int64, accepted [steps] int64) of a `steps`-draft block engine at T = 0 walked
    over each row's supervised runs (`walked_rounds`; a block at every position up to the row's
    last supervised token). Shapes as `dflash_loss`'s; target_ids: `target_tokens`."""
    rounds, accepted = 0, torch.zeros(steps, dtype=torch.long)
    for b in range(input_ids.shape[0]):
        supervised = loss_mask[b].bool().nonzero()
        t = int(supervised[-1]) + 1 if len(supervised) else 0
        if t < 3:  # a round drafts token base + 2 onwards: none fits
            continue
        row = slice(b, b + 1), slice(0, t)
        anchors = torch.arange(t, device=input_ids.device)
        outcomes = block_outcomes(
            draft, input_ids[row], aux_hidden[row], target_ids[row], loss_mask[row].bool(), anchors
        )
        n, per_pos = walked_rounds(outcomes, loss_mask[b, :t], steps)
        rounds, accepted = rounds + n, accepted + torch.tensor(per_pos)
    return torch.tensor(rounds), accepted


def dflash_loss(
    draft: DFlashDraft,
    input_ids: torch.Tensor,
    aux_hidden: torch.Tensor,
    loss_mask: torch.Tensor,
    blocks: Blocks,
    loss_decay_gamma: float | None = None,
    target_ids: torch.Tensor | None = None,
    replay: bool = False,
) -> TTTOutput:
    """The block loss and per-position counts of one batch, as a TTTOutput over K = block_size-1
    block positions (step k = block position k+1; cond_* count positions whose earlier block
    positions were all drafted right against the data's tokens). Against the target's greedy
    tokens `target_ids` (zeros without them): blocks / block_accepted, the sampled blocks each as
    an engine's round at its anchor (`block_acceptance`); with replay, rounds / round_accepted,
    a K-draft engine's rounds walked over each row (`engine_rounds`: K more block forwards a
    token, for validation).

    input_ids, loss_mask: [B, T]; aux_hidden: [B, T, n·H_target]; blocks: `sample_anchors`';
    target_ids: [B, T] long (`target_tokens`) or None.
    """
    bs = draft.cfg.block_size
    logits = block_logits(draft, input_ids, aux_hidden, blocks)
    b, n = blocks.anchors.shape
    labels, supervised = block_labels(input_ids, loss_mask, blocks, bs)
    ce = F.cross_entropy(logits.flatten(0, 2), labels.flatten(), reduction="none").view(b, n, -1)
    sums = torch.where(supervised, ce, 0.0).sum((0, 1))  # [K]
    with torch.no_grad():
        hit = (logits.argmax(-1) == labels) & supervised
        chain = torch.cat([torch.ones_like(hit[..., :1]), hit[..., :-1]], -1).cumprod(-1).bool()
        cond = chain & supervised
    total = supervised.sum((0, 1))
    (num_blocks, block_accepted), (rounds, accepted) = acceptance_counts(
        draft, logits, supervised, (input_ids, aux_hidden, loss_mask, target_ids), blocks, replay
    )
    return TTTOutput(
        loss=weighted_block_loss(sums, total, loss_decay_gamma),
        step_loss_sums=sums,
        step_losses=sums.detach() / total.clamp(min=1),
        correct=hit.sum((0, 1)),
        total=total,
        cond_correct=(hit & cond).sum((0, 1)),
        cond_total=cond.sum((0, 1)),
        rounds=rounds.to(total.device),
        round_accepted=accepted.to(total.device),
        blocks=num_blocks.to(total.device),
        block_accepted=block_accepted.to(total.device),
    )


@torch.no_grad()
def acceptance_counts(
    draft: DFlashDraft,
    logits: torch.Tensor,
    supervised: torch.Tensor,
    batch: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None],
    blocks: Blocks,
    replay: bool,
) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """`dflash_loss`'s ((blocks, block_accepted), (rounds, round_accepted)) of one batch
    (input_ids, aux_hidden, loss_mask, target_ids): the sampled blocks as an engine's rounds at
    their anchors (`block_acceptance`) and, with replay, an engine's rounds walked over each row
    (`engine_rounds`); zeros where target_ids is None (or no replay). logits: the blocks' [B, N,
    K, V]; supervised: [B, N, K] bool."""
    input_ids, aux_hidden, loss_mask, target_ids = batch
    zeros = (
        torch.zeros((), dtype=torch.long),
        torch.zeros(supervised.shape[-1], dtype=torch.long, device=supervised.device),
    )
    if target_ids is None:
        return zeros, zeros
    bs = draft.cfg.block_size
    greedy = block_labels(target_ids, loss_mask, blocks, bs)[0]
    walked = (
        engine_rounds(draft, input_ids, aux_hidden, target_ids, loss_mask, bs - 1)
        if replay
        else zeros
    )
    return block_acceptance(logits.argmax(-1), greedy, supervised), walked


@torch.no_grad()
def block_counts(
    input_ids: torch.Tensor, loss_mask: torch.Tensor, blocks: Blocks, block_size: int
) -> torch.Tensor:
    """[K] int64: supervised positions per block position, `dflash_loss(...).total` without the
    drafter (a trainer's whole-step counts before the first backward)."""
    return block_labels(input_ids, loss_mask, blocks, block_size)[1].sum((0, 1))


# Early-position weighting of DFlash training scripts built on SpecForge's trainer: gamma 7 / 5 / 4
# for blocks of 16 / 10 / 8 (SpecForge's own default is None, uniform).
REFERENCE_GAMMA = {16: 7.0, 10: 5.0, 8: 4.0}


def reference_gamma(block_size: int) -> float:
    """The loss_decay_gamma those scripts use for `block_size` (REFERENCE_GAMMA), else
    block_size / 2 (their value for 8 and 10)."""
    return REFERENCE_GAMMA.get(block_size, block_size / 2)


def weighted_block_loss(
    sums: torch.Tensor, counts: torch.Tensor, gamma: float | None
) -> torch.Tensor:
    """sum_k w_k · sums[k] / sum_k w_k · counts[k] (SpecForge's weighted mean; `position_weights`);
    scalar, differentiable. sums: [K] float; counts: [K] (a distributed trainer's global counts)."""
    weights = torch.tensor(
        position_weights(len(sums) + 1, gamma), dtype=sums.dtype, device=sums.device
    )
    return (weights * sums).sum() / (weights * counts.to(sums.dtype)).sum().clamp(min=1e-6)
