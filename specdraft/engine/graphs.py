"""The target's forwards as CUDA graphs, and the one helper that captures every CUDA graph of
the engine (`capture_graph`: the target's here, the drafter's steps in `fast_draft.GraphedDraft`,
whole draft rounds in `draft_round.GraphedRound`).

- `GraphedTarget`: `FastTarget.forward` as CUDA-graph replays, one graph per token count,
  placement of the inputs and KV cache (what `round.TargetRunner` replays once compiled),
  and plain decoding with the host one step ahead of the GPU (`decode_ahead`).
- `StaticInputs`: a graph's input tensors at fixed addresses in one device buffer, host values
  staged in one copy.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from specdraft.engine.fast_model import FastTarget, StepInputs, causal_mask, step_forward
from specdraft.engine.requests import Request
from specdraft.engine.sampling import logits_to_probs, sample


def capture_graph(
    fn: Callable[[], Any], warmups: int = 2, reset: Callable[[], Any] | None = None
) -> tuple[torch.cuda.CUDAGraph, Any]:
    """(graph, outputs) of fn captured as a CUDA graph, after `warmups` calls on a side stream
    (Triton and torch.compile compile, and allocations happen, there, outside the capture).
    reset: called before each warm-up call and before the capture (e.g. to put back inputs that
    a call advances)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmups):
            if reset is not None:
                reset()
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    if reset is not None:
        reset()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        output = fn()
    return graph, output


