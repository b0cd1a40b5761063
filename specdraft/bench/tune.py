"""Choose speculative settings from measured acceptance and costs, or none (case S5).

Model, per speculative round with n draft steps, topk k and m verified nodes (root included):
    E[tokens per round] = 1 + sum_{j<=n} p_j           (p_j: acceptance at depth j, T = 0)
    time per round      = n * t_draft(k) + t_verify(m) + t_round(k)
    predicted speed     = E[tokens per round] / time per round
and plain decoding emits 1 token per t_verify(1) + t_plain. For a chain (k = 1, m = n + 1)
p_j comes from a deep chain probe (`probe_steps` drafts; at T = 0 a chain's first n drafts do
not depend on its depth). For a tree, p_j comes from a probe with the same topk at the deepest
depth and m = min(the tree's nodes, max_tree_tokens); a depth-n candidate reuses its first n
values, an approximation (pruning to m nodes selects differently at each depth), which is why
the best candidates are then measured.
Costs, on this machine and engine (`Bench`): t_verify(T) = median time of one target forward
over T tokens after a prefix, timed directly for every T a candidate needs; t_draft(k) = a
probe's drafting time / (rounds * steps); t_round(k) = the rest of a probe's round time beyond
t_verify (acceptance, cache commit, output); t_plain likewise from the plain run. Speeds are
decode tokens per second: tokens after the first / time after the prefill.
The `num_measure` best predictions, the best chain and the current setting are run for real,
each once per round with plain decoding in `repeats` rounds (order rotated each round), and
recommended by the rule `specdraft demo` uses (`specdraft.bench.speedup`): a median same-round
speedup of at least `min_speedup` with a lower quartile above 1x; of the settings tied within
the noise of the fastest, the one with the fewest draft tokens; else no speculation. vLLM
drafts chains: its recommendation is picked among the chains.
The launch flags name the drafter directory when an engine can load it as it is (an export);
for specdraft's training layout they name the output of the `specdraft export` command shown.
The report as text: `tune_render.render`.
"""

from __future__ import annotations

import shlex
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from specdraft.bench.speedup import (
    pick_setting,
    speedup_text,
    ties_at_top,
    timed_passes,
    timing_summary,
)
from specdraft.checkpoint import MANIFEST_FILE, CheckpointError, Manifest, detect_layout
from specdraft.draft import Eagle3Draft
from specdraft.engine.fast_model import FastTarget, causal_mask
from specdraft.engine.requests import SpecMetrics
from specdraft.engine.spec_config import SpecConfig
from specdraft.engine.speculate import SpeculativeEngine
from specdraft.export import launch_command

WARMUP_TOKENS = 8


@dataclass(frozen=True)
class TuneConfig:
    """What to try. max_new_tokens: per prompt (T = 0); probe_steps: depth of the acceptance
    probes (raised to the current setting's depth); topks: children per node to consider (1 =
    chains, always included); max_tree_tokens: cap on a tree's verified nodes; num_measure:
    best predictions run for real; min_speedup: median speedup a recommended setting needs,
    with a lower quartile above 1x (`speedup.beats_plain`);
    current: the setting in use, measured and reported too; repeats: timing rounds, each
    running every measured setting and plain decoding once. Raises ValueError for bad values."""

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
                raise ValueError(f"TuneConfig.{name} = {getattr(self, name)!r} is out of range")

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


# ---- measuring --------------------------------------------------------------------------------
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


