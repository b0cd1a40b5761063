"""The draft vocabulary map (DESIGN.md §2): `d2t[i]` is an offset, target id = i + d2t[i];
`t2d` is a boolean mask over the target vocabulary. The draft vocabulary is the N most frequent
loss-masked target tokens of the training split, ids ascending, never past the tokenizer's
length (padding rows excluded). Engines read only `d2t` (SGLang ignores `t2d`; vLLM treats a
missing `d2t` as identity)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdraft.errors import SpecdraftError


class DraftVocabSizeError(SpecdraftError, ValueError):
    """A draft vocabulary size (--draft-vocab-size) the target's usable vocabulary cannot hold."""


@dataclass(frozen=True)
class VocabMap:
    """d2t: int64 [Vd], target id = i + d2t[i]; t2d: bool [V], True on the draft's target ids."""

    d2t: torch.Tensor
    t2d: torch.Tensor


def build_vocab_map(
    token_counts: torch.Tensor, draft_vocab_size: int, vocab_limit: int | None = None
) -> VocabMap:
    """Draft vocabulary = the ``draft_vocab_size`` most frequent target ids, ids ascending.

    token_counts: integer [V] counts of loss-masked target tokens. Ties go to the lower id;
    ids >= ``vocab_limit`` (tokenizer length; embedding padding rows) are never chosen. When
    fewer ids have a nonzero count, the lowest-id unused tokens fill the rest. Raises
    ValueError on bad counts, DraftVocabSizeError (a ValueError) when draft_vocab_size exceeds
    the usable vocabulary.
    """
    integer = not token_counts.dtype.is_floating_point and token_counts.dtype != torch.bool
    if token_counts.dim() != 1 or not integer:
        raise ValueError(
            f"token_counts must be an integer [V] tensor, got {token_counts.dtype} "
            f"{tuple(token_counts.shape)}"
        )
    if bool((token_counts < 0).any()):
        raise ValueError("token_counts has negative entries")
    vocab_size = token_counts.numel()
    usable = vocab_size if vocab_limit is None else vocab_limit
    if not 0 < usable <= vocab_size:
        raise ValueError(f"vocab_limit {vocab_limit} must be in 1..{vocab_size}")
    if not 0 < draft_vocab_size <= usable:
        raise DraftVocabSizeError(
            f"draft_vocab_size {draft_vocab_size} must be in 1..{usable} (usable target vocabulary)"
        )
    counts = token_counts[:usable].to(torch.int64)
    order = torch.sort(-counts, stable=True).indices  # stable: ties (and zeros) by lower id
    target_ids = order[:draft_vocab_size].sort().values
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[target_ids] = True
    return VocabMap(target_ids - torch.arange(draft_vocab_size), t2d)


def target_ids_of_draft_vocab(d2t: torch.Tensor) -> torch.Tensor:
    """int64 [Vd] target id of every draft id: arange(Vd) + d2t."""
    return torch.arange(d2t.numel(), dtype=torch.int64) + d2t.to(torch.int64)


