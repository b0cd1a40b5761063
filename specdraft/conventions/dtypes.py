"""The one dtype table: the names capture, train, export and the CLI take."""

from __future__ import annotations

import torch

from specdraft.errors import SpecdraftError


class UnknownDtype(SpecdraftError, ValueError):
    """A dtype name outside `DTYPES` (--dtype, --target-dtype, a config's dtype)."""


DTYPES = {
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "float32": torch.float32,
    "fp32": torch.float32,
}


def parse_dtype(name: str | torch.dtype) -> torch.dtype:
    """'bf16' / 'bfloat16' / 'fp16' / 'float16' / 'fp32' / 'float32' (or a dtype) -> dtype.
    Raises UnknownDtype (a ValueError) naming the choices (`DTYPES`)."""
    if isinstance(name, torch.dtype):
        return name
    if name not in DTYPES:
        raise UnknownDtype(f"unknown dtype {name!r}; use one of {', '.join(DTYPES)}")
    return DTYPES[name]
