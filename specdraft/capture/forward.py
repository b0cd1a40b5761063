"""Running the target over samples: which samples go to which shard, batches by length, the
tensors of one shard, and the target's head weights and identity that a store records.
"""

from __future__ import annotations

from typing import Any

import torch

from specdraft.capture.store import StoreSettings
from specdraft.data.render import Sample


def shard_plan(
    lengths: list[int], shard_tokens: int, shard_samples: int | None = None
) -> list[tuple[int, int]]:
    """Sample ranges [first, end) of each shard: consecutive samples, a new shard whenever the
    next sample would take the current one past `shard_tokens` tokens or `shard_samples`."""
    plan: list[tuple[int, int]] = []
    first, tokens = 0, 0
    max_samples = shard_samples or len(lengths)
    for i, n in enumerate(lengths):
        if i > first and (tokens + n > shard_tokens or i - first >= max_samples):
            plan.append((first, i))
            first, tokens = i, 0
        tokens += n
    if lengths:
        plan.append((first, len(lengths)))
    return plan


def plan_samples(samples: list[Sample], settings: StoreSettings) -> list[tuple[int, int]]:
    """`shard_plan` of `samples` with `settings`' shard bounds."""
    return shard_plan(
        [len(s.input_ids) for s in samples], settings.shard_tokens, settings.shard_samples
    )


def _length_batches(lengths: list[int], batch_tokens: int) -> list[list[int]]:
    """Indices sorted by length, grouped so that count · longest <= batch_tokens (>= 1 each)."""
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    batches: list[list[int]] = []
    for i in order:
        if batches and (len(batches[-1]) + 1) * lengths[i] <= batch_tokens:
            batches[-1].append(i)
        else:
            batches.append([i])
    return batches


def _forward_batch(target, samples: list[Sample], aux_layers, dtype, device):
    """Per sample: (aux [T, n_aux*H], last [T, H]) in `dtype` on the CPU (right padding)."""
    longest = max(len(s.input_ids) for s in samples)
    ids = torch.zeros(len(samples), longest, dtype=torch.long)
    mask = torch.zeros(len(samples), longest, dtype=torch.long)
    for b, s in enumerate(samples):
        ids[b, : len(s.input_ids)] = torch.tensor(s.input_ids)
        mask[b, : len(s.input_ids)] = 1
    out = target.forward(
        ids.to(device), mask.to(device), aux_layers=list(aux_layers), return_logits=False
    )
    return [
        (
            out.aux_hidden[b, : len(s.input_ids)].to("cpu", dtype),
            out.last_hidden[b, : len(s.input_ids)].to("cpu", dtype),
        )
        for b, s in enumerate(samples)
    ]


def capture_shard(
    target, samples: list[Sample], settings: StoreSettings, device="cpu", on_batch=None
) -> dict[str, torch.Tensor]:
    """The tensors of one shard for `samples` (already truncated), in sample order.

    Samples are batched by length (`settings.batch_tokens` padded tokens per forward).
    `on_batch(num_tokens)` is called after each forward. Returns input_ids [N] int32,
    loss_mask [N] uint8, offsets [S+1] int64, aux_hidden [N, n_aux*H], last_hidden [N, H].
    """
    lengths = [len(s.input_ids) for s in samples]
    states: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * len(samples)
    for batch in _length_batches(lengths, settings.batch_tokens):
        outs = _forward_batch(
            target, [samples[i] for i in batch], settings.aux_layers, settings.dtype, device
        )
        for i, out in zip(batch, outs):
            states[i] = out
        if on_batch:
            on_batch(sum(lengths[i] for i in batch))
    return shard_tensors(samples, states)


def shard_tensors(
    samples: list[Sample], states: list[tuple[torch.Tensor, torch.Tensor]]
) -> dict[str, torch.Tensor]:
    """One shard's tensors from `samples` and their states, (aux [T, n_aux*H], last [T, H]) per
    sample in sample order: input_ids [N] int32, loss_mask [N] uint8, offsets [S+1] int64,
    aux_hidden [N, n_aux*H], last_hidden [N, H] (the states' dtype)."""
    lengths = [len(s.input_ids) for s in samples]
    offsets = torch.zeros(len(samples) + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(torch.tensor(lengths, dtype=torch.int64), 0)
    return {
        "input_ids": torch.tensor([t for s in samples for t in s.input_ids], dtype=torch.int32),
        "loss_mask": torch.tensor([m for s in samples for m in s.loss_mask], dtype=torch.uint8),
        "offsets": offsets,
        "aux_hidden": torch.cat([a for a, _ in states]),
        "last_hidden": torch.cat([h for _, h in states]),
    }


def target_head_tensors(target) -> dict[str, torch.Tensor]:
    """Copies of the target's final norm (as a Llama-form weight, `Target.head_norm_weight`),
    lm_head and input embedding weights (CPU)."""
    return {
        "norm.weight": target.head_norm_weight().to("cpu").clone(),
        "lm_head.weight": target.lm_head.weight.detach().to("cpu").clone(),
        "embed_tokens.weight": target.embed_tokens.weight.detach().to("cpu").clone(),
    }


def target_meta(target, name_or_path: str | None) -> dict[str, Any]:
    """What a store index and a manifest record about a loaded target (`Target`)."""
    from specdraft.draft_config import rope_from_hf_config
    from specdraft.targets.config import config_hash

    cfg = target.config
    rope_theta, rope_scaling = rope_from_hf_config(lambda k, d=None: getattr(cfg, k, d))
    return {
        "architecture": target.architecture,
        "target_class": target.target_class,
        "config_hash": config_hash(cfg),
        "hidden_size": target.hidden_size,
        "vocab_size": target.vocab_size,
        "num_layers": target.num_layers,
        "rope_theta": rope_theta,
        "rope_scaling": rope_scaling,
        "max_position_embeddings": getattr(cfg, "max_position_embeddings", None),
        "name_or_path": name_or_path,
    }
