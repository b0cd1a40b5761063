"""A drafted tree's greedy verdict in one Triton launch (`rounds_ahead.RoundsAhead`'s verify
graph): `sampling.verify_greedy`'s walk without leaving the device, where torch ops of fixed
size take about thirty launches. Runs in Triton's interpreter without a GPU (TRITON_INTERPRET=1).
Import this module only where Triton is installed.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor


@triton.jit
def _greedy_path_kernel(
    tokens_ptr,
    parents_ptr,
    choices_ptr,
    path_ptr,
    accepted_ptr,
    ok_ptr,
    N,
    LENGTH: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """One program: the walk from the root, one depth a step."""
    i = tl.arange(0, BLOCK_N)
    valid = i < N
    tokens = tl.load(tokens_ptr + i, mask=valid, other=-1)
    parents = tl.load(parents_ptr + i, mask=valid, other=-2)
    choices = tl.load(choices_ptr + i, mask=valid, other=-1)
    node = tl.sum(tl.where(i < 0, 1, 0), axis=0)  # 0, the root
    walking = node == 0
    ok = walking
    accepted = node
    tl.store(path_ptr, node.to(tl.int64))
    for depth in tl.static_range(1, LENGTH):
        choice = tl.sum(tl.where(i == node, choices, 0), axis=0)  # the target's choice after node
        hit = (parents == node) & (tokens == choice) & valid & walking
        count = tl.sum(hit.to(tl.int32), axis=0)
        ok = ok & (count <= 1)
        walking = walking & (count >= 1)
        node = tl.where(walking, tl.min(tl.where(hit, i, BLOCK_N), axis=0), node)
        accepted += walking.to(tl.int32)
        tl.store(path_ptr + depth, tl.where(walking, node, 0).to(tl.int64))
    tl.store(accepted_ptr, accepted.to(tl.int64))
    tl.store(ok_ptr, ok.to(tl.uint8))


def greedy_path(
    tokens: Tensor, parents: Tensor, choices: Tensor, length: int
) -> tuple[Tensor, Tensor, Tensor]:
    """The greedy walk of a tree on the device: from the root, step to the child whose token is
    the target's choice after the current node, while there is one.

    tokens: [N] long, the tree's nodes (root first, parents before children); parents: [N] long
    (the root's -1); choices: [N] long, the target's choice after each node; length: the longest
    path's nodes, root included (at least the tree's depth + 1). Returns path [length] long (the
    path's nodes, root first, then 0s), accepted [1] long (the path's drafts) and ok [1] bool:
    False when a node on the path had two children with its choice, which a drafted tree never
    has (siblings are one top-k of the draft vocabulary: distinct ids, distinct target ids through
    d2t) and `sampling.walk` would not resolve.
    """
    n, device = tokens.numel(), tokens.device
    path = torch.empty(length, dtype=torch.long, device=device)
    accepted = torch.empty(1, dtype=torch.long, device=device)
    ok = torch.empty(1, dtype=torch.bool, device=device)
    _greedy_path_kernel[(1,)](
        tokens,
        parents,
        choices,
        path,
        accepted,
        ok.view(torch.uint8),
        n,
        LENGTH=length,
        BLOCK_N=triton.next_power_of_2(n),
    )
    return path, accepted, ok
