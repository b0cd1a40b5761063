"""Speculative-decoding metrics from raw counts (DESIGN.md §2 "Metrics", case M1).

Per verification step the target emits the accepted drafts plus one bonus token, so:
    accept length tau   = emitted tokens / verification steps
    acceptance p_k      = steps whose draft at depth k was accepted / verification steps
    tau                 = 1 + sum_k p_k        (checked in every report, to rounding)
Plain decoding is the case with no drafts (tau = 1). Counts are of verification outcomes, not
of tokens kept after a stop condition truncates the last step. The first output token (from
the prefill) belongs to no verification step.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from rich.table import Table

TAU_TOLERANCE = 1e-9


@dataclass
class SpecMetrics:
    """Counts and timings of one request, or of several merged (`merge`). Times in seconds."""

    num_requests: int = 0
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    num_verify_steps: int = 0
    num_drafted_tokens: int = 0
    num_accepted_tokens: int = 0
    num_emitted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)  # index k-1 = depth k
    time_prefill_s: float = 0.0
    time_draft_s: float = 0.0
    time_verify_s: float = 0.0
    time_other_s: float = 0.0

    def record_step(self, num_drafted: int, accepted_depth: int) -> None:
        """Count one verification step that checked `num_drafted` drafts (tree nodes without
        the root) and accepted a path of `accepted_depth` drafts (plus the bonus token)."""
        self.num_verify_steps += 1
        self.num_drafted_tokens += num_drafted
        self.num_accepted_tokens += accepted_depth
        self.num_emitted_tokens += accepted_depth + 1
        if len(self.accepted_per_position) < accepted_depth:
            self.accepted_per_position += [0] * (accepted_depth - len(self.accepted_per_position))
        for k in range(accepted_depth):
            self.accepted_per_position[k] += 1

    @property
    def accept_length(self) -> float:
        """tau = emitted tokens / verification steps (0.0 before any step)."""
        return self.num_emitted_tokens / self.num_verify_steps if self.num_verify_steps else 0.0

    @property
    def acceptance_per_position(self) -> list[float]:
        """p_k = accepted at depth k / verification steps, k = 1..deepest accepted depth."""
        steps = self.num_verify_steps or 1
        return [a / steps for a in self.accepted_per_position]

    @property
    def acceptance_rate(self) -> float:
        """Accepted drafts / drafted tokens (0.0 without drafts)."""
        return (
            self.num_accepted_tokens / self.num_drafted_tokens if self.num_drafted_tokens else 0.0
        )

    @property
    def time_total_s(self) -> float:
        """Prefill + draft + verify + other."""
        return self.time_prefill_s + self.time_draft_s + self.time_verify_s + self.time_other_s

    @property
    def tokens_per_s(self) -> float:
        """Output tokens / total time (0.0 when no time was recorded)."""
        return self.num_output_tokens / self.time_total_s if self.time_total_s > 0 else 0.0

    def check(self) -> None:
        """Raise AssertionError unless the raw counts agree: emitted = accepted + steps,
        accepted = sum over positions, and tau = 1 + sum p_k to rounding (M1)."""
        assert self.num_emitted_tokens == self.num_accepted_tokens + self.num_verify_steps, (
            f"emitted {self.num_emitted_tokens} != accepted {self.num_accepted_tokens} + "
            f"steps {self.num_verify_steps}"
        )
        assert sum(self.accepted_per_position) == self.num_accepted_tokens, (
            f"per-position accepted {self.accepted_per_position} do not sum to "
            f"{self.num_accepted_tokens}"
        )
        if self.num_verify_steps:
            tau, from_p = self.accept_length, 1 + sum(self.acceptance_per_position)
            assert abs(tau - from_p) <= TAU_TOLERANCE * max(1.0, tau), (
                f"tau {tau} != 1 + sum p_k = {from_p}"
            )

    def merge(self, other: SpecMetrics) -> SpecMetrics:
        """A new SpecMetrics with every count and time summed (per-position lists aligned)."""
        n = max(len(self.accepted_per_position), len(other.accepted_per_position))
        pad = lambda xs: xs + [0] * (n - len(xs))  # noqa: E731
        merged = {
            k: getattr(self, k) + getattr(other, k)
            for k in asdict(self)
            if k != "accepted_per_position"
        }
        return SpecMetrics(
            **merged,
            accepted_per_position=[
                a + b
                for a, b in zip(pad(self.accepted_per_position), pad(other.accepted_per_position))
            ],
        )

    def to_dict(self) -> dict[str, Any]:
        """Raw counts and times plus the derived values (after `check`)."""
        self.check()
        return {
            **asdict(self),
            "accept_length": self.accept_length,
            "acceptance_per_position": self.acceptance_per_position,
            "acceptance_rate": self.acceptance_rate,
            "time_total_s": self.time_total_s,
            "tokens_per_s": self.tokens_per_s,
        }


def metrics_table(metrics: SpecMetrics, title: str = "speculative decoding") -> Table:
    """A rich table of one SpecMetrics (checks tau = 1 + sum p_k first)."""
    metrics.check()
    table = Table(title=title)
    table.add_column("metric")
    table.add_column("value", justify="right")
    rows = [
        ("output tokens", f"{metrics.num_output_tokens}"),
        ("verification steps", f"{metrics.num_verify_steps}"),
        ("drafted / accepted", f"{metrics.num_drafted_tokens} / {metrics.num_accepted_tokens}"),
        ("accept length tau", f"{metrics.accept_length:.3f}"),
        ("acceptance p_k", " ".join(f"{p:.2f}" for p in metrics.acceptance_per_position) or "-"),
        (
            "time prefill / draft / verify / other (s)",
            f"{metrics.time_prefill_s:.3f} / {metrics.time_draft_s:.3f} / "
            f"{metrics.time_verify_s:.3f} / {metrics.time_other_s:.3f}",
        ),
        ("tokens/s", f"{metrics.tokens_per_s:.1f}"),
    ]
    for name, value in rows:
        table.add_row(name, value)
    return table
