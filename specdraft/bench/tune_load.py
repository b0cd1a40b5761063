"""tune across load (`specdraft tune --concurrency 1,2,4,...`): at each batch size B, B
concurrent prompts through the engine's `engine.batch.BatchScheduler`, batched plain decoding,
every chain depth K = 1..the drafter's (`TuneConfig.depth`) and one tree per wider topk
(`load_settings`: the batch engine drafts every row's tree in one drafter forward per step,
`engine.batch_draft.draft_trees`), each once per timing round in `repeats` rounds, order
rotated (`speedup.timed_passes`); a setting's speedup at B is the median of its same-round
ratios to batched plain decoding, and it wins by demo's rule (`tune_report.settle`: median >=
min_speedup, lower quartile above 1x), so B's setting may be a tree.

Speed at B: tokens after each sequence's first over the wall seconds after the batch's prefill
(`BatchScheduler.admit`), every sequence of the batch counted (`BatchRun.tokens_per_s`).

The cost model, fitted to batch size (`LoadModel`): per batch size the round time is a line in
the drafts verified per row D (a chain's K, a tree's num_draft_tokens - 1) through the measured
K = 1 and K = depth chain runs (today's two-probe calibration, with the target's forward folded
into the line: a batched verify of B x (D + 1) tokens grows about linearly in D), round_s(B, D)
= a(B) + b(B) D, and plain decoding's round plain_s(B); then a, b and plain_s are each fitted
as a line in B by least squares over the measured batch sizes (constant with one). Predicted
tokens/s = B tau / round_s(B, D): a chain's tau(K) = 1 + sum_{j<=K} p_j from the deep chain's
acceptance at that B (T = 0: a chain's first K drafts do not depend on its depth), a tree's
tau its own run's (the chains' acceptance does not give it) and its round a chain's of as many
verified drafts (its drafting, num_steps steps topk wide, may cost less: its measurement
decides); plain = B / plain_s(B). The schedule and its files: `load_schedule`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from specdraft.bench.speedup import speedup_text, timed_passes, timing_summary
from specdraft.bench.tune_bench import WARMUP_TOKENS, Bench, synchronize
from specdraft.bench.tune_model import Candidate, TuneConfig, spec_text, tree_tokens
from specdraft.bench.tune_report import settle
from specdraft.engine.batch import BatchScheduler
from specdraft.engine.requests import SpecMetrics
from specdraft.engine.sampling import SamplingParams
from specdraft.engine.schedule import BatchSchedule
from specdraft.engine.spec_config import SpecConfig
from specdraft.train.progress import counted_progress


@dataclass
class BatchRun:
    """One batch of `batch_size` prompts run at the setting spec (None: plain decoding): tokens
    after each sequence's first, decode wall seconds, rounds by running batch size (the batch
    shrinks as sequences finish), the sequences' merged metrics."""

    batch_size: int
    spec: SpecConfig | None
    tokens: int
    seconds: float
    rounds_by_batch: dict[int, int]
    metrics: SpecMetrics

    @property
    def tokens_per_s(self) -> float:
        """Decode tokens/s of the whole batch."""
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def round_s(self) -> float:
        """Mean seconds of a batched round."""
        return self.seconds / max(1, sum(self.rounds_by_batch.values()))


