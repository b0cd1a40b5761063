"""The placement rules of a shell (benchmarks/shell_target.py, whose docstring states the
construction): the sizes of a model (`Shape`), where a small model's pieces go in a larger shape
(`Embedding`, `shell_layer`), writing them (`place`) and the check that every small tensor was
placed (`Sources`). Shared by shell_target.py (the target, the EAGLE-3 drafter) and
shell_dflash.py (the DFlash drafter); no __main__: a helper.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class Shape:
    """The sizes of a Llama-family target (counts)."""

    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int

    @classmethod
    def of_config(cls, config: dict) -> Shape:
        """The shape of a transformers Llama config dict."""
        heads = config["num_attention_heads"]
        return cls(
            config["hidden_size"],
            config["num_hidden_layers"],
            heads,
            config.get("num_key_value_heads") or heads,
            config.get("head_dim") or config["hidden_size"] // heads,
            config["intermediate_size"],
        )


@dataclass(frozen=True)
class Embedding:
    """Where the pieces of a small model (or drafter) of shape `small` go in a shell of `shell`."""

    small: Shape
    shell: Shape

    def __post_init__(self) -> None:
        s, b = self.small, self.shell
        too_small = [
            f
            for f in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim")
            if getattr(b, f) < getattr(s, f)
        ]
        if too_small:
            raise ValueError(f"shell {b} is smaller than the model {s} in {', '.join(too_small)}")
        if b.num_heads // b.num_kv_heads != s.num_heads // s.num_kv_heads:
            raise ValueError(
                f"shell GQA group {b.num_heads}/{b.num_kv_heads} != the model's "
                f"{s.num_heads}/{s.num_kv_heads}: head i -> head i needs the same group size"
            )
        if b.head_dim % 2 or s.head_dim % 2:
            raise ValueError(
                f"head_dim {s.head_dim} -> {b.head_dim}: rotate-half needs even head dims"
            )

    @property
    def norm_scale(self) -> float:
        """RMSNorm weights x sqrt(H/H'): the zeros past H lower the mean square by H/H'."""
        return math.sqrt(self.small.hidden_size / self.shell.hidden_size)

    @property
    def eps_scale(self) -> float:
        return self.small.hidden_size / self.shell.hidden_size

    @property
    def q_scale(self) -> float:
        """q x sqrt(D/d): the shell's softmax divides by sqrt(D)."""
        return math.sqrt(self.shell.head_dim / self.small.head_dim)

    def rope_theta(self, theta: float) -> float:
        """theta^(D/d): shell frequency j = small frequency j for j < d/2."""
        return theta ** (self.shell.head_dim / self.small.head_dim)

    def layer(self, k: int) -> int:
        return shell_layer(k, self.small.num_layers, self.shell.num_layers)

    def head_rows(self, num_heads: int) -> Tensor:
        """Shell row of each small row of a projection with `num_heads` heads [num_heads * d] long:
        head i dims j and j + d/2 -> shell head i dims j and j + D/2."""
        d, big = self.small.head_dim, self.shell.head_dim
        j = torch.arange(d)
        within = torch.where(j < d // 2, j, j - d // 2 + big // 2)
        return (torch.arange(num_heads)[:, None] * big + within).flatten()

    def hidden(self, blocks: int = 1) -> Tensor:
        """Shell columns of `blocks` concatenated H-wide inputs: block b at b*H'..b*H'+H-1."""
        h = torch.arange(self.small.hidden_size)
        return torch.cat([b * self.shell.hidden_size + h for b in range(blocks)])


def shell_layer(k: int, num_layers: int, shell_layers: int) -> int:
    """Shell index (1-based, specdraft's aux convention) of small layer k of `num_layers`
    (1-based; 0, the embeddings, -> 0): spread evenly, the last layer last."""
    return k * shell_layers // num_layers


def place(
    dest: Tensor,
    src: Tensor,
    rows: Tensor | None = None,
    cols: Tensor | None = None,
    scale: float = 1.0,
) -> None:
    """dest[rows, cols] = src * scale (computed in float32, cast to dest's dtype); None = the
    first src.shape[i] indices. 1-d tensors take rows only."""
    value = src.float() * scale
    rows = torch.arange(src.shape[0]) if rows is None else rows
    if src.dim() == 1:
        dest[rows.to(dest.device)] = value.to(dest)
        return
    cols = torch.arange(src.shape[1]) if cols is None else cols
    dest[rows.to(dest.device)[:, None], cols.to(dest.device)[None, :]] = value.to(dest)


class Sources:
    """The small model's tensors by name; `take` marks each one used, `check_all_used` refuses
    any left over (a tensor the construction does not place would be silently dropped)."""

    def __init__(self, tensors: dict[str, Tensor], where: str) -> None:
        self.tensors, self.where, self.used = tensors, where, set()

    def take(self, name: str) -> Tensor:
        self.used.add(name)
        return self.tensors[name]

    def check_all_used(self) -> None:
        left = sorted(set(self.tensors) - self.used)
        if left:
            raise ValueError(
                f"{self.where}: tensors the shell construction does not place: {', '.join(left)}"
            )


def drafter_shape(cfg, num_layers: int) -> Shape:
    """A drafter config's sizes (an EAGLE-3 `DraftConfig` or a `DFlashConfig`: the same field
    names) as a Shape of num_layers layers."""
    return Shape(
        cfg.hidden_size,
        num_layers,
        cfg.num_attention_heads,
        cfg.num_key_value_heads,
        cfg.head_dim,
        cfg.intermediate_size,
    )


def drafter_sizes(cfg, shape: Shape, emb: Embedding) -> dict:
    """The config fields a drafter (EAGLE-3 or DFlash) takes in the shell: the shell's widths,
    heads and layer count, an intermediate size at least the drafter's own, and the rope theta
    and norm eps that keep its numbers (`Embedding`)."""
    return dict(
        hidden_size=shape.hidden_size,
        num_attention_heads=shape.num_heads,
        num_key_value_heads=shape.num_kv_heads,
        head_dim=shape.head_dim,
        intermediate_size=max(shape.intermediate_size, cfg.intermediate_size),
        target_num_layers=shape.num_layers,
        rope_theta=emb.rope_theta(cfg.rope_theta),
        rms_norm_eps=cfg.rms_norm_eps * emb.eps_scale,
    )
