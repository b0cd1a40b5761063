"""Label alignment and label counts.

Label alignment (FC-07, DESIGN.md §2): at draft position t, step k, the drafter predicts token
x_{t+2+k}, and the target distribution it matches is the target's logits at position t+1+k. So the
first assistant token x_a is the label of draft position a-2 at step 0, predicted from the target's
logits at the last prompt position a-1. `draft_loss_mask` applies that shift.

`token_counts` counts the labels per target token: the input of the draft vocabulary map.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from specdraft.data.records import DataError
from specdraft.data.render import Sample


def label_position(t: int, step: int) -> int:
    """The token position whose id is the label of draft position t at step k: t + 2 + k."""
    return t + 2 + step


def target_logit_position(t: int, step: int) -> int:
    """The target position whose logits are the distribution that draft position t at step k
    matches: t + 1 + k (the target's next-token prediction for token t + 2 + k)."""
    return t + 1 + step


def draft_loss_mask(loss_mask: torch.Tensor, step: int) -> torch.Tensor:
    """Which draft positions are supervised at draft step `step` (0 = first step).

    loss_mask: [B, T] bool (or 0/1), 1 = token is a label (assistant / continuation).
    Returns [B, T] bool: out[b, t] = loss_mask[b, t + 2 + step], False where t + 2 + step >= T.
    """
    if step < 0:
        raise ValueError(f"draft_loss_mask: step {step} must be >= 0")
    mask = loss_mask.bool()
    shift = 2 + step
    out = torch.zeros_like(mask)
    if shift < mask.shape[1]:
        out[:, : mask.shape[1] - shift] = mask[:, shift:]
    return out


def check_has_supervision(loss_mask: torch.Tensor) -> None:
    """Raise DataError (a ValueError) if no draft position of the batch has a label at step 0.

    loss_mask: [B, T] bool. A batch whose labels are all outside assistant turns (or whose
    sequences are shorter than 3 tokens) would train on nothing and report a 0/0 accuracy."""
    if not bool(draft_loss_mask(loss_mask, 0).any()):
        raise DataError(
            f"batch of {loss_mask.shape[0]} sequences has no supervised token: no position t+2 "
            f"(label of draft position t) is in an assistant turn; check the loss mask / chat "
            f"template, or drop samples without assistant tokens (or shorter than 3 tokens)"
        )


def token_counts(samples: Iterable[Sample], vocab_size: int) -> torch.Tensor:
    """How often each target token id is a label: LongTensor [vocab_size] counting loss-masked
    tokens only (the input to `data.vocab.build_vocab_map`). Raises DataError (a ValueError) for
    an id outside 0..vocab_size-1 (tokenizer and target disagree)."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for s in samples:
        ids = torch.tensor(s.input_ids, dtype=torch.long)[
            torch.tensor(s.loss_mask, dtype=torch.bool)
        ]
        if ids.numel() and (int(ids.max()) >= vocab_size or int(ids.min()) < 0):
            raise DataError(
                f"token id {int(ids.max())} outside the target vocabulary of "
                f"{vocab_size}: the tokenizer does not belong to this target"
            )
        counts += torch.bincount(ids, minlength=vocab_size)
    return counts
