"""A capture store: what training needs from the target, as sharded safetensors files.

Layout of a store directory:

    shard-00000.safetensors   per shard, samples concatenated along the token axis:
                              input_ids [N] int32, loss_mask [N] uint8, offsets [S+1] int64
                              (sample j = rows offsets[j]:offsets[j+1]),
                              aux_hidden [N, n_aux*H] and last_hidden [N, H] (bf16 by default)
    target_head.safetensors   the target's final norm, lm_head and input embedding weights
                              ("norm.weight", "lm_head.weight", "embed_tokens.weight")
    index.json                settings, target / tokenizer / template / data identity, shard list
                              with sha256 checksums, sample and token counts

Why `last_hidden` and not logits: the trainer recomputes the target's logits as
lm_head(final_norm(last_hidden)) with `target_head.safetensors`. That costs H values per token
(2·H bytes in bf16; 8 KiB for H = 4096) where full logits cost V values (256 KiB in bf16 for
V = 128,256, 31x more), and top-k logits would store 2 values (id, logit) per k while losing the
rest of the distribution. One extra matmul per step is cheaper than the disk and I/O.
"""

from __future__ import annotations

import bisect
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from specdraft.checkpoint import file_sha256, open_safetensors, read_safetensors
from specdraft.errors import DamagedFile, SpecdraftError

FORMAT = "specdraft-capture"
FORMAT_VERSION = 1
INDEX = "index.json"
HEAD = "target_head.safetensors"
FIX_CORRUPT = "delete it and re-run capture to redo it"
# index.json's record of where the last hidden state is: "before_norm" (absent = before the
# target's final norm, as capture writes it) or "after_norm" (converted from SpecForge's files)
LAST_HIDDEN_KEY = "last_hidden"
AFTER_NORM = "after_norm"


class CaptureError(SpecdraftError, ValueError):
    """A store that cannot be written, resumed or read; the message names the file and the fix."""


class DamagedStore(CaptureError, DamagedFile):
    """A store's file cut short or damaged (a truncated copy): unusable input, as any damaged file."""


def dtype_name(dtype: torch.dtype) -> str:
    """'bfloat16' for torch.bfloat16: how index.json names a dtype."""
    return str(dtype).removeprefix("torch.")


@dataclass(frozen=True)
class StoreSettings:
    """What a store's contents depend on; a resume must match all of it.

    aux_layers: specdraft indices. dtype: storage dtype of aux_hidden / last_hidden.
    max_length: samples are truncated to this many tokens. shard_tokens: at most this many
    tokens per shard (a longer single sample gets a shard of its own); the states of one shard
    are held in memory, shard_tokens · bytes_per_token bytes (65,536 tokens = 2 GiB for H = 4096,
    3 aux layers, bf16). shard_samples: optional cap on samples per shard as well.
    batch_tokens: padded tokens per target forward (batching by length; not identity).
    """

    aux_layers: tuple[int, ...]
    dtype: torch.dtype = torch.bfloat16
    max_length: int = 2048
    shard_tokens: int = 65536
    batch_tokens: int = 16384
    shard_samples: int | None = None

    def __post_init__(self) -> None:
        for name in ("max_length", "shard_tokens", "batch_tokens"):
            if getattr(self, name) <= 0:
                raise CaptureError(
                    f"StoreSettings.{name} = {getattr(self, name)}: must be positive"
                )
        if self.shard_samples is not None and self.shard_samples <= 0:
            raise CaptureError(
                f"StoreSettings.shard_samples = {self.shard_samples}: must be positive (or None)"
            )
        if not self.aux_layers:
            raise CaptureError("StoreSettings.aux_layers is empty: name the aux layers to capture")

    def identity(self) -> dict[str, Any]:
        return {
            "aux_layers": list(self.aux_layers),
            "dtype": dtype_name(self.dtype),
            "max_length": self.max_length,
            "shard_tokens": self.shard_tokens,
            "shard_samples": self.shard_samples,
        }


def bytes_per_token(hidden_size: int, n_aux: int, dtype: torch.dtype) -> int:
    """Stored bytes per token: input_ids 4 + loss_mask 1 + (n_aux + 1)·H·itemsize."""
    return 4 + 1 + (n_aux + 1) * hidden_size * dtype.itemsize


def estimate_disk(
    num_tokens: int, hidden_size: int, n_aux: int, dtype: torch.dtype, head_bytes: int = 0
) -> int:
    """Bytes a store of `num_tokens` tokens will take (shards + target head; headers ignored)."""
    return num_tokens * bytes_per_token(hidden_size, n_aux, dtype) + head_bytes