class Bench:
    """Builds engines over one target + drafter and runs them on the prompts (T = 0)."""

    def __init__(
        self,
        target: FastTarget,
        draft: Eagle3Draft,
        prompts: Sequence[Sequence[int]],
        cfg: TuneConfig,
    ) -> None:
        self.target, self.draft, self.prompts, self.cfg = (
            target,
            draft,
            [list(p) for p in prompts],
            cfg,
        )
        self.device = target.output.weight.device
        if not self.prompts or not all(self.prompts):
            raise ValueError("tune needs at least one prompt, none of them empty")
        longest_tree = max(
            cfg.max_tree_tokens, cfg.depth + 1, cfg.current.num_draft_tokens if cfg.current else 0
        )
        self.max_seq_len = max(map(len, self.prompts)) + cfg.max_new_tokens + longest_tree
        if self.max_seq_len > target.args.max_position_embeddings:
            raise ValueError(
                f"longest prompt + max_new_tokens {cfg.max_new_tokens} + tree {longest_tree} = "
                f"{self.max_seq_len} exceeds the target's max_position_embeddings "
                f"{target.args.max_position_embeddings}: use shorter prompts or fewer tokens"
            )

    def engine(self, spec: SpecConfig | None) -> SpeculativeEngine:
        """A fresh engine (plain decoding for spec None)."""
        return SpeculativeEngine(
            self.target, self.draft if spec else None, spec, None, self.max_seq_len, self.device
        )

    def run(self, spec: SpecConfig | None) -> Measured:
        """Generate max_new_tokens for every prompt (after a short warm-up)."""
        engine = self.engine(spec)
        engine.generate(self.prompts[0], min(WARMUP_TOKENS, self.cfg.max_new_tokens))
        total = SpecMetrics()
        for prompt in self.prompts:
            total = total.merge(engine.generate(prompt, self.cfg.max_new_tokens).metrics)
        total.check()
        return Measured(spec, total)

    @torch.inference_mode()
    def time_verify(self, sizes: Sequence[int]) -> dict[int, float]:
        """Median seconds of one target forward (aux states included) over T tokens after a
        prefix of typical length, for each T in sizes (compiled: the verify's graph replay)."""
        engine = self.engine(SpecConfig.chain(1))
        prefix = min(
            len(self.prompts[0]) + self.cfg.max_new_tokens // 2, self.max_seq_len - max(sizes)
        )
        vocab = self.target.args.vocab_size
        ids = torch.arange(prefix, device=self.device) % vocab
        engine.runner.forward(
            ids,
            torch.arange(prefix, device=self.device),
            0,
            causal_mask(0, prefix, self.max_seq_len, device=self.device),
        )
        times = {}
        for size in sorted(set(sizes)):
            tokens = torch.arange(size, device=self.device) % vocab
            positions = prefix + torch.arange(size, device=self.device)
            mask = causal_mask(prefix, size, self.max_seq_len, device=self.device)
            samples = []
            for _ in range(self.cfg.verify_repeats + 1):  # the first run warms up
                synchronize(self.device)
                start = time.perf_counter()
                engine.runner.forward(
                    tokens, positions, prefix, mask, graphed=True
                )  # as a verify runs
                synchronize(self.device)
                samples.append(time.perf_counter() - start)
            times[size] = statistics.median(samples[1:])
        return times


def synchronize(device: torch.device) -> None:
    """Wait for queued GPU work (timing)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ---- the model --------------------------------------------------------------------------------
@dataclass
class Costs:
    """Seconds: target forward per token count, drafter step / round overhead per topk, plain decoding overhead per token."""

    t_verify: dict[int, float]
    t_draft: dict[int, float] = field(default_factory=dict)
    t_round: dict[int, float] = field(default_factory=dict)
    t_plain: float = 0.0


def calibrate(costs: Costs, probe: Measured) -> None:
    """t_draft and t_round of the probe's topk from its run."""
    m, spec = probe.metrics, probe.spec
    costs.t_draft[spec.topk] = m.time_draft_s / (probe.rounds * spec.num_steps)
    costs.t_round[spec.topk] = max(
        0.0,
        (m.time_verify_s + m.time_other_s) / probe.rounds - costs.t_verify[spec.num_draft_tokens],
    )


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