class StaticInputs:
    """A CUDA graph's input tensors, at fixed addresses in one device buffer. Inputs given on the
    CPU are written to a pinned host buffer of the same layout, where they come first, and reach
    the device in one host-to-device copy (`stage`), which `GraphedTarget` captures into its graph:
    a replay then issues no copy of its own. Inputs given on the device are copied to their place
    one by one (`fill`).

    A decode step's inputs (token, position, slot, mask row) are a few bytes each: one copy for
    all of them, since each CUDA call costs the host more than such bytes cost to move.
    `shapes` / `dtypes`: the inputs'; `on_host`: which of them are given on the CPU (a graph is
    captured per placement); `device`: any (tests use the CPU).
    """

    def __init__(
        self,
        shapes: Sequence[tuple[int, ...]],
        dtypes: Sequence[torch.dtype],
        device: torch.device,
        on_host: Sequence[bool],
    ) -> None:
        offsets, size, self.host_bytes = [0] * len(shapes), 0, 0
        for i in sorted(range(len(shapes)), key=lambda i: not on_host[i]):  # host inputs first
            offsets[i] = size
            size += (
                -(-math.prod(shapes[i]) * dtypes[i].itemsize // 8) * 8
            )  # each input 8-byte aligned
            if on_host[i]:
                self.host_bytes = size
        self.on_host = tuple(on_host)
        self.device_buffer = torch.zeros(size, dtype=torch.uint8, device=device)
        self.host_buffer = torch.zeros(size, dtype=torch.uint8, pin_memory=device.type == "cuda")
        self.tensors = [
            self.view(self.device_buffer, o, shape, dtype)
            for o, shape, dtype in zip(offsets, shapes, dtypes)
        ]
        self.host_tensors = [
            self.view(self.host_buffer, o, shape, dtype)
            for o, shape, dtype in zip(offsets, shapes, dtypes)
        ]
        # recorded by the staging copy (inside a graph: an external event node)
        self.copied = torch.cuda.Event(external=True) if device.type == "cuda" else None

    @staticmethod
    def view(buffer: Tensor, offset: int, shape: tuple[int, ...], dtype: torch.dtype) -> Tensor:
        """The bytes of one input, as a tensor of its shape and dtype."""
        return buffer[offset : offset + math.prod(shape) * dtype.itemsize].view(dtype).view(shape)

    def fill(self, values: Sequence[Tensor]) -> None:
        """Write values (the inputs' shapes and placement; any dtype that casts): those on the
        CPU into the host buffer (once the last `stage` has read it), those on the device into
        the static tensors. The host values reach the device with the next `stage`. Raises
        ValueError when a shape or a placement differs. A device value that is its static tensor
        (written there by its producer, e.g. `GraphedTarget.device_input_ids`) is not copied."""
        for static, value, on_host in zip(self.tensors, values, self.on_host):
            if value.shape != static.shape:
                raise ValueError(
                    f"graph input of shape {tuple(value.shape)}, captured for {tuple(static.shape)}"
                )
            if value.device != (torch.device("cpu") if on_host else static.device):
                raise ValueError(
                    f"graph input on {value.device.type}, captured for one on "
                    f"{'the CPU' if on_host else static.device.type}"
                )
        if self.host_bytes:
            if self.copied is not None:
                self.copied.synchronize()  # the last staging copy has left the pinned buffer
            for host, value, on_host in zip(self.host_tensors, values, self.on_host):
                if on_host:
                    host.copy_(value)
        for static, value, on_host in zip(self.tensors, values, self.on_host):
            if (
                not on_host and value.data_ptr() != static.data_ptr()
            ):  # not already written in place
                static.copy_(value)

    def stage(self) -> None:
        """Copy the host inputs' bytes to the device (asynchronously, one copy), after `fill`."""
        if self.host_bytes:
            self.device_buffer[: self.host_bytes].copy_(
                self.host_buffer[: self.host_bytes], non_blocking=True
            )
            if self.copied is not None:
                self.copied.record()


class GraphedTarget:
    """CUDA-graph replays of `FastTarget.forward`, one graph per token count T, placement of the
    inputs (CPU or device) and KV cache (captured on first use). Inputs are copied into static
    buffers (`StaticInputs`; the host-to-device copy is the graph's first node), so outputs are
    valid until the next call with the same T. Capture warms up with writes to the last T cache
    slots, whose K/V it puts back after (a request as long as the cache may hold them when a
    graph is first used).
    """

    def __init__(self, target: FastTarget, aux_layers: tuple[int, ...]) -> None:
        self.target, self.aux_layers = target, aux_layers
        self.graphs: dict[tuple, tuple[torch.cuda.CUDAGraph, StaticInputs, Any]] = {}
        # one set of input buffers per (T, mask width, placement), shared by that key's graphs of
        # every cache: a producer that writes a graph's inputs in place keeps valid addresses
        self.inputs: dict[tuple, StaticInputs] = {}

    @step_forward
    def __call__(self, step: StepInputs, aux_layers: tuple[int, ...] = ()) -> Any:
        """`FastTarget.forward`'s output for its inputs (aux_layers fixed at construction): a
        replay of the graph for this T, mask width and placement (the tensors on the target's
        device or the CPU)."""
        on_host = tuple(v.device.type == "cpu" for v in step)
        graph, inputs, output = self.graph(
            step.input_ids.shape[1], step.attn_mask.shape[-1], on_host
        )
        inputs.fill(step)
        graph.replay()
        return output

    def device_input_ids(self, t: int, max_seq_len: int) -> Tensor:
        """input_ids [1, t] long of the graph for T = t tokens with input_ids on the device and the
        other inputs on the host (a verify's placement; mask width max_seq_len), captured on first
        use. A caller that writes its tokens here and passes this tensor back skips the device
        copy of `StaticInputs.fill` (the engine's drafted tree: `TreeExpansion.tree(out=...)`):
        one CUDA call less on the host between drafting and verifying. The values are read by the
        next replay of that graph and must not change before it."""
        return self.graph(t, max_seq_len, (False, True, True, True))[1].tensors[0]

    def device_inputs(self, t: int, max_seq_len: int) -> list[Tensor]:
        """The inputs of the graph for T = t tokens with every input on the device: input_ids
        [1, t], position_ids [1, t], cache_slots [t] long, attn_mask [1, 1, t, max_seq_len] bool,
        captured on first use (a graphed tree round writes them: `GraphedRound`). The same
        tensors for the life of this object, also after the target's cache is rebuilt; passing
        them back replays the graph with no copy. Call this before writing them: a capture
        overwrites them with its warm-up values."""
        return self.graph(t, max_seq_len, (False, False, False, False))[1].tensors

    def graph(self, t: int, max_seq_len: int, on_host: tuple[bool, ...]) -> tuple:
        """(graph, StaticInputs, output) for T = t and this placement, captured on first use."""
        # a new cache (setup_cache) invalidates the graphs: key them by its address too
        cache = self.target.layers[0].attention.kv_cache.k_cache
        key = (t, on_host, cache.data_ptr())
        if key not in self.graphs:
            self.graphs[key] = self.capture(t, max_seq_len, on_host, cache.device)
        return self.graphs[key]

    def greedy_decode(self, max_seq_len: int) -> tuple[torch.cuda.CUDAGraph, list[Tensor], Tensor]:
        """A greedy decode step that feeds the next one, as one graph (the host only replays it):
        the forward of input_ids [1, 1] at position_ids [1, 1] and cache_slots [1] under attn_mask
        [1, 1, 1, max_seq_len] (`device_inputs`' tensors for T = 1), then the argmax written to
        input_ids and to the returned token [1] long, position and slot advanced by one, and the
        mask's column of the new slot set. Returns (graph, its inputs, token): the caller sets
        the inputs for the first step and reads the token after each replay. Captured on first
        use, again for a rebuilt cache (the same input tensors)."""
        cache = self.target.layers[0].attention.kv_cache.k_cache
        key = ("greedy", max_seq_len, cache.data_ptr())
        if key not in self.graphs:
            self.graphs[key] = self.capture(
                1, max_seq_len, (False,) * 4, cache.device, feed_argmax=True
            )
        graph, inputs, token = self.graphs[key]
        return graph, inputs.tensors, token

    def capture(
        self,
        t: int,
        max_seq_len: int,
        on_host: tuple[bool, ...],
        device: torch.device,
        feed_argmax: bool = False,
    ) -> tuple:
        """Warm up (compiles), then capture staging + forward for T = t tokens (feed_argmax: and
        `greedy_decode`'s tail, which then is the graph's output instead of the forward's)."""
        key = (t, max_seq_len, on_host)
        if key not in self.inputs:
            self.inputs[key] = StaticInputs(
                [(1, t), (1, t), (t,), (1, 1, t, max_seq_len)],
                [torch.long, torch.long, torch.long, torch.bool],
                device,
                on_host,
            )
        inputs = self.inputs[key]
        slots = torch.arange(max_seq_len - t, max_seq_len)
        warm = (
            torch.zeros(1, t, dtype=torch.long),
            slots[None],
            slots,
            torch.ones(1, 1, t, max_seq_len, dtype=torch.bool),
        )
        warm = [v if host else v.to(device) for v, host in zip(warm, on_host)]

        def step() -> Any:
            output = self.target(*inputs.tensors, self.aux_layers)
            if not feed_argmax:
                return output
            ids, positions, cache_slots, mask = inputs.tensors
            token = output.logits[0, -1].argmax(-1, keepdim=True)  # [1]
            ids.view(-1).copy_(token)
            positions.add_(1)
            cache_slots.add_(1)
            mask.view(-1).index_fill_(0, cache_slots.clamp(max=max_seq_len - 1), True)
            return token

        stack = self.target.kv_stack  # [layers, 2, rows, n_kv, slots, head_dim]
        held = stack[:, :, :, :, max_seq_len - t :].clone()  # what the warm-ups overwrite
        graph, output = capture_graph(
            lambda: (inputs.stage(), step())[1], warmups=3, reset=lambda: inputs.fill(warm)
        )  # a fed step advanced them
        stack[:, :, :, :, max_seq_len - t :] = held
        return graph, inputs, output

    def decode_ahead(self, req: Request, max_seq_len: int) -> None:
        """Plain decoding on a graphed target with the host one step ahead of the GPU, to the end
        of the request: step k + 1 is launched before step k's token is read, its input written
        on the device by step k's argmax (or draw), so the host's staging, launch and bookkeeping
        hide behind the GPU's step instead of adding to it (gpt-fast never reads a token back
        before the end; vLLM and SGLang overlap their scheduling the same way). Greedy, a step is
        one graph replay that also feeds the next step (`greedy_decode`); sampled, the host
        stages each step's position and mask and draws on the device. The step launched past the last token writes one cache
        slot that no request reads (`round.free_nodes` leaves the cache's last free) and is dropped.
        max_seq_len: the engine's (the graphs' mask width)."""
        launch = (
            self.greedy_steps(req, max_seq_len)
            if req.params.greedy
            else self.sampled_steps(req, max_seq_len)
        )
        tokens = torch.empty(
            2, dtype=torch.long, pin_memory=True
        )  # the two steps in flight, read back
        ready = [torch.cuda.Event(), torch.cuda.Event()]
        start, in_flight, slot = time.perf_counter(), 0, 0
        while req.finish_reason is None:
            token = launch(
                req.length + in_flight
            )  # the cache holds req.length tokens, the step in flight one more
            tokens[slot : slot + 1].copy_(token, non_blocking=True)
            ready[slot].record()
            in_flight, slot = in_flight + 1, 1 - slot
            if in_flight == 2:  # read the older step (in `slot` now) while the newer one runs
                ready[slot].synchronize()
                req.length, in_flight = req.length + 1, 1
                req.metrics.record_step(0, 0)
                req.emit([int(tokens[slot])])
        req.metrics.time_verify_s += time.perf_counter() - start

    def greedy_steps(self, req: Request, max_seq_len: int) -> Callable[[int], Tensor]:
        """`decode_ahead`'s step launcher at T = 0: sets the self-feeding decode graph's inputs to
        the request's last token and position once, then each call replays it (the position
        argument is the graph's own count) and returns its token [1] long on the device."""
        graph, (ids, positions, slots, mask), token = self.greedy_decode(max_seq_len)
        ids.fill_(req.output_ids[-1])
        positions.fill_(req.length)
        slots.fill_(req.length)
        mask.copy_(causal_mask(req.length, 1, max_seq_len, device=ids.device))

        def launch(position: int) -> Tensor:
            graph.replay()
            return token

        return launch

    def sampled_steps(self, req: Request, max_seq_len: int) -> Callable[[int], Tensor]:
        """`decode_ahead`'s step launcher at T > 0: each call stages the step's position and mask,
        replays the decode graph, draws the token on the device and writes it as the next step's
        input; returns it ([1] long on the device)."""
        ids = self.device_input_ids(1, max_seq_len)  # [1, 1]: the graph reads it in place
        ids.fill_(req.output_ids[-1])

        def launch(position: int) -> Tensor:
            mask = causal_mask(position, 1, max_seq_len)  # on the host: staged in one copy
            logits = self(
                ids[0][None],
                torch.tensor([position])[None],
                torch.arange(position, position + 1),
                mask,
            ).logits[0]
            token = sample(logits_to_probs(logits[-1:], req.params), req.generator)
            ids.view(-1).copy_(token)  # the next step's input, before that step's replay
            return token

        return launch
