"""How the engine's Triton kernels are launched: programmatic dependent launch (PDL) on Hopper.

On Hopper every kernel (`linear_ops`, `norm_rope_ops`, `attention_ops`, `expand_ops`) is launched
with PDL (`use_pdl`): it starts while the kernel before it finishes, and a GEMV requests its
first weights, attention its first block of cached K / V (all but the slots being written),
before it waits. Each kernel waits before it lets the next one start, so at most two overlap
(releasing the next kernel first was slower). Import this module only where Triton is installed.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl


@functools.cache
def use_pdl(device: torch.device) -> bool:
    """Whether kernels launch with programmatic dependent launch (PDL, CUDA compute capability
    >= 9: Hopper): a kernel's programs start while the previous kernel finishes, load what does
    not depend on it (weights), then wait for it (griddepcontrol.wait). Off in the interpreter."""
    return (
        device.type == "cuda"
        and os.environ.get("TRITON_INTERPRET") != "1"
        and torch.cuda.get_device_capability(device)[0] >= 9
    )


def pdl_launch(device: torch.device, block: int = 0, per_warp: int = 1) -> dict:
    """Launch arguments of a kernel with a USE_PDL parameter: {USE_PDL, launch_pdl} when `use_pdl`;
    with a `block` of elements per program, also num_warps: one per `per_warp` elements, 4 to 16."""
    warps = {"num_warps": min(16, max(4, block // per_warp))} if block else {}
    return (
        {"USE_PDL": True, "launch_pdl": True, **warps}
        if use_pdl(device)
        else {"USE_PDL": False, **warps}
    )


@triton.jit
def pdl_wait(USE_PDL: tl.constexpr):
    """With PDL: wait for the kernel before this one (griddepcontrol.wait), then let the next one
    start; nothing without."""
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