class LoadBench(Bench):
    """`Bench` that runs B prompts at once through a `BatchScheduler` (T = 0, no EOS); graphs:
    its verify forwards as CUDA graphs (`BatchScheduler`'s graphs); rows: the cache rows of
    every scheduler when more than B (one row count for every B: a compiled target then
    compiles no new shapes per B, its cache being a static-shaped buffer)."""

    graphs = False
    rows = 0

    def run_batch(
        self, batch_size: int, spec: SpecConfig | None, schedule: BatchSchedule | None = None
    ) -> BatchRun:
        """B = batch_size prompts (cycled from the prompts) at the setting spec (None: plain
        decoding), after a warm-up batch of a few tokens on the same scheduler. schedule: the
        setting by batch size instead (covering the scheduler's rows, at most spec's depth, spec
        then the drafter's engine's setting), run even where it says K = 0 (`batch.CatchUp`
        rounds, as `serve --spec-schedule` runs them); the run records spec as given."""
        engine = self.engine(spec)
        rows = max(self.rows, batch_size)
        schedule = schedule or BatchSchedule.constant(spec.num_steps if spec else 0, rows)
        scheduler = BatchScheduler(engine, rows, schedule, graphs=self.graphs)
        self.batch_of(scheduler, batch_size, min(WARMUP_TOKENS, self.cfg.max_new_tokens))
        scheduler.run()
        scheduler.stats = {}
        self.batch_of(scheduler, batch_size, self.cfg.max_new_tokens)
        with torch.inference_mode():
            scheduler.admit()
        synchronize(self.device)
        start = time.perf_counter()
        results = scheduler.run()
        synchronize(self.device)
        seconds = time.perf_counter() - start
        total = SpecMetrics()
        for _, result in results:
            total = total.merge(result.metrics)
        rounds = {b: s.num_rounds for b, s in scheduler.stats.items()}
        tokens = sum(len(result.token_ids) - 1 for _, result in results)
        return BatchRun(batch_size, spec, tokens, seconds, rounds, total)

    def batch_of(self, scheduler: BatchScheduler, batch_size: int, max_new_tokens: int) -> None:
        """Queue batch_size greedy requests of max_new_tokens each on scheduler."""
        engine = scheduler.engine
        for i in range(batch_size):
            prompt = self.prompts[i % len(self.prompts)]
            scheduler.add(
                engine.new_request(prompt, max_new_tokens, SamplingParams(), (), None, None, None)
            )


@dataclass
class Level:
    """One batch size: plain decoding's runs, each setting's runs and its `Candidate`
    (prediction and measurement), the setting chosen (None: no speculation at this size)."""

    batch_size: int
    plain_runs: list[BatchRun]
    runs: dict[SpecConfig, list[BatchRun]]
    candidates: dict[SpecConfig, Candidate] = field(default_factory=dict)
    plain_predicted_tps: float = 0.0
    chosen: SpecConfig | None = None

    @property
    def chosen_k(self) -> int:
        """The chosen setting's depth K (0: no speculation)."""
        return self.chosen.num_steps if self.chosen else 0

    @property
    def plain_tps(self) -> float:
        """Median tokens/s of batched plain decoding."""
        return median_run(self.plain_runs).tokens_per_s


