"""tune's cost model: the settings it tries (`TuneConfig`), the costs timed on this machine
(`Costs`), what a setting run for real measured (`Measured`), and the prediction of every
candidate setting (`predict`, `Candidate`); the model itself is in `bench.tune`'s docstring."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from specdraft.bench.config import BenchInputError
from specdraft.engine.requests import SpecMetrics
from specdraft.engine.spec_config import SpecConfig


@dataclass(frozen=True)
class TuneConfig:
    """What to try. max_new_tokens: per prompt (T = 0); probe_steps: depth of the acceptance
    probes (raised to the current setting's depth); topks: children per node to consider (1 =
    chains, always included); max_tree_tokens: cap on a tree's verified nodes; num_measure:
    best predictions run for real; min_speedup: median speedup a recommended setting needs,
    with a lower quartile above 1x (`speedup.beats_plain`);
    current: the setting in use, measured and reported too; repeats: timing rounds, each
    running every measured setting and plain decoding once. Raises BenchInputError (a
    ValueError) for bad values."""

    max_new_tokens: int = 64
    probe_steps: int = 8
    topks: tuple[int, ...] = (1, 2, 4)
    max_tree_tokens: int = 16
    num_measure: int = 3
    min_speedup: float = 1.05
    current: SpecConfig | None = None
    verify_repeats: int = 7
    repeats: int = 5

    def __post_init__(self) -> None:
        checks = [
            ("max_new_tokens", self.max_new_tokens >= 1),
            ("probe_steps", self.probe_steps >= 1),
            ("topks", bool(self.topks) and all(k >= 1 for k in self.topks)),
            ("max_tree_tokens", self.max_tree_tokens >= 2),
            ("num_measure", self.num_measure >= 1),
            ("min_speedup", self.min_speedup > 0),
            ("verify_repeats", self.verify_repeats >= 1),
            ("repeats", self.repeats >= 1),
        ]
        for name, ok in checks:
            if not ok:
                raise BenchInputError(
                    f"TuneConfig.{name} = {getattr(self, name)!r} is out of range"
                )

    @property
    def depth(self) -> int:
        """Probe depth: probe_steps, or the current setting's steps when deeper."""
        return max(self.probe_steps, self.current.num_steps if self.current else 0)

    @property
    def all_topks(self) -> list[int]:
        """topks plus 1 (chains) and the current setting's topk."""
        return sorted({1, *self.topks, *([self.current.topk] if self.current else [])})


def tree_tokens(num_steps: int, topk: int, cap: int) -> int:
    """Verified nodes of the candidate (num_steps, topk): num_steps + 1 for a chain, else the
    whole tree 1 + topk + (num_steps - 1) * topk^2 capped at `cap`."""
    if topk == 1:
        return num_steps + 1
    return max(2, min(SpecConfig(num_steps, topk, 2).max_draft_tokens, cap))


def decode_tokens_per_s(m: SpecMetrics) -> float:
    """Tokens after each request's first / time after its prefill."""
    busy = m.time_total_s - m.time_prefill_s
    return (m.num_output_tokens - m.num_requests) / busy if busy > 0 else 0.0


@dataclass
class Measured:
    """One setting run for real over the prompts (merged metrics)."""

    spec: SpecConfig | None
    metrics: SpecMetrics

    @property
    def tokens_per_s(self) -> float:
        """Decode tokens/s."""
        return decode_tokens_per_s(self.metrics)

    @property
    def rounds(self) -> int:
        """Verification steps."""
        return max(1, self.metrics.num_verify_steps)


@dataclass
class Costs:
    """Seconds: target forward per token count, drafter step / round overhead per topk, plain decoding overhead per token."""

    t_verify: dict[int, float]
    t_draft: dict[int, float] = field(default_factory=dict)
    t_round: dict[int, float] = field(default_factory=dict)
    t_plain: float = 0.0


def round_rest_s(probe: Measured, costs: Costs) -> float:
    """Seconds per round of `probe` beyond its target forward: decode time (after the prefill) per
    round less t_verify(its draft tokens); drafting, acceptance, cache commit and output."""
    m = probe.metrics
    busy = m.time_total_s - m.time_prefill_s
    return busy / probe.rounds - costs.t_verify[probe.spec.num_draft_tokens]


def calibrate(costs: Costs, deep: Measured, shallow: Measured | None = None) -> None:
    """t_draft and t_round of the probes' topk, so that a round of n steps costs
    n * t_draft + t_round beyond its target forward (`round_rest_s`). With a `shallow` probe
    (1 step) as well as the `deep` one, the line through both: a round's fixed drafting cost
    (the first step's extend over the accepted tokens, the proposal's bookkeeping) lands in
    t_round, not spread over the deep probe's steps, which under-predicted a short chain's
    round. Without one, or where timing noise makes that line fall with the steps, t_draft is the
    deep probe's drafting time per step and t_round the rest."""
    k, depth = deep.spec.topk, deep.spec.num_steps
    rest = round_rest_s(deep, costs)
    step = 0.0
    if shallow is not None and depth != shallow.spec.num_steps:
        step = (rest - round_rest_s(shallow, costs)) / (depth - shallow.spec.num_steps)
    if step <= 0:
        step = deep.metrics.time_draft_s / (deep.rounds * depth)
    costs.t_draft[k] = step
    costs.t_round[k] = max(0.0, rest - depth * step)


def predict(spec: SpecConfig, probe: Measured, costs: Costs) -> tuple[float, float]:
    """(predicted accept length, predicted decode tokens/s) of `spec` (module docstring)."""
    p = probe.metrics.acceptance_per_position
    tau = 1.0 + sum(p[: spec.num_steps])
    seconds = (
        spec.num_steps * costs.t_draft[spec.topk]
        + costs.t_verify[spec.num_draft_tokens]
        + costs.t_round[spec.topk]
    )
    return tau, tau / seconds


@dataclass
class Candidate:
    """A setting with its prediction and, when run, its measurement: median tokens/s and
    speedup vs plain, and `timing` (`speedup.timing_summary` of its rounds)."""

    spec: SpecConfig
    predicted_tau: float
    predicted_tps: float
    measured_tau: float | None = None
    measured_tps: float | None = None
    speedup: float | None = None
    timing: dict[str, Any] | None = None

    def row(self) -> dict[str, Any]:
        """The measurement as a `specdraft.bench.speedup` row."""
        return {**(self.timing or {}), "num_draft_tokens": self.spec.num_draft_tokens}

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {
            "num_steps": self.spec.num_steps,
            "topk": self.spec.topk,
            "num_draft_tokens": self.spec.num_draft_tokens,
            "predicted_tau": self.predicted_tau,
            "predicted_tokens_per_s": self.predicted_tps,
            "measured_tau": self.measured_tau,
            "measured_tokens_per_s": self.measured_tps,
            "speedup": self.speedup,
            "timing": self.timing,
        }


def spec_text(spec: SpecConfig) -> str:
    """'steps n, topk k, draft tokens m'."""
    return f"steps {spec.num_steps}, topk {spec.topk}, draft tokens {spec.num_draft_tokens}"
