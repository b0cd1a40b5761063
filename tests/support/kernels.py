"""Shared by the engine's kernel and graph tests: the device and dtype they run in (CUDA:
bfloat16; else Triton's interpreter in float32), tiny FastTarget shapes (ARGS), a seeded random
target, and CUDA-graph capture replaced by eager replays on the CPU. A module importing this one
is skipped where Triton is not installed."""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

if importlib.util.find_spec("triton") is None:
    pytest.skip("Triton is not installed (pip install triton)", allow_module_level=True)
CUDA = torch.cuda.is_available()
assert CUDA or os.environ.get("TRITON_INTERPRET") == "1", (
    "tests/conftest.py sets TRITON_INTERPRET without a GPU"
)

from specdraft.engine.fast_config import ModelArgs  # noqa: E402
from specdraft.engine.fast_model import FastTarget  # noqa: E402

DEVICE = "cuda" if CUDA else "cpu"
DTYPE = torch.bfloat16 if CUDA else torch.float32


# tiny FastTarget shapes: llama (GQA 4 / 2), qwen2 with qkv bias (MQA), qwen3 with qk-norm, tied
_SHAPE = dict(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16)
_SHAPE |= dict(intermediate_size=96, vocab_size=200, max_position_embeddings=512)
ARGS = {
    "llama": ModelArgs(model_type="llama", **_SHAPE),
    "qwen2-bias": ModelArgs(model_type="qwen2", **{**_SHAPE, "num_kv_heads": 1}, qkv_bias=True),
    "qwen3-qknorm": ModelArgs(
        model_type="qwen3",
        **{**_SHAPE, "num_heads": 8},
        qk_norm=True,
        tie_word_embeddings=True,
    ),
}


def random_target(args: ModelArgs) -> FastTarget:
    """A FastTarget of `args` on DEVICE in DTYPE, seeded: norms near 1, other weights N(0, 0.2)."""
    torch.manual_seed(0)
    model = FastTarget(args)
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.copy_(
                1 + 0.1 * torch.randn_like(param)
                if "norm" in name
                else 0.2 * torch.randn_like(param)
            )
    return model.to(DEVICE, DTYPE).eval()


class _LazyGraph:
    """Stands in for a captured CUDA graph without a GPU: replay recomputes the outputs (into
    the same list)."""

    def __init__(self, fn):
        self.fn, self.outputs = fn, []

    def replay(self):
        self.outputs[:] = self.fn()


def replay_rounds_eagerly(monkeypatch) -> None:
    """Without a GPU, `GraphedRound.capture` returns a `_LazyGraph` over its static inputs."""
    from specdraft.engine.draft_round import GraphedRound

    def capture(self, m):
        inputs = self.static_inputs(m)
        graph = _LazyGraph(lambda: self.round(*inputs))
        return graph, inputs, graph.outputs

    monkeypatch.setattr(GraphedRound, "capture", capture)
