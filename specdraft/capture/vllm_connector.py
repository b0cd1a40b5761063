"""The KV connector vLLM loads (by `kv_connector_module_path`) when specdraft captures through it.

It runs inside vLLM (scheduler and workers) and imports vLLM at module level: nothing else in
specdraft imports it. Source read: vllm 0.32.0
distributed/kv_transfer/kv_connector/v1/example_hidden_states_connector.py. The scheduler side is
that example's (one pending save per finished request, with its block ids of the
extract_hidden_states cache group); the worker side replaces its CUDA-only write (copy stream,
events, pinned memory) with a synchronous one that works on every device: when the step after a
request's end delivers its pending save, TP rank 0 alone reads the request's rows out of the
hidden-states cache and writes `{shared_storage_path}/{req_id}.safetensors` atomically
(hidden_states [T, n_ids, H] in the model dtype, token_ids [T] int64), then reports the request
done sending so vLLM frees its blocks. A file that exists is therefore complete.
"""

from __future__ import annotations

from pathlib import Path

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
    ExampleHiddenStatesConnector,
    PendingSave,
    extract_from_kv_cache,
)

from specdraft.checkpoint import write_safetensors
from specdraft.files import atomic_write


class SpecdraftHiddenStatesConnector(ExampleHiddenStatesConnector):
    """ExampleHiddenStatesConnector with a synchronous, device-agnostic, atomic write."""

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, None]:
        done: set[str] = set()
        if self.has_connector_metadata():
            for pending in getattr(self._get_connector_metadata(), "pending_saves", []):
                if self._is_tp_rank_zero:
                    self._write(pending)
                done.add(pending.req_id)
        # one writer: only rank 0's notice counts (get_finished_count() == 1)
        return (done if self._is_tp_rank_zero and done else None), None

    def _write(self, pending: PendingSave) -> None:
        blocks = torch.tensor(pending.block_ids, dtype=torch.long)
        slots = (blocks[:, None] * self._block_size + torch.arange(self._block_size)).flatten()
        num_tokens = pending.token_ids.shape[0]
        states = extract_from_kv_cache(self._kv_cache, slots.to(self._kv_cache.device), num_tokens)
        tensors = {
            "hidden_states": states.to("cpu").contiguous(),
            "token_ids": pending.token_ids.to(torch.int64).contiguous(),
        }
        atomic_write(Path(pending.filename), lambda tmp: write_safetensors(tensors, tmp))
