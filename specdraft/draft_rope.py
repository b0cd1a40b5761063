"""The drafter's RoPE frequencies from its config's `rope_theta` / `rope_scaling`: inverse
frequencies (`rope_inv_freq`) and yarn's cos/sin factor (`rope_attention_factor`), computed as
transformers, SGLang and vLLM compute them. Applying them: `draft.rope_cos_sin`, `apply_rope`.
"""

from __future__ import annotations

import math
from typing import Any

import torch


def rope_inv_freq(head_dim: int, theta: float, scaling: dict[str, Any] | None) -> torch.Tensor:
    """RoPE inverse frequencies [head_dim/2], float64, for default / linear / llama3 / yarn
    scaling (`draft_config.check_rope_scaling` says which scalings are accepted).

    llama3 scaling follows Meta's Llama 3.1 reference (`apply_scaling`), as transformers does;
    yarn is `yarn_inv_freq`.
    """
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    rope_type = (scaling or {}).get("rope_type", "default")
    if rope_type == "yarn":
        return yarn_inv_freq(inv_freq, head_dim, theta, scaling)
    if rope_type == "linear":
        inv_freq = inv_freq / scaling["factor"]
    elif rope_type == "llama3":
        factor, low, high = (
            scaling["factor"],
            scaling["low_freq_factor"],
            scaling["high_freq_factor"],
        )
        old_len = scaling["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv_freq
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * inv_freq / factor + smooth * inv_freq
        inv_freq = torch.where(
            wavelen > old_len / low,
            inv_freq / factor,
            torch.where(wavelen < old_len / high, inv_freq, smoothed),
        )
    return inv_freq


def yarn_inv_freq(
    inv_freq: torch.Tensor, head_dim: int, theta: float, scaling: dict[str, Any]
) -> torch.Tensor:
    """YaRN inverse frequencies [head_dim/2] from the unscaled ones: interpolated (divided by
    `factor`) below the correction range, kept above it, a linear ramp between. The correction
    range is where `original_max_position_embeddings` makes beta_fast (32) .. beta_slow (1)
    rotations, floored / ceiled unless `truncate` is false. The same math as transformers'
    `_compute_yarn_parameters`, SGLang's and vLLM's `YaRNScalingRotaryEmbedding`."""

    def correction_dim(rotations: float) -> float:
        ratio = scaling["original_max_position_embeddings"] / (rotations * 2 * math.pi)
        return head_dim * math.log(ratio) / (2 * math.log(theta))

    low = correction_dim(scaling.get("beta_fast") or 32)
    high = correction_dim(scaling.get("beta_slow") or 1)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001  # the engines' guard against a zero-width ramp
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    return inv_freq / scaling["factor"] * ramp + inv_freq * (1 - ramp)


def rope_attention_factor(scaling: dict[str, Any] | None) -> float:
    """The factor yarn multiplies cos and sin by (so q·k by its square): 0.1 ln(factor) + 1 for
    a factor above 1 (transformers' `get_mscale`, the engines' `yarn_get_mscale`); 1 for every
    other scaling."""
    if (scaling or {}).get("rope_type") != "yarn" or scaling["factor"] <= 1:
        return 1.0
    return 0.1 * math.log(scaling["factor"]) + 1.0
