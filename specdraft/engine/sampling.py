"""Logits to probabilities, and the acceptance rules that keep speculation lossless.

- `logits_to_probs`: temperature, top-k, top-p, applied identically to target and draft.
- `verify_greedy` (T = 0): follow the tree while the target's argmax is a child; the first
  argmax that is not a child is the bonus token. Output = the target's greedy output.
  `kernels.greedy_walk.greedy_path`: the same walk on the device (rounds run ahead).
- `verify_tree` (T > 0, children chosen deterministically, e.g. top-k): target-only
  verification. At a node draw x ~ p; if x is a child, descend; else emit x and stop. Each
  emitted token is a draw from the target's p, so the output has the target's distribution
  whatever the tree holds (the rule of SGLang's target-only verifier).
- `verify_chain` (T > 0, drafts sampled from the draft's q): accept draft d with probability
  min(1, p(d)/q(d)), on rejection draw from normalised max(p - q, 0) (Leviathan et al. 2023,
  "Fast Inference from Transformers via Speculative Decoding", Alg. 1; Chen et al. 2023).

- `apply_penalties`: OpenAI's presence / frequency penalties on logits, before temperature (as
  vLLM's sampler applies them, over the output's tokens only); applied to the target's logits
  before any rule above they keep it lossless: the rules then match the penalised target.

A tree is given by `parents` (node 0 is the root, parents[0] = -1, parents[i] < i) and
`tokens` (target ids). Every rule returns a `Verdict`: the accepted nodes and the bonus token.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from specdraft.engine.errors import EngineError


@dataclass(frozen=True)
class SamplingParams:
    """How a token is drawn from logits. temperature 0 = greedy (argmax); top_k 0 = off;
    top_p 1.0 = off. Raises ValueError for a negative temperature, top_p outside (0, 1], or a
    negative top_k."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise EngineError(f"temperature {self.temperature}: must be >= 0 (0 = greedy)")
        if not 0.0 < self.top_p <= 1.0:
            raise EngineError(f"top_p {self.top_p}: must be in (0, 1] (1 = off)")
        if self.top_k < 0:
            raise EngineError(f"top_k {self.top_k}: must be >= 0 (0 = off)")

    @property
    def greedy(self) -> bool:
        """True at temperature 0."""
        return self.temperature == 0


@dataclass(frozen=True)
class Verdict:
    """Outcome of one verification: `accepted` = node indices of the accepted drafts, root to
    leaf (the root itself is not listed); `bonus` = the token the target adds after them."""

    accepted: list[int]
    bonus: int


def logits_to_probs(logits: Tensor, params: SamplingParams) -> Tensor:
    """Probabilities [..., V] float32 from logits [..., V] (any float dtype).

    Greedy: one-hot at the argmax. Otherwise logits / temperature, then top-k (keep the k
    largest), then top-p (keep the smallest set of largest probabilities whose sum reaches
    top_p; the largest is always kept), renormalised.
    """
    if params.greedy:
        return torch.zeros_like(logits, dtype=torch.float32).scatter_(
            -1, logits.argmax(-1, keepdim=True), 1.0
        )
    x = logits.float() / params.temperature
    if 0 < params.top_k < x.shape[-1]:
        kth = x.topk(params.top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_x, order = x.sort(dim=-1, descending=True)
        sorted_p = sorted_x.softmax(-1)
        drop = (
            sorted_p.cumsum(-1) - sorted_p >= params.top_p
        )  # mass before it already reaches top_p
        x = x.scatter(-1, order, sorted_x.masked_fill(drop, float("-inf")))
    return x.softmax(-1)


def apply_penalties(logits: Tensor, counts: Tensor, presence: float, frequency: float) -> Tensor:
    """logits - frequency * counts - presence * (counts > 0): OpenAI's presence / frequency
    penalties (vllm model_executor/layers/utils.py apply_penalties, the same order: before
    temperature). logits [..., V] float; counts [..., V], each token's occurrences in the output
    so far (of the path to that row). Returns a new float32 tensor."""
    counts = counts.to(logits.device, torch.float32)
    return logits.float() - frequency * counts - presence * (counts > 0).float()


def sample(probs: Tensor, generator: torch.Generator | None) -> Tensor:
    """One draw per row: probs [..., V] -> long [...]."""
    flat = probs.reshape(-1, probs.shape[-1])
    return torch.multinomial(flat, 1, generator=generator).reshape(probs.shape[:-1])


def children_of(parents: list[int], tokens: list[int]) -> list[dict[int, int]]:
    """For each node, {child token: child node}. Siblings must carry distinct tokens."""
    children: list[dict[int, int]] = [{} for _ in parents]
    for node, parent in enumerate(parents[1:], start=1):
        if tokens[node] in children[parent]:
            raise ValueError(f"tree node {parent} has two children with token {tokens[node]}")
        children[parent][tokens[node]] = node
    return children


def walk(parents: list[int], tokens: list[int], choices: list[int]) -> Verdict:
    """Descend from the root while the token chosen at the node (`choices[node]`) is a child;
    the first choice that is not a child is the bonus token."""
    children, node, accepted = children_of(parents, tokens), 0, []
    while choices[node] in children[node]:
        node = children[node][choices[node]]
        accepted.append(node)
    return Verdict(accepted, choices[node])


def verify_greedy(parents: list[int], tokens: list[int], target_logits: Tensor) -> Verdict:
    """T = 0: accept the longest path whose tokens equal the target's argmax.

    target_logits: [N, V], row i = the target's logits after node i.
    """
    return walk(parents, tokens, target_logits.argmax(-1).tolist())


def verify_tree(
    parents: list[int], tokens: list[int], target_probs: Tensor, generator: torch.Generator | None
) -> Verdict:
    """T > 0, target-only: at each visited node draw x ~ p(node); descend if x is a child.

    target_probs: [N, V] float (from `logits_to_probs`). One draw per node is made up front
    (independent draws, so the visited nodes' draws are exactly x ~ p at each step).
    """
    return walk(parents, tokens, sample(target_probs, generator).tolist())


def verify_chain(
    target_probs: Tensor, draft_probs: Tensor, drafts: Tensor, generator: torch.Generator | None
) -> Verdict:
    """T > 0 chain with drafts sampled from q: speculative sampling (Leviathan et al. 2023).

    target_probs: [n+1, V], row i = p after node i (node 0 = root, node i = draft i).
    draft_probs:  [n, V], row i = the q draft i+1 was drawn from (over the target vocabulary).
    drafts:       [n] long target ids. Returns accepted nodes 1..a and the bonus token:
    a draw from normalised max(p_a - q_{a+1}, 0) after a rejection, else from p_n.
    """
    n = drafts.numel()
    if n == 0:
        return Verdict([], int(sample(target_probs[0], generator)))
    rows = torch.arange(n, device=drafts.device)
    p, q = target_probs[rows, drafts], draft_probs[rows, drafts]
    u = torch.rand(n, generator=generator, device=drafts.device)
    rejected = (u * q >= p).tolist()  # accept iff u < p/q (q(d) > 0: d was drawn from q)
    a = rejected.index(True) if True in rejected else n
    if a == n:
        return Verdict(list(range(1, n + 1)), int(sample(target_probs[n], generator)))
    residual = (target_probs[a] - draft_probs[a]).clamp(min=0)
    if residual.sum() <= 0:  # p == q up to rounding: then p itself is the residual
        residual = target_probs[a]
    return Verdict(list(range(1, a + 1)), int(sample(residual / residual.sum(), generator)))