def t2d_from_d2t(d2t: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """bool [vocab_size] t2d that `d2t` implies: True on each draft id's target id (arange + d2t).
    Ids outside [0, vocab_size) mark nothing, so `validate_vocab_map` still names a bad d2t."""
    target = target_ids_of_draft_vocab(d2t)
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[target[(target >= 0) & (target < vocab_size)]] = True
    return t2d


def draft_to_target_ids(draft_ids: torch.Tensor, d2t: torch.Tensor) -> torch.Tensor:
    """Map draft token ids (any shape, integer) to target ids: id + d2t[id]."""
    draft_ids = draft_ids.to(torch.int64)
    return draft_ids + d2t.to(torch.int64)[draft_ids]


def _is_id_list(values: torch.Tensor, vocab_size: int) -> bool:
    in_range = bool(((values >= 0) & (values < vocab_size)).all())
    return in_range and bool((values.diff() > 0).all())


_FIX = "rebuild it with build_vocab_map and export d2t as offsets (target id - draft id)"


def _d2t_cause(d2t, t2d_ids, target, vocab_size: int) -> str | None:
    """The specific fault behind a d2t that t2d or the range check rejects, when it is sound."""
    if t2d_ids is not None and torch.equal(t2d_ids, target):
        return None
    direct = t2d_ids is not None and torch.equal(t2d_ids, d2t)
    if direct or (not _is_id_list(target, vocab_size) and _is_id_list(d2t, vocab_size)):
        return f"d2t holds direct target ids, not offsets; store d2t = ids - arange({d2t.numel()})"
    if t2d_ids is not None and d2t.numel() < vocab_size and not bool(d2t.any()):
        return (
            f"d2t is all zeros (draft id i = target id i) but t2d marks other ids: d2t was "
            f"dropped or zero-initialised; {_FIX}"
        )
    return None


def _unusable_d2t(
    d2t: torch.Tensor | None, vocab_size: int, draft_vocab_size: int
) -> list[str] | None:
    """`validate_vocab_map`'s answer when there is no d2t to check further (a draft vocabulary past
    the target's, a missing d2t, one of the wrong dtype or shape); None when d2t can be checked."""
    if draft_vocab_size > vocab_size:
        return [f"draft_vocab_size {draft_vocab_size} exceeds the target vocabulary {vocab_size}"]
    if d2t is None:
        return (
            []
            if draft_vocab_size == vocab_size
            else [
                f"d2t missing: draft vocab {draft_vocab_size} < target vocab {vocab_size}, so "
                f"engines map draft id i to target id i; {_FIX}"
            ]
        )
    if d2t.dtype != torch.int64 or tuple(d2t.shape) != (draft_vocab_size,):
        return [f"d2t must be int64 [{draft_vocab_size}], got {d2t.dtype} {tuple(d2t.shape)}"]
    return None


def validate_vocab_map(
    d2t: torch.Tensor | None,
    t2d: torch.Tensor | None,
    vocab_size: int,
    draft_vocab_size: int,
    usable: int | None = None,
) -> list[str]:
    """Problems with a draft checkpoint's vocabulary map (FC-02); an empty list means valid.

    d2t: int64 [Vd] offsets; t2d: bool [V] or None. Engines read only d2t (vLLM treats a
    missing one as zeros = identity), so a missing, zeroed or direct-id d2t silently emits
    wrong target tokens. Causes are named only when sound: all zeros only when t2d disagrees;
    direct ids when d2t equals t2d's ids, or is a valid id list while arange + d2t is not.
    usable: the tokenizer's length when shorter than vocab_size (`checkpoint.usable_vocab`):
    target ids from it on are the embedding's padding rows, which no token has, and a map
    into them is a problem; a draft vocabulary that is the whole target vocabulary (no map) is not.
    """
    if (unusable := _unusable_d2t(d2t, vocab_size, draft_vocab_size)) is not None:
        return unusable
    problems = []
    if t2d is not None and (t2d.dtype != torch.bool or tuple(t2d.shape) != (vocab_size,)):
        problems.append(f"t2d must be bool [{vocab_size}], got {t2d.dtype} {tuple(t2d.shape)}")
        t2d = None
    target = target_ids_of_draft_vocab(d2t)
    t2d_ids = None if t2d is None else t2d.nonzero().flatten()
    if (cause := _d2t_cause(d2t, t2d_ids, target, vocab_size)) is not None:
        return problems + [cause]
    valid = _is_id_list(target, vocab_size)
    if not valid:
        problems.append(
            f"arange + d2t must be strictly increasing ids in [0, {vocab_size}); " + _FIX
        )
    if t2d is not None and int(t2d.sum()) != draft_vocab_size:
        problems.append(f"t2d marks {int(t2d.sum())} ids, expected {draft_vocab_size}; {_FIX}")
    if t2d is not None and valid and not bool(t2d[target].all()):
        problems.append(
            f"t2d disagrees with d2t: {int((~t2d[target]).sum())} draft tokens map "
            f"to target ids t2d does not mark; {_FIX}"
        )
    if valid and (padding := _padding_problem(target, vocab_size, usable)) is not None:
        problems.append(padding)
    return problems


def _padding_problem(target: torch.Tensor, vocab_size: int, usable: int | None) -> str | None:
    """The draft ids `target` (their target ids) sends past the tokenizer's `usable` tokens."""
    if usable is None or usable >= vocab_size or target.numel() == vocab_size:
        return None
    past = target >= usable
    if not bool(past.any()):
        return None
    return (
        f"d2t maps {int(past.sum())} draft ids to target ids {int(target[past][0])}..{int(target.max())}, "
        f"past the tokenizer's {usable} tokens (rows {usable}..{vocab_size - 1} of the target's "
        f"embedding are padding no token has); retrain it (specdraft train keeps the draft "
        f"vocabulary within the tokenizer) or rebuild d2t with build_vocab_map(..., vocab_limit={usable})"
    )
