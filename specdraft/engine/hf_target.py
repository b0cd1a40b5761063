"""A transformers-backed target for `SpeculativeEngine`: any decoder LM `specdraft.targets` loads
(Gemma, GPT-OSS, Llama 4, DeepSeek-V3, the multimodal wrappers' text decoders, ...), run through
the model's own forward with a `transformers.DynamicCache`, cropped on rejection.

It has the interface the engine uses of `fast_model.FastTarget` (`args`, `setup_cache`, the
forward over cache slots with a [1, 1, T, S] bool mask, `compact_cache`, `tok_embeddings`), so
chains and trees are verified exactly as on the fast path. A causal mask (prefill, decode, a
chain) is left to the model, which builds its own masks from the cache (`model_masks`); a
tree's mask is turned into the model's per-layer masks (`layer_masks`): a sliding window
(Mistral, Gemma 2 / 3, GPT-OSS, Qwen2 with sliding layers) or chunked attention (Llama 4)
applied on top of the tree mask, by position. Slower than the fast path (no fused kernels, no
CUDA graphs); used where the fast path does not apply (`load.load_engine` says which path runs).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch
from torch import Tensor
from transformers import DynamicCache

from specdraft.engine.errors import EngineError
from specdraft.engine.fast_config import check_cache_length
from specdraft.engine.fast_model import FastOutput, StepInputs, causal_mask, step_forward
from specdraft.engine.hf_rows import RowCache
from specdraft.targets import Target, capture_states

TRANSFORMERS_PATH = (
    "transformers (the model's own forward, DynamicCache; no fused kernels or CUDA graphs)"
)


@dataclass(frozen=True)
class HFArgs:
    """The sizes the engine reads of its target (`fast_model.ModelArgs`' names)."""

    model_type: str
    hidden_size: int
    num_layers: int
    vocab_size: int
    max_position_embeddings: int


def cache_argument(module: torch.nn.Module) -> str:
    """The name under which `module.forward` takes its KV cache: `cache` (transformers >= 5.24;
    `past_key_values` is deprecated there) or `past_key_values` (earlier 5.x, where an unknown
    `cache=` lands in **kwargs and is ignored). Raises ValueError naming the class when it takes
    neither."""
    parameters = inspect.signature(module.forward).parameters
    for name in ("cache", "past_key_values"):
        if name in parameters:
            return name
    raise EngineError(
        f"{type(module).__name__}.forward takes no KV cache (neither cache= nor past_key_values=): "
        "specdraft's engine cannot run it as a target"
    )


class HFTarget:
    """A `specdraft.targets.Target` with a KV cache (rows share positions and slots).

    The cache holds the K/V of slots 0..n-1 in order; a forward that writes from slot `start`
    first drops every slot >= start (the last round's rejected drafts), so slot = position for
    every committed token (the engine compacts an accepted tree path to contiguous slots).
    """

    triton_kernels = False
    host_inputs = (
        True  # `TargetRunner.forward` passes the inputs as built (the mask and slots on the host)
    )

    def __init__(self, target: Target) -> None:
        config = target.config
        self.target, self.model = target, target.model
        self.args = HFArgs(
            config.model_type,
            target.hidden_size,
            target.num_layers,
            target.vocab_size,
            getattr(config, "max_position_embeddings", None) or 4096,
        )
        self.tok_embeddings = target.embed_tokens  # .weight: the drafter's shared embedding
        self.layers = target.layers
        self.cache: DynamicCache | None = None
        self._cache_argument = cache_argument(target.causal_lm)
        self.max_batch_size = self.max_seq_len = None
        self._layer_types = tuple(getattr(config, "layer_types", None) or ())
        self._window = getattr(config, "sliding_window", None)
        self._chunk = getattr(config, "attention_chunk_size", None)

    def use_triton(self) -> str:
        """Why no Triton kernels run: this target runs transformers' own forward."""
        return "transformers-backed target"

    def setup_cache(self, max_batch_size: int, max_seq_len: int, **placement: object) -> None:
        """A new, empty cache: a `DynamicCache` for batch 1 (the engine's), a `hf_rows.RowCache`
        for a batch of sequences of their own lengths (`batch_target.BatchRunner`). placement:
        `FastTarget.setup_cache`'s dtype / device, not read (the cache takes the model's as its
        forward fills it). Raises ValueError for a max_seq_len past the target's max positions."""
        check_cache_length(max_seq_len, self.args.max_position_embeddings)
        self.cache = (
            DynamicCache() if max_batch_size == 1 else RowCache(max_batch_size, max_seq_len)
        )
        self.max_batch_size, self.max_seq_len = max_batch_size, max_seq_len

    def model_masks(
        self, attn_mask: Tensor, position_ids: Tensor, start: int
    ) -> Tensor | dict[str, Tensor] | None:
        """What the model's forward takes as attention_mask for the engine's bool mask [1, 1, T, S]
        (S = start + T): None when that mask is causal over the slots and on the host (prefill,
        decode, a chain: the model builds the same masks from its cache, windows and chunks
        included, or none), else `layer_masks` on the model's device. A mask on the device is
        not read (that would wait for the device)."""
        n = position_ids.shape[-1]
        causal = (
            attn_mask.device.type == "cpu"
            and (  # a decode step's mask is causal iff it is all True
                bool(attn_mask.all())
                if n == 1
                else torch.equal(attn_mask, causal_mask(start, n, start + n))
            )
        )
        return None if causal else self.layer_masks(attn_mask, position_ids, start)

    def layer_masks(
        self, attn_mask: Tensor, position_ids: Tensor, start: int, keys: Tensor | None = None
    ) -> Tensor | dict[str, Tensor]:
        """The engine's bool mask [B, 1, T, S] as the model's additive masks in its dtype on its
        device: one tensor, or {layer type: mask} for a config with `layer_types` (the form the
        model's forward takes in place of building its own). position_ids [B, T] are the new
        tokens' positions; keys [B, S] long the position of each key slot, by default (batch 1,
        S = start + T) key slot s < start at position s, the T new keys at `position_ids`."""
        if keys is None:
            keys = torch.cat([torch.arange(start, device=position_ids.device), position_ids[0]])[
                None
            ]
        queries, keys = position_ids[:, None, :, None], keys[:, None, None, :]
        allowed = {"full_attention": attn_mask}
        if self._window is not None:
            allowed["sliding_attention"] = attn_mask & (queries - keys < self._window)
        if self._chunk is not None:
            same_chunk = queries // self._chunk == keys // self._chunk
            allowed["chunked_attention"] = attn_mask & same_chunk
        weight = self.tok_embeddings.weight
        additive = {
            name: torch.zeros(m.shape, dtype=weight.dtype, device=m.device)
            .masked_fill_(~m, torch.finfo(weight.dtype).min)
            .to(weight.device)
            for name, m in allowed.items()
        }
        if self._layer_types:
            return {name: additive[name] for name in set(self._layer_types)}
        uses_window = self._window is not None and self.args.model_type in ("mistral", "phi3")
        return additive["sliding_attention" if uses_window else "full_attention"]

    @step_forward
    def forward(self, step: StepInputs, aux_layers: tuple[int, ...] = ()) -> FastOutput:
        """T new tokens written at slots start..start+T-1 (`fast_model.FastTarget.forward`'s shapes:
        input_ids / position_ids [B, T], every row the same positions, cache_slots [T], attn_mask
        [B, 1, T, S >= start + T] bool; columns past start + T are dropped; on the host or the
        model's device: host slots and a host mask are read without waiting for the device).
        Returns logits [B, T, V] float32 and aux states [B, T, n_aux*H] (None without aux layers).
        Raises RuntimeError before `setup_cache` or when the slots are not contiguous from
        start <= the cached length."""
        input_ids, position_ids, cache_slots, attn_mask = step
        if self.cache is None:
            raise RuntimeError("HFTarget forward before setup_cache(1, max_seq_len)")
        if isinstance(self.cache, RowCache):
            return self.rows_forward(step, aux_layers)
        if cache_slots.dim() == 2:  # one row's own slots (a batch of one): the batch-1 path
            cache_slots = cache_slots[0]
        start, n = int(cache_slots[0]), cache_slots.numel()
        cached = self.cache.get_seq_length()
        if start > cached or attn_mask.shape[-1] < start + n:
            raise RuntimeError(
                f"HFTarget: slots {start}..{start + n - 1} with {cached} cached and a mask of "
                f"{attn_mask.shape[-1]} columns; expected contiguous slots from <= {cached}"
            )
        if start < cached:
            self.truncate(start)
        attn_mask = attn_mask[
            ..., : start + n
        ]  # a wider mask (e.g. max_seq_len) covers slots not cached
        mask = self.model_masks(attn_mask, position_ids, start)
        out = self.run_model(input_ids, position_ids, mask, aux_layers)
        if self.cache.get_seq_length() != start + n:
            raise RuntimeError(
                f"HFTarget: {type(self.target.causal_lm).__name__} wrote {self.cache.get_seq_length()} "
                f"cache slots, expected {start + n}: its forward did not use the cache"
            )
        return out

    __call__ = forward

    def run_model(
        self, input_ids: Tensor, position_ids: Tensor, mask: object, aux_layers: tuple[int, ...]
    ) -> FastOutput:
        """The model's forward over the cache with `mask` as its attention_mask (None: its own)."""
        device = self.tok_embeddings.weight.device
        with torch.inference_mode(), capture_states(self.layers, set(aux_layers)) as states:
            out = self.target.causal_lm(
                input_ids=input_ids.to(device),
                position_ids=position_ids.to(device),
                attention_mask=mask,
                use_cache=True,
                **{self._cache_argument: self.cache},
            )
        aux = torch.cat([states[k] for k in aux_layers], dim=-1) if aux_layers else None
        return FastOutput(logits=out.logits.float(), aux_hidden=aux)

    def rows_forward(self, inputs: tuple[Tensor, ...], aux_layers: tuple[int, ...]) -> FastOutput:
        """`__call__` on a `RowCache`, inputs (input_ids, position_ids, cache_slots, attn_mask):
        row b's tokens written at cache_slots[b] ([B, T] long, or [T] shared), attending where
        attn_mask [B, 1, T, S] bool says over slots 0..S-1 of its row (key slot s at position s,
        the new keys at position_ids)."""
        input_ids, position_ids, cache_slots, attn_mask = inputs
        device = self.tok_embeddings.weight.device
        rows, width = input_ids.shape[0], attn_mask.shape[-1]
        slots = cache_slots.to(device).expand(rows, -1) if cache_slots.dim() == 1 else cache_slots
        positions = position_ids.to(device)
        keys = torch.arange(width, device=device).expand(rows, -1).scatter(1, slots, positions)
        self.cache.prepare(slots.to(device), width)
        mask = self.layer_masks(attn_mask.to(device), positions, 0, keys)
        return self.run_model(input_ids, positions, mask, aux_layers)

    def copy_slots(self, src_row: int, src_slots: Tensor, dst_row: int, dst_start: int) -> None:
        """`fast_model.FastTarget.copy_slots`: row src_row's K/V at src_slots [n] long to row
        dst_row's slots dst_start.. (a batch's `RowCache`; batch 1: `compact_cache`)."""
        if isinstance(self.cache, RowCache):
            self.cache.copy_slots(src_row, src_slots, dst_row, dst_start)
        else:
            self.compact_cache(src_slots, dst_start)

    @torch.no_grad()
    def compact_cache(self, src_slots: Tensor, dst_start: int) -> None:
        """Move the K/V at src_slots [n] to slots dst_start..dst_start+n-1 in every layer and drop
        the slots after them. Raises ValueError past max_seq_len."""
        n = src_slots.numel()
        if dst_start + n > self.max_seq_len:
            raise ValueError(
                f"compact_cache: slots {dst_start}..{dst_start + n - 1} exceed max_seq_len "
                f"{self.max_seq_len}"
            )
        for layer in self.cache.layers:
            for tensor in (layer.keys, layer.values):
                tensor[:, :, dst_start : dst_start + n] = tensor[:, :, src_slots]
        self.truncate(dst_start + n)

    def truncate(self, length: int) -> None:
        """Keep slots 0..length-1 of every layer. The cache's layers are `DynamicLayer`s ([B, heads,
        slots, dim] keys / values, nothing else to keep in step), sliced here rather than through
        `DynamicCache.crop`, whose argument changed meaning within transformers 5."""
        for layer in self.cache.layers:
            if layer.is_initialized:
                layer.keys, layer.values = layer.keys[:, :, :length], layer.values[:, :, :length]
