"""A transformers `Cache` whose K/V sit in rows of static buffers, one row per sequence of a
batch, each sequence at its own length: what `hf_target.HFTarget` runs a batch on
(`batch_target.BatchRunner`), where a `DynamicCache` holds one length for the whole batch.

Each layer keeps keys and values [max_batch_size, heads, max_seq_len, head_dim] (allocated on
the first write, in the shapes and dtype the model's attention hands over: MLA's keys and values
may differ in head_dim). Before a forward the caller sets the batch's write slots [B, T] and the
mask width S (`RowCache.prepare`); every layer's `update` scatters the T new K/V of row b at
slots[b], then returns rows 0..B-1 over slots 0..S-1 for the model's attention, whose 4-D mask
(the engine's, per row) hides what a row has not written or has rejected. The interface used is
the one a cache layer implements in transformers 5 (`cache_utils.CacheLayerMixin`: `update`,
`get_seq_length`, `get_mask_sizes`, `get_max_length`); a 4-D mask is used as given
(`masking_utils._preprocess_mask_arguments`), so the cache's own sizes build no mask.
"""

from __future__ import annotations

from functools import partial

import torch
from torch import Tensor
from transformers.cache_utils import Cache, CacheLayerMixin


class RowLayer(CacheLayerMixin):
    """One decoder layer's K/V in the rows of its `RowCache` (see the module docstring)."""

    is_sliding = False

    def __init__(self, owner: RowCache) -> None:
        super().__init__()
        self.owner = owner

    def lazy_initialization(self, key_states: Tensor, value_states: Tensor) -> None:
        """Zeroed buffers [max_batch_size, heads, max_seq_len, head_dim] like the first write's."""
        rows, length = self.owner.num_rows, self.owner.max_seq_len
        self.keys, self.values = (
            x.new_zeros(rows, x.shape[1], length, x.shape[3]) for x in (key_states, value_states)
        )
        self.device, self.is_initialized = key_states.device, True

    def update(self, key_states: Tensor, value_states: Tensor, *args, **kwargs) -> tuple:
        """Write key_states / value_states [B, heads, T, D] at the prepared slots [B, T] of rows
        0..B-1; return those rows over slots 0..S-1 (views of the buffers)."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        slots, width, rows = self.owner.slots, self.owner.width, key_states.shape[0]
        out = []
        for buffer, new in ((self.keys, key_states), (self.values, value_states)):
            index = slots[:, None, :, None].expand_as(new)
            out.append(buffer[:rows, :, :width].scatter_(2, index, new))
        return tuple(out)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        """(kv length, kv offset) of the keys `update` returns: the mask width, from slot 0."""
        return self.owner.width, 0

    def get_seq_length(self) -> int:
        """The slots before this forward's tokens in the widest row (mask width - T)."""
        return self.owner.width - self.owner.slots.shape[-1]

    def get_max_length(self) -> int:
        """The buffers' slots."""
        return self.owner.max_seq_len


class RowCache(Cache):
    """Static per-row K/V for a batch of sequences of their own lengths (module docstring)."""

    def __init__(self, max_batch_size: int, max_seq_len: int) -> None:
        super().__init__(layer_class_to_replicate=partial(RowLayer, self))
        # not `max_batch_size`: transformers 5.17 Cache has a read-only property of that name
        self.num_rows, self.max_seq_len = max_batch_size, max_seq_len
        self.slots = torch.zeros(1, 1, dtype=torch.long)
        self.width = 1

    def prepare(self, slots: Tensor, width: int) -> None:
        """The next forward writes row b's T tokens at slots[b] ([B, T] long, each < width, on the
        model's device) and attends over slots 0..width-1. Raises ValueError past the buffers."""
        if width > self.max_seq_len or slots.shape[0] > self.num_rows:
            raise ValueError(
                f"RowCache: {slots.shape[0]} rows over {width} slots exceed its "
                f"{self.num_rows} x {self.max_seq_len}"
            )
        self.slots, self.width = slots, width

    @torch.no_grad()
    def copy_slots(self, src_row: int, src_slots: Tensor, dst_row: int, dst_start: int) -> None:
        """Copy row src_row's K/V at src_slots [n] long to row dst_row, slots dst_start.., in
        every layer (gathered first: overlap-safe)."""
        n = src_slots.numel()
        for layer in self.layers:
            if layer.is_initialized:
                for buffer in (layer.keys, layer.values):
                    moved = buffer[src_row].index_select(1, src_slots.to(buffer.device))
                    buffer[dst_row, :, dst_start : dst_start + n] = moved