def median_run(runs: Sequence[BatchRun]) -> BatchRun:
    """The run of median tokens/s (the lower middle one of an even count)."""
    return sorted(runs, key=lambda r: r.tokens_per_s)[(len(runs) - 1) // 2]


def load_settings(cfg: TuneConfig) -> list[SpecConfig]:
    """The settings tried at every batch size: chains K = 1..cfg.depth, then per topk > 1 of
    `TuneConfig.all_topks` the tree of that depth verifying at most max_tree_tokens nodes
    (`tune_model.tree_tokens`), and the current setting when it is another tree."""
    settings = [SpecConfig.chain(k) for k in range(1, cfg.depth + 1)]
    for topk in cfg.all_topks:
        if topk > 1:
            nodes = tree_tokens(cfg.depth, topk, cfg.max_tree_tokens)
            settings.append(SpecConfig(cfg.depth, topk, nodes))
    if cfg.current is not None and cfg.current.topk > 1:
        settings.append(cfg.current)
    return list(dict.fromkeys(settings))


def measure_level(
    bench: LoadBench,
    batch_size: int,
    settings: Sequence[SpecConfig],
    repeats: int,
    advance: Callable[[], None],
) -> Level:
    """Plain decoding and every setting at batch_size, each once per round in `repeats`
    rounds, order rotated (`speedup.timed_passes`); each setting's `Candidate` gets its timing
    summary."""

    def run(spec: SpecConfig | None) -> BatchRun:
        measured = bench.run_batch(batch_size, spec)
        advance()
        return measured

    runs = timed_passes(dict.fromkeys([None, *settings]), repeats, run)
    level = Level(batch_size, runs.pop(None), runs)
    plain_tps = [r.tokens_per_s for r in level.plain_runs]
    for spec, spec_runs in runs.items():
        timing = timing_summary([r.tokens_per_s for r in spec_runs], plain_tps)
        cand = Candidate(spec, 0.0, 0.0, timing=timing)
        cand.measured_tau = median_run(spec_runs).metrics.accept_length
        cand.measured_tps, cand.speedup = timing["tokens_per_s"], timing["speedup"]
        level.candidates[spec] = cand
    return level


def setting_label(spec: SpecConfig | None) -> str:
    """'K n' for a chain, 'tree (steps n, topk k, draft tokens m)', 'K 0' for none."""
    if spec is None or spec.is_chain:
        return f"K {spec.num_steps if spec else 0}"
    return f"tree ({spec_text(spec)})"


def line_fit(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """(intercept, slope) of the least-squares line through (xs, ys); slope 0 for one distinct x."""
    n, mx, my = len(xs), sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if n > 1 and sxx else 0.0
    return my - slope * mx, slope


@dataclass(frozen=True)
class LoadModel:
    """round_s(B, D) = a(B) + b(B) D (D: drafts verified per row), plain_s(B), each (intercept,
    slope) of a line in B (module docstring); seconds."""

    a: tuple[float, float]
    b: tuple[float, float]
    plain: tuple[float, float]

    @classmethod
    def fit(cls, levels: Sequence[Level], depth: int) -> LoadModel:
        """The lines through each level's median K = 1 and K = depth runs and plain run."""
        sizes, a_s, b_s = [], [], []
        for level in levels:
            shallow = median_run(level.runs[SpecConfig.chain(1)]).round_s
            deep = median_run(level.runs[SpecConfig.chain(depth)]).round_s
            slope = (deep - shallow) / (depth - 1) if depth > 1 else 0.0
            sizes.append(level.batch_size)
            a_s.append(shallow - slope)
            b_s.append(slope)
        plain = [median_run(level.plain_runs).round_s for level in levels]
        return cls(line_fit(sizes, a_s), line_fit(sizes, b_s), line_fit(sizes, plain))

    def round_s(self, batch_size: int, num_drafts: int) -> float:
        """Predicted seconds of a round of B sequences verifying num_drafts drafts per row (0:
        a plain round)."""
        if num_drafts == 0:
            return at(self.plain, batch_size)
        return at(self.a, batch_size) + at(self.b, batch_size) * num_drafts

    def predict(self, level: Level, spec: SpecConfig, depth: int) -> tuple[float, float]:
        """(tau, tokens/s) predicted at the level's batch size for spec (a tree's tau: its run's)."""
        if spec.is_chain:
            p = median_run(level.runs[SpecConfig.chain(depth)]).metrics.acceptance_per_position
            tau = 1.0 + sum(p[: spec.num_steps])
        else:
            tau = median_run(level.runs[spec]).metrics.accept_length
        seconds = self.round_s(level.batch_size, spec.num_draft_tokens - 1)
        return tau, level.batch_size * tau / seconds if seconds > 0 else 0.0


def at(line: tuple[float, float], x: float) -> float:
    """A line's (intercept, slope) value at x."""
    return line[0] + line[1] * x


def tune_load(
    bench: LoadBench,
    concurrency: Sequence[int],
    min_speedup: float,
    say: Callable[[str], None] = lambda text: None,
) -> tuple[list[Level], LoadModel]:
    """Measure every batch size of `concurrency` (`measure_level` over `load_settings`), then
    fit the `LoadModel` and choose each level's setting (`fit_levels`)."""
    depth, repeats, sizes = bench.cfg.depth, bench.cfg.repeats, sorted(set(concurrency))
    settings, levels = load_settings(bench.cfg), []
    total = len(sizes) * (len(settings) + 1) * repeats
    with counted_progress("tune load runs", total) as advance:
        for size in sizes:
            levels.append(measure_level(bench, size, settings, repeats, advance))
            say(f"batch {size}: plain {levels[-1].plain_tps:.1f} tok/s")
    model = fit_levels(levels, depth, min_speedup)
    for level in levels:
        best = max(level.candidates.values(), key=lambda c: c.speedup or 0.0)
        say(
            f"batch {level.batch_size}: {setting_label(level.chosen)} "
            f"(best {setting_label(best.spec)}: {speedup_text(best.timing)})"
        )
    return levels, model


def fit_levels(levels: Sequence[Level], depth: int, min_speedup: float) -> LoadModel:
    """Fit the `LoadModel` to the measured levels (K = 1..depth each), fill each candidate's
    prediction and each level's predicted plain tokens/s, and choose each level's setting (demo's
    rule, `settle`; None when none beats batched plain decoding beyond the noise)."""
    model = LoadModel.fit(levels, depth)
    for level in levels:
        level.plain_predicted_tps = level.batch_size / max(
            model.round_s(level.batch_size, 0), 1e-12
        )
        for spec, cand in level.candidates.items():
            cand.predicted_tau, cand.predicted_tps = model.predict(level, spec, depth)
        chosen = settle(level.candidates.values(), min_speedup)[0]
        level.chosen = chosen.spec if chosen else None
    return model