# ---- the tuner --------------------------------------------------------------------------------
@dataclass
class TuneReport:
    """Probes, costs, plain decoding, candidates (best predicted first), the current setting and
    the recommendations (None = no speculation)."""

    config: TuneConfig
    num_prompts: int
    probes: dict[int, Measured]
    costs: Costs
    plain_predicted_tps: float
    plain_measured_tps: float
    candidates: list[Candidate]
    current: Candidate | None
    recommendation: Candidate | None
    vllm_recommendation: Candidate | None
    draft_path: str = "DRAFT"
    target_path: str = "TARGET"

    def prediction_error(self) -> float:
        """The largest factor between predicted and measured tokens/s over the measured
        candidates (1.0 = exact; 1.0 when nothing was measured)."""
        pairs = [(c.predicted_tps, c.measured_tps) for c in self.candidates if c.measured_tps]
        return max((max(p / m, m / p) for p, m in pairs if p > 0 and m > 0), default=1.0)

    def ties(self, chains_only: bool = False) -> list[Candidate]:
        """The measured candidates (chains only for vLLM) the recommendation was picked among."""
        return settle(
            [c for c in self.candidates if c.spec.is_chain or not chains_only],
            self.config.min_speedup,
        )[1]

    def export_command(self, engine: str) -> str | None:
        """`specdraft export ...` to run before launching `engine` ("sglang" | "vllm") with the
        recommendation, or None when the drafter directory serves as it is (`needs_export`)."""
        rec = self.recommendation if engine == "sglang" else self.vllm_recommendation
        if rec is None or not needs_export(self.draft_path, engine):
            return None
        s = rec.spec
        return " ".join(
            [
                "specdraft export",
                shlex.quote(self.draft_path),
                shlex.quote(self.served_path(engine)),
                "--engine",
                engine,
                "--target",
                shlex.quote(self.target_path),
                "--num-steps",
                str(s.num_steps),
                *(
                    ["--topk", str(s.topk), "--num-draft-tokens", str(s.num_draft_tokens)]
                    if engine == "sglang"
                    else []
                ),
            ]
        )

    def served_path(self, engine: str) -> str:
        """The drafter directory the engine loads: the given one, or its export's (DRAFT-engine)."""
        return (
            f"{self.draft_path.rstrip('/')}-{engine}"
            if needs_export(self.draft_path, engine)
            else self.draft_path
        )

    def sglang_flags(self) -> str:
        """SGLang's launch command of the recommendation, as `specdraft export` prints it
        (`export.launch_command`), or the advice to launch without speculation."""
        rec = self.recommendation
        if rec is None:
            return "launch without --speculative-* flags (no speculation)"
        return launch_command(
            "sglang", self.target_path, Path(self.served_path("sglang")), rec.spec
        )

    def vllm_flags(self) -> str:
        """vLLM's launch command with the --speculative-config of the best chain
        (`export.launch_command`), or the advice to launch without speculation."""
        rec = self.vllm_recommendation
        if rec is None:
            return "launch without --speculative-config (no speculation)"
        return launch_command("vllm", self.target_path, Path(self.served_path("vllm")), rec.spec)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""

        def one(c: Candidate | None) -> dict | None:
            return c.to_dict() if c else None

        return {
            "num_prompts": self.num_prompts,
            "max_new_tokens": self.config.max_new_tokens,
            "probes": {str(k): p.metrics.to_dict() for k, p in self.probes.items()},
            "costs_s": {
                "t_verify": self.costs.t_verify,
                "t_draft": self.costs.t_draft,
                "t_round": self.costs.t_round,
                "t_plain": self.costs.t_plain,
            },
            "plain": {
                "predicted_tokens_per_s": self.plain_predicted_tps,
                "measured_tokens_per_s": self.plain_measured_tps,
            },
            "candidates": [c.to_dict() for c in self.candidates],
            "current": one(self.current),
            "recommendation": one(self.recommendation),
            "vllm_recommendation": one(self.vllm_recommendation),
            "ties": [c.to_dict() for c in self.ties()],
            "prediction_error": self.prediction_error(),
            "sglang_flags": self.sglang_flags(),
            "vllm_flags": self.vllm_flags(),
            "export_commands": {e: self.export_command(e) for e in ("sglang", "vllm")},
        }


def tune(
    target: FastTarget,
    draft: Eagle3Draft,
    prompts: Sequence[Sequence[int]],
    cfg: TuneConfig,
    draft_path: str = "DRAFT",
    progress: Callable[[str], None] | None = None,
    bench: Bench | None = None,
) -> TuneReport:
    """Probe acceptance, time the engine, predict every candidate, measure the best, recommend.

    prompts: target token ids. bench: what runs and times the settings (default: a `Bench` of
    target, draft, prompts and cfg; a subclass with given timings checks the logic on them).
    Raises ValueError when prompts + tokens exceed the target's positions, or (from the engine)
    when the drafter does not fit the target."""
    say = progress or (lambda text: None)
    bench = bench or Bench(target, draft, prompts, cfg)
    probe_specs = {
        k: SpecConfig(cfg.depth, k, tree_tokens(cfg.depth, k, cfg.max_tree_tokens))
        for k in cfg.all_topks
    }
    specs = [
        SpecConfig(n, k, tree_tokens(n, k, cfg.max_tree_tokens))
        for k in cfg.all_topks
        for n in range(1, cfg.depth + 1)
    ] + ([cfg.current] if cfg.current else [])
    costs = Costs(
        bench.time_verify([1] + [s.num_draft_tokens for s in specs + list(probe_specs.values())])
    )
    probes = {}
    for k, spec in probe_specs.items():
        probes[k] = bench.run(spec)
        calibrate(costs, probes[k])
        say(f"probe topk {k}, {cfg.depth} steps: tau {probes[k].metrics.accept_length:.3f}")
    candidates = {s: Candidate(s, *predict(s, probes[s.topk], costs)) for s in specs}
    ranked = sorted(candidates.values(), key=lambda c: -c.predicted_tps)
    chains = [c for c in ranked if c.spec.is_chain]
    to_measure = {c.spec: c for c in ranked[: cfg.num_measure] + chains[:1]}
    if cfg.current:
        to_measure[cfg.current] = candidates[cfg.current]
    runs = timed_passes(dict.fromkeys([None, *to_measure]), cfg.repeats, bench.run)
    plain_tps = [run.tokens_per_s for run in runs[None]]
    plain = sorted(runs[None], key=lambda run: run.tokens_per_s)[
        (len(plain_tps) - 1) // 2
    ]  # the median run
    costs.t_plain = max(
        0.0,
        (plain.metrics.time_total_s - plain.metrics.time_prefill_s) / plain.rounds
        - costs.t_verify[1],
    )
    say(
        f"plain decoding: median {statistics.median(plain_tps):.1f} tok/s over {cfg.repeats} round{'s' * (cfg.repeats != 1)}"
    )
    for spec, c in to_measure.items():
        c.timing = timing_summary([run.tokens_per_s for run in runs[spec]], plain_tps)
        c.measured_tau, c.measured_tps, c.speedup = (
            runs[spec][0].metrics.accept_length,
            c.timing["tokens_per_s"],
            c.timing["speedup"],
        )
        say(
            f"{spec_text(spec)}: median {c.measured_tps:.1f} tok/s, speedup {speedup_text(c.timing)}"
        )
    return TuneReport(
        cfg,
        len(bench.prompts),
        probes,
        costs,
        1.0 / (costs.t_verify[1] + costs.t_plain),
        statistics.median(plain_tps),
        ranked,
        candidates.get(cfg.current) if cfg.current else None,
        settle(to_measure.values(), cfg.min_speedup)[0],
        settle([c for c in to_measure.values() if c.spec.is_chain], cfg.min_speedup)[0],
        draft_path,
    )