def tensor_layout(n_aux: int, hidden_size: int, dtype: torch.dtype) -> dict[str, list]:
    """index.json's "tensors": each shard tensor's dtype name and shape (N tokens, S samples)."""
    return {
        "input_ids": ["int32", ["N"]],
        "loss_mask": ["uint8", ["N"]],
        "offsets": ["int64", ["S+1"]],
        "aux_hidden": [dtype_name(dtype), ["N", n_aux * hidden_size]],
        "last_hidden": [dtype_name(dtype), ["N", hidden_size]],
    }


def read_index(path: Path) -> dict[str, Any]:
    """A store's index.json; CaptureError naming the file when it cannot be read or is not valid
    JSON."""
    try:
        text = path.read_bytes()
    except OSError as e:
        raise CaptureError(
            f"{path}: cannot be read ({e.strerror}); give a readable capture store"
        ) from None
    try:
        return json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CaptureError(
            f"{path}: not valid JSON ({e}); the store's index is damaged: capture into a new "
            f"directory (or delete {path.parent} and re-run capture)"
        ) from None


class CaptureStore:
    """Read a finished capture store.

    store[i] -> dict(input_ids [T] long, loss_mask [T] bool, aux_hidden [T, n_aux*H],
    last_hidden [T, H]) in the stored dtype. `.meta` is index.json. Raises CaptureError for a
    directory without index.json or an unfinished store.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        index_path = self.path / INDEX
        if not index_path.is_file():
            raise CaptureError(
                f"{index_path}: not found; {self.path} is not a capture store "
                f"(write one with `specdraft capture`)"
            )
        self.meta: dict[str, Any] = read_index(index_path)
        if self.meta.get("format") != FORMAT:
            raise CaptureError(f"{index_path}: not a {FORMAT} index")
        if not self.meta["complete"]:
            raise CaptureError(
                f"{self.path}: unfinished store ({len(self.meta['shards'])} of "
                f"{self.meta['num_shards']} shards); re-run capture with the same "
                f"arguments to finish it"
            )
        self._shards = self.meta["shards"]
        self._starts = [e["first_sample"] for e in self._shards]
        self._files: dict[int, Any] = {}
        self._offsets: dict[int, list[int]] = {}

    def __len__(self) -> int:
        return self.meta["num_samples"]

    @property
    def fix_damaged(self) -> str:
        """The fix for a damaged shard: capture checks each shard's sha256 when it resumes."""
        return (
            f"re-run `specdraft capture` with the same arguments into {self.path}: it checks every "
            f"shard against {INDEX} and redoes a damaged one"
        )

    def shard_tensors(self, s: int, *names: str) -> dict[str, torch.Tensor]:
        """Whole tensors `names` of shard `s` (e.g. "input_ids", "loss_mask"), without the others."""
        f, _ = self._open(s)
        return {name: f.get_tensor(name) for name in names}

    @property
    def aux_layers(self) -> list[int]:
        return list(self.meta["aux_layers"])

    def _open(self, s: int):
        if s not in self._files:
            path = self.path / self._shards[s]["file"]
            if not path.is_file():
                raise CaptureError(f"{path}: missing shard; re-run capture to redo it")
            self._files[s] = open_safetensors(path, self.fix_damaged, DamagedStore)
            self._offsets[s] = self._files[s].get_tensor("offsets").tolist()
        return self._files[s], self._offsets[s]

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        if not 0 <= i < len(self):
            raise IndexError(f"sample {i} out of range 0..{len(self) - 1}")
        s = bisect.bisect_right(self._starts, i) - 1
        f, offsets = self._open(s)
        j = i - self._starts[s]
        a, b = offsets[j], offsets[j + 1]
        return {
            "input_ids": f.get_slice("input_ids")[a:b].long(),
            "loss_mask": f.get_slice("loss_mask")[a:b].bool(),
            "aux_hidden": f.get_slice("aux_hidden")[a:b],
            "last_hidden": f.get_slice("last_hidden")[a:b],
        }

    def lengths(self) -> list[int]:
        """Token count of every sample, in order (for batching by length)."""
        out = []
        for s in range(len(self._shards)):
            offsets = self._open(s)[1]
            out += [b - a for a, b in zip(offsets, offsets[1:])]
        return out

    def target_head(self) -> dict[str, torch.Tensor]:
        """{"norm.weight" [H], "lm_head.weight" [V, H], "embed_tokens.weight" [V, H]}."""
        return read_safetensors(
            self.path / self.meta["target_head"]["file"], self.fix_damaged, DamagedStore
        )

    def verify(self) -> None:
        """Check every shard's and the target head's sha256 against index.json.

        Raises CaptureError naming the first bad file and the fix (delete it and re-run capture).
        """
        for entry in [self.meta["target_head"], *self._shards]:
            path = self.path / entry["file"]
            if not path.is_file():
                raise CaptureError(f"{path}: missing; re-run capture to redo it")
            if file_sha256(path) != entry["sha256"]:
                raise CaptureError(f"{path}: checksum mismatch (corrupt shard); {FIX_CORRUPT}")
