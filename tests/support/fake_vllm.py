"""A stand-in for `capture.vllm.VllmCapture` in a data-parallel rank's process (no vLLM): each
token's states are a fixed function of its id, so any split of the shards over ranks must
give byte-identical shard files."""

from __future__ import annotations

import os

import torch

from specdraft.capture.forward import shard_tensors
from specdraft.capture.store import CaptureError, StoreSettings
from specdraft.data.render import Sample


class FakeVllmCapture:
    """start / capture_shard / close as VllmCapture. fail_on: the input ids of a sample whose
    shard fails with a one-line CaptureError (as vLLM's reason would), or, with die, ends the
    process without a word (as the kernel's out-of-memory killer would)."""

    def __init__(self, hidden_size: int, fail_on: list[int] | None = None, die: bool = False):
        self.hidden_size, self.fail_on, self.die = hidden_size, fail_on, die

    def start(self, work_dir) -> FakeVllmCapture:
        return self

    def close(self) -> None:
        pass

    def capture_shard(
        self, samples: list[Sample], settings: StoreSettings, on_batch=None
    ) -> dict[str, torch.Tensor]:
        if any(list(s.input_ids) == self.fail_on for s in samples):
            if self.die:
                os._exit(9)
            raise CaptureError("vLLM ran out of KV-cache blocks\n(engine core stopped)")
        n_aux, H = len(settings.aux_layers), self.hidden_size
        states = []
        for s in samples:
            ids = torch.tensor(s.input_ids, dtype=torch.float32)[:, None]
            aux = ids * 0.01 + torch.arange(n_aux * H) * 0.001
            states.append((aux.to(settings.dtype), aux[:, :H].neg().to(settings.dtype)))
        if on_batch:
            on_batch(sum(len(s.input_ids) for s in samples))
        return shard_tensors(samples, states)
