"""The batched target forward as CUDA-graph replays (`GraphedRows`, `BatchRunner(graphs=True)`):
one graph per batch size B, token count T and placement of the inputs, every input at a static
address, so that a batched round costs the forward's kernels, not their launches.

The inputs are `graphs.StaticInputs` (input_ids, position_ids, cache_slots [B, T] long, attn_mask
[B, 1, T, max_seq_len] bool: static widths), those given on the CPU staged in one copy that the
graph captures; the outputs (logits [B, T, V], aux states [B, T, n_aux*H]) are the graph's own
tensors, valid until the next replay of the same key. That is the batched round's order: every
row's proposal reads its pending aux states (views of the last verify's output) before the next
verify replays. Off CUDA (tests) a graph is `EagerGraph`: replay runs the same step and writes
its outputs into the first run's tensors, so the same code and the same output contract run on
the CPU.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from specdraft.engine.fast_model import FastOutput, FastTarget, StepInputs, step_forward
from specdraft.engine.graphs import StaticInputs, capture_graph


class EagerGraph:
    """A captured graph's stand-in off CUDA: `output` from a first run of step; each `replay`
    runs step again and copies its outputs into `output`'s tensors."""

    def __init__(self, step: Callable[[], FastOutput]) -> None:
        self.step = step
        self.output = step()

    def replay(self) -> None:
        """Run the step; its outputs overwrite `output`'s."""
        out = self.step()
        self.output.logits.copy_(out.logits)
        if out.aux_hidden is not None:
            self.output.aux_hidden.copy_(out.aux_hidden)


class GraphedRows:
    """`FastTarget.forward` of B rows with per-row slots, as replays of graphs captured on first
    use per (B, T, placement, cache): a rebuilt cache (`setup_cache`) gets new graphs, over the
    same input buffers. Capture warms up by writing each row's last T cache slots, which no
    request commits (the engine keeps a round's scratch free at the end of the cache)."""

    def __init__(self, target: FastTarget, aux_layers: tuple[int, ...], max_seq_len: int) -> None:
        self.target, self.aux_layers, self.max_seq_len = target, aux_layers, max_seq_len
        self.graphs: dict[tuple, tuple[Any, StaticInputs, FastOutput]] = {}
        self.inputs: dict[tuple, StaticInputs] = {}

    @step_forward
    def __call__(self, step: StepInputs, aux_layers: tuple[int, ...] = ()) -> FastOutput:
        """GraphedRows (aux_layers fixed at construction; attn_mask max_seq_len wide, cache_slots
        [B, T]): a replay of the graph of this B, T and placement (each input on the CPU or the
        target's device)."""
        b, t = step.input_ids.shape
        on_host = tuple(v.device.type == "cpu" for v in step)
        graph, inputs, output = self.graph(b, t, on_host)
        inputs.fill(step)
        graph.replay()
        return output

    def graph(self, b: int, t: int, on_host: tuple[bool, ...]) -> tuple:
        """(graph, StaticInputs, output) of this key, captured on first use."""
        cache = self.target.layers[0].attention.kv_cache.k_cache
        key = (b, t, on_host, cache.data_ptr())
        if key not in self.graphs:
            self.graphs[key] = self.capture(b, t, on_host, cache.device)
        return self.graphs[key]

    def capture(self, b: int, t: int, on_host: tuple[bool, ...], device: torch.device) -> tuple:
        """Stage + forward of B rows of T tokens as one graph (an `EagerGraph` off CUDA), after
        warm-up runs at each row's last T slots."""
        size = self.max_seq_len
        shapes = [(b, t), (b, t), (b, t), (b, 1, t, size)]
        dtypes = [torch.long, torch.long, torch.long, torch.bool]
        inputs = self.inputs.setdefault(
            (b, t, on_host), StaticInputs(shapes, dtypes, device, on_host)
        )
        slots = torch.arange(size - t, size).expand(b, t)
        warm = [
            torch.zeros(b, t, dtype=torch.long),
            slots,
            slots,
            torch.ones(shapes[3], dtype=torch.bool),
        ]
        warm = [v if host else v.to(device) for v, host in zip(warm, on_host)]

        def step() -> FastOutput:
            inputs.stage()
            return self.target(*inputs.tensors, self.aux_layers)

        if device.type != "cuda":
            inputs.fill(warm)
            graph = EagerGraph(step)
            return graph, inputs, graph.output
        graph, output = capture_graph(step, warmups=3, reset=lambda: inputs.fill(warm))
        return graph, inputs, output
