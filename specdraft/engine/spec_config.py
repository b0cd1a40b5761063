"""Speculative settings: draft depth, children per node, verified nodes (DESIGN.md §2).

Names follow SGLang: `num_steps` = draft depth (`--speculative-num-steps`), `topk` = children
per node (`--speculative-eagle-topk`), `num_draft_tokens` = nodes verified per step *including
the root* (`--speculative-num-draft-tokens`). vLLM's chain length `num_speculative_tokens`
equals `num_steps`.

Valid triples (SGLang `server_args.py` + `eagle_worker.py`):
- topk = 1 (a chain): num_draft_tokens = num_steps + 1. SGLang silently rewrites any other
  value (case S4); specdraft refuses it and names the corrected values.
- topk > 1 (a tree): 2 <= num_draft_tokens <= 1 + topk + (num_steps - 1) * topk^2, the
  candidates SGLang's tree expansion produces (topk after the first step, topk^2 after each
  later one); it keeps the best num_draft_tokens - 1 by cumulative draft score, plus the root.
"""

from __future__ import annotations

from dataclasses import dataclass

from specdraft.errors import SpecdraftError


class SpecConfigError(SpecdraftError, ValueError):
    """A speculative setting (num_steps, topk, num_draft_tokens) that breaks a rule; the message
    names the rule and valid alternatives."""


@dataclass(frozen=True)
class SpecConfig:
    """One speculative setting (SGLang's meaning of each field); validated on construction.

    Raises SpecConfigError (a ValueError) naming the rule that a triple breaks and valid alternatives; an invalid
    triple is never adjusted.
    """

    num_steps: int
    topk: int
    num_draft_tokens: int

    def __post_init__(self) -> None:
        for name in ("num_steps", "topk", "num_draft_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise SpecConfigError(f"SpecConfig.{name} = {value!r}: must be a positive integer")
        if self.topk == 1 and self.num_draft_tokens != self.num_steps + 1:
            raise SpecConfigError(chain_rule_message(self.num_steps, self.num_draft_tokens))
        if self.topk > 1 and not 2 <= self.num_draft_tokens <= self.max_draft_tokens:
            raise SpecConfigError(
                f"speculative settings topk {self.topk}, num_steps {self.num_steps}, num_draft_tokens "
                f"{self.num_draft_tokens}: a tree verifies 2 <= num_draft_tokens <= 1 + topk + "
                f"(num_steps - 1) * topk^2 = {self.max_draft_tokens} nodes (the candidates its "
                f"expansion produces, plus the root); use num_draft_tokens in 2..{self.max_draft_tokens}"
                f" or more steps / a larger topk"
            )

    @classmethod
    def chain(cls, num_steps: int) -> SpecConfig:
        """A chain of `num_steps` drafts (topk 1, num_draft_tokens = num_steps + 1)."""
        return cls(num_steps=num_steps, topk=1, num_draft_tokens=num_steps + 1)

    @property
    def is_chain(self) -> bool:
        """True for topk = 1 (one draft per depth)."""
        return self.topk == 1

    @property
    def max_draft_tokens(self) -> int:
        """Nodes the expansion can produce including the root (`max_draft_tokens`)."""
        return max_draft_tokens(self.num_steps, self.topk)

    @property
    def num_speculative_tokens(self) -> int:
        """vLLM's chain length (`num_speculative_tokens`) = num_steps."""
        return self.num_steps

    def sglang_args(self) -> list[str]:
        """The SGLang launch arguments that express this setting."""
        return [
            "--speculative-num-steps",
            str(self.num_steps),
            "--speculative-eagle-topk",
            str(self.topk),
            "--speculative-num-draft-tokens",
            str(self.num_draft_tokens),
        ]


def max_draft_tokens(num_steps: int, topk: int) -> int:
    """Nodes a tree of `num_steps` levels and `topk` children per node can verify, the root
    included: 1 + topk + (num_steps - 1)·topk² (SGLang's bound on num_draft_tokens)."""
    return 1 + topk + (num_steps - 1) * topk**2


def chain_rule_message(num_steps: int, num_draft_tokens: int, engine: str = "sglang") -> str:
    """The refusal for topk 1 with num_draft_tokens != num_steps + 1 (case S4), with fixes;
    engine "vllm" (which runs chains only): the chain fixes alone."""
    fixes = [f"num_steps {num_steps} / num_draft_tokens {num_steps + 1} (keep the depth)"]
    if num_draft_tokens >= 2:
        fixes.append(
            f"num_steps {num_draft_tokens - 1} / num_draft_tokens {num_draft_tokens} "
            f"(keep the verified count)"
        )
    if engine == "vllm":
        return (
            f"speculative settings num_steps {num_steps}, num_draft_tokens {num_draft_tokens}: vLLM runs "
            f"chains only (num_speculative_tokens = num_steps), which verify num_steps + 1 = "
            f"{num_steps + 1} nodes; use {' or '.join(fixes)}"
        )
    tree = smallest_tree(num_steps, num_draft_tokens)
    tree_text = (
        f"or a tree (topk > 1), e.g. topk {tree.topk}, num_steps {tree.num_steps}, "
        f"num_draft_tokens {tree.num_draft_tokens}"
        if tree
        else "or a tree (topk > 1)"
    )
    return (
        f"speculative settings topk 1, num_steps {num_steps}, num_draft_tokens {num_draft_tokens}: "
        f"with topk 1 (a chain) num_draft_tokens must be num_steps + 1 = {num_steps + 1}; SGLang "
        f"would silently set num_draft_tokens = {num_steps + 1}, specdraft refuses. Use topk 1 with "
        f"{' or '.join(fixes)}, {tree_text}"
    )


def smallest_tree(num_steps: int, num_draft_tokens: int) -> SpecConfig | None:
    """A topk > 1 tree that verifies `num_draft_tokens` nodes: the smallest topk at `num_steps`
    (at most 8), else topk 4 with the fewest steps; None when num_draft_tokens < 2."""
    if num_draft_tokens < 2:
        return None
    for topk in range(2, 9):
        if max_draft_tokens(num_steps, topk) >= num_draft_tokens:
            return SpecConfig(num_steps, topk, num_draft_tokens)
    steps = 1
    while max_draft_tokens(steps, 4) < num_draft_tokens:
        steps += 1
    return SpecConfig(steps, 4, num_draft_tokens)