def settle(candidates: Any, min_speedup: float) -> tuple[Candidate | None, list[Candidate]]:
    """(the recommendation, the candidates tied at the top it was picked among) of the measured
    `candidates`, by `speedup.pick_setting` / `ties_at_top`, demo's rule; (None, []) when none
    beats plain decoding beyond the noise."""
    measured = [c for c in candidates if c.timing is not None]
    rows = [c.row() for c in measured]
    chosen = pick_setting(rows, min_speedup)
    ties = [
        c for c, r in zip(measured, rows) if any(r is t for t in ties_at_top(rows, min_speedup))
    ]
    return next((c for c, r in zip(measured, rows) if r is chosen), None), ties


def needs_export(draft_dir: str, engine: str) -> bool:
    """Whether `engine` ("sglang" | "vllm") needs `specdraft export`'s output rather than
    `draft_dir`: True for specdraft's training layout (SGLang layout + specdraft manifest, what
    `specdraft train` writes, `checkpoint.describe_layout`) unless its manifest records an
    export (extra["export"]), and for the speculators layout under SGLang (vLLM reads it); an
    official SGLang-layout directory without a manifest serves as it is. A directory that is
    not a readable drafter (e.g. a placeholder) is named as given."""
    path = Path(draft_dir)
    try:
        layout = detect_layout(path)
    except (CheckpointError, OSError):
        return False
    if layout != "specdraft":
        return layout == "speculators" and engine == "sglang"
    try:
        return "export" not in Manifest.read(path / MANIFEST_FILE).extra
    except (CheckpointError, OSError, ValueError):
        return True


def tune_paths(
    target_dir: str | Path,
    draft_dir: str | Path,
    prompts: str,
    cfg: TuneConfig,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
    progress: Callable[[str], None] | None = None,
) -> TuneReport:
    """`tune` for a target directory (with its tokenizer), a drafter and a prompt source (`sweep.load_prompts`)."""
    from specdraft.bench.sweep import load_prompts
    from specdraft.data.render import prompt_ids

    tokenizer, engine = load_tuned(target_dir, draft_dir, cfg, device, dtype)
    ids = [prompt_ids(tokenizer, p) for p in load_prompts(prompts)]
    report = tune(engine.target, engine.draft, ids, cfg, str(draft_dir), progress)
    report.target_path = str(target_dir)
    return report


def load_tuned(
    target_dir: str | Path,
    draft_dir: str | Path,
    cfg: TuneConfig,
    device="cpu",
    dtype=torch.float32,
):
    """(tokenizer, engine) of a target directory and a draft checkpoint, for `tune`. A corrupt
    or incomplete target config.json is a ValueError naming the file and the fix (doctor's words)."""
    from transformers import AutoTokenizer

    from specdraft.doctor.inputs import given_config
    from specdraft.engine.load import load_engine
    from specdraft.targets.config import TARGET_CONFIG_FIX, check_target_config

    config = given_config(Path(target_dir), TARGET_CONFIG_FIX)
    if config is not None:  # no config.json: left to the loader
        check_target_config(target_dir, config)
    tokenizer = AutoTokenizer.from_pretrained(target_dir, local_files_only=True)
    return tokenizer, load_engine(target_dir, draft_dir, SpecConfig.chain(cfg.depth), device, dtype)


def spec_text(spec: SpecConfig) -> str:
    """'steps n, topk k, draft tokens m'."""
    return f"steps {spec.num_steps}, topk {spec.topk}, draft tokens {spec.num_draft_tokens}"
