"""The drafter's static KV cache: preallocated, appended and rolled back by length.

Layout along the sequence: entries 0..length-1 are the drafter's first-step keys/values at
committed positions (one per token the target has accepted); entries from `length` on are
scratch for the current round's tree steps (steps >= 1, the drafter's own hidden states).
Scratch is never committed: the next round's first step overwrites it, so rejecting a branch
is only a matter of the length pointer.
"""

from __future__ import annotations

import torch
from torch import Tensor

from specdraft.draft import KV


class DraftCache:
    """K/V buffers [1, num_kv_heads, max_len, head_dim] (post-RoPE, like `Eagle3Draft` returns)."""

    def __init__(
        self,
        num_kv_heads: int,
        head_dim: int,
        max_len: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        shape = (1, num_kv_heads, max_len, head_dim)
        self.k: Tensor = torch.zeros(shape, dtype=dtype, device=device)
        self.v: Tensor = torch.zeros(shape, dtype=dtype, device=device)
        self.max_len = max_len
        self.length = 0

    def view(self, end: int) -> KV:
        """Entries 0..end-1 as a KV view (no copy), to pass as the drafter's `past_kv`."""
        if end > self.max_len:
            raise ValueError(f"draft cache view up to {end} exceeds its size {self.max_len}")
        return KV(self.k[:, :, :end], self.v[:, :, :end])

    def check_write(self, start: int, num: int) -> None:
        """Raise ValueError when entries start..start+num-1 run past the end of the buffers (the
        check of every writer: `write`, and the Triton steps that write in their kernels)."""
        if start + num > self.max_len:
            raise ValueError(
                f"draft cache write of {num} entries at {start} exceeds its size {self.max_len}"
            )

    def write(self, kv: KV, start: int) -> None:
        """Store kv (each [1, num_kv_heads, T, head_dim]) at entries start..start+T-1.

        Raises ValueError past the end of the buffers."""
        t = kv.k.shape[2]
        self.check_write(start, t)
        self.k[:, :, start : start + t] = kv.k
        self.v[:, :, start : start + t] = kv.v

    def append(self, kv: KV) -> None:
        """Write kv at the end of the committed entries and commit them."""
        self.write(kv, self.length)
        self.commit(kv.k.shape[2])

    def commit(self, num: int) -> None:
        """Commit the num entries written right after the committed ones (a first draft step's).

        Raises ValueError past the end of the buffers."""
        if self.length + num > self.max_len:
            raise ValueError(
                f"draft cache commit of {num} entries at {self.length} exceeds its size "
                f"{self.max_len}"
            )
        self.length += num

    def rollback(self, length: int) -> None:
        """Keep only the first `length` committed entries (0 resets the cache).

        Raises ValueError for a length outside 0..self.length."""
        if not 0 <= length <= self.length:
            raise ValueError(f"draft cache rollback to {length}: must be in 0..{self.length}")
        self.length = length
