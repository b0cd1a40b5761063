"""What a drafter's tensors are worth: NaN / Inf values, the vocabulary map (FC-02), and the
digests that prove two tensors or files bit-identical."""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch

from specdraft.checkpoint.layouts import CheckpointError, state_dict_for_layout
from specdraft.checkpoint.manifest import Manifest
from specdraft.data.vocab import validate_vocab_map
from specdraft.draft import Eagle3Draft


def file_sha256(path: Path) -> str:
    """sha256 (hex) of a file's bytes, read in chunks (a store shard, a drafter, a downloaded model)."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


# The files of a tokenizer saved in a model directory (any one of them: transformers loads it).
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
)


def tokenizer_length(target_dir: str | Path | None) -> int | None:
    """How many tokens the tokenizer saved in `target_dir` has (`len(tokenizer)`, added tokens
    included); None without a directory, tokenizer files in it (TOKENIZER_FILES), or one
    `targets.tokenizer.load_target_tokenizer` loads."""
    if target_dir is None or not any((Path(target_dir) / n).is_file() for n in TOKENIZER_FILES):
        return None
    from specdraft.targets.tokenizer import TargetTokenizerError, load_target_tokenizer

    try:
        return len(load_target_tokenizer(target_dir))
    except TargetTokenizerError:
        return None


def usable_vocab(manifest: Manifest | None, known_length: int | None = None) -> int | None:
    """How many target ids are tokens: the tokenizer length the manifest records (a target's
    vocab_size may pad its embedding past it, as Qwen-family configs do); without a manifest,
    `known_length` (the target's tokenizer, `tokenizer_length`); else None (a manifest that
    records no tokenizer is read as it was trained: unbounded)."""
    if manifest is None:
        return known_length
    length = (manifest.tokenizer or {}).get("length")
    return (
        length if isinstance(length, int) and not isinstance(length, bool) and length > 0 else None
    )


def vocab_map_problems(
    model: Eagle3Draft, manifest: Manifest | None, known_length: int | None = None
) -> list[str]:
    """The one vocabulary-map rule (FC-02, `data.vocab.validate_vocab_map`), bound by the
    tokenizer's length whenever it is known (`usable_vocab`: the manifest's record, else
    `known_length` without a manifest): what inspect's audit, doctor, the engine and export refuse."""
    cfg = model.cfg
    return validate_vocab_map(
        model.d2t.cpu(),
        model.t2d.cpu(),
        cfg.vocab_size,
        cfg.draft_vocab_size,
        usable_vocab(manifest, known_length),
    )


def check_vocab_map(
    model: Eagle3Draft,
    manifest: Manifest | None,
    path: str | Path,
    known_length: int | None = None,
) -> None:
    """Raise CheckpointError naming `path` when `vocab_map_problems` finds any."""
    problems = vocab_map_problems(model, manifest, known_length)
    if problems:
        raise CheckpointError(f"{path}: its vocabulary map (d2t) is wrong: {'; '.join(problems)}")


def audit(
    model: Eagle3Draft, manifest: Manifest | None = None, known_length: int | None = None
) -> list[str]:
    """Problems in the tensors a drafter saves (a shared embedding is the target's): NaN/Inf values
    and an invalid d2t/t2d map (FC-02, `vocab_map_problems`: ids past the tokenizer's length, the
    manifest's record, without a manifest `known_length`, included)."""
    problems = [
        f"{name} holds NaN or Inf"
        for name, t in state_dict_for_layout(model, "sglang").items()
        if not all_finite(t)
    ]
    return problems + vocab_map_problems(model, manifest, known_length)


def all_finite(t: torch.Tensor, chunk: int = 1 << 22) -> bool:
    """No NaN or Inf in `t` (True for non-float tensors), checked `chunk` elements at a time:
    isfinite of a whole bf16 weight allocates float32 temporaries of its size (a drafter's lm_head:
    hundreds of MB), chunks keep the check to a few MB whatever the tensor."""
    if not t.is_floating_point():
        return True
    flat = t.detach().reshape(-1)
    return all(bool(torch.isfinite(part).all()) for part in flat.split(chunk))


def tensor_digest(t: torch.Tensor) -> str:
    """sha256 of a tensor's raw bytes (dtype and shape included), for bit-exact comparisons."""
    h = hashlib.sha256(f"{t.dtype}{tuple(t.shape)}".encode())
    h.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy())  # hashed in place
    return h.hexdigest()
