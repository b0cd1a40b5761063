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
Costs, on this machine and engine (`tune_bench.Bench`): t_verify(T) = median time of one target forward
over T tokens after a prefix, timed directly for every T a candidate needs; t_draft(k) and
t_round(k) = slope and intercept of a round's time beyond t_verify against its steps, through
the deep probe and a 1-step probe of the same topk (`tune_model.calibrate`: a round's fixed
drafting cost is not spread over the deep probe's steps); t_plain likewise from the plain run.
Speeds are `speedup.DECODE_TOKENS_PER_S`: tokens after each request's first / time after its
prefill.
The `num_measure` best predictions, the best chain and the current setting are run for real,
each once per round with plain decoding in `repeats` rounds (order rotated each round), and
recommended by the rule `specdraft demo` uses (`specdraft.bench.speedup`): a median same-round
speedup of at least `min_speedup` with a lower quartile above 1x; of the settings tied within
the noise of the fastest, the one with the fewest draft tokens; else no speculation. vLLM
drafts chains: its recommendation is picked among the chains.
The launch flags name the drafter directory when an engine can load it as it is (an export);
for specdraft's training layout they name its export already on disk (the demo's, say:
`export.existing_export`), else the output of the `specdraft export` command shown.
The settings and costs: `tune_model`; the report: `tune_report.TuneReport`, as text
`tune_render.render`.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from specdraft.bench.speedup import speedup_text, timed_passes, timing_summary
from specdraft.bench.tune_bench import Bench
from specdraft.bench.tune_model import (
    Candidate,
    Costs,
    Measured,
    TuneConfig,
    calibrate,
    predict,
    spec_text,
    tree_tokens,
)
from specdraft.bench.tune_report import TuneReport, settle
from specdraft.dflash import drafter_label
from specdraft.draft import Eagle3Draft
from specdraft.engine.fast_model import FastTarget
from specdraft.engine.spec_config import SpecConfig
from specdraft.machine_load import busy_note
from specdraft.train.progress import counted_progress, status_while


def tune(
    target: FastTarget,
    draft: Eagle3Draft,
    prompts: Sequence[Sequence[int]],
    cfg: TuneConfig,
    draft_path: str = "DRAFT",
    progress: Callable[[str], None] | None = None,
    bench: Bench | None = None,
) -> TuneReport:
    """Probe acceptance, time the engine, predict every candidate, measure the best, recommend;
    `progress` gets the drafter's method first (`dflash.drafter_label`).

    prompts: target token ids. bench: what runs and times the settings (default: a `Bench` of
    target, draft, prompts and cfg; a subclass with given timings checks the logic on them).
    Raises BenchInputError (a ValueError) when prompts + tokens exceed the target's positions,
    or (from the engine) ValueError when the drafter does not fit the target."""
    say = progress or (lambda text: None)
    say(f"drafter {draft_path}: {drafter_label(draft.cfg)}")
    bench = bench or Bench(target, draft, prompts, cfg)
    busy = busy_note("the tokens/s above") if bench.device.type == "cpu" else None
    probe_specs, specs = settings_to_try(cfg)
    sizes = [1] + [s.num_draft_tokens for s in specs + list(probe_specs.values())]
    with counted_progress("tune forward timings", len(set(sizes))) as advance:
        costs = Costs(bench.time_verify(sizes, advance))
    probes = run_probes(bench, probe_specs, costs, say)
    candidates = {s: Candidate(s, *predict(s, probes[s.topk], costs)) for s in specs}
    ranked = sorted(candidates.values(), key=lambda c: -c.predicted_tps)
    chains = [c for c in ranked if c.spec.is_chain]
    to_measure = {c.spec: c for c in ranked[: cfg.num_measure] + chains[:1]}
    if cfg.current:
        to_measure[cfg.current] = candidates[cfg.current]
    plain_tps = measure(bench, to_measure, costs, cfg, say)
    report = TuneReport(
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
    report.busy = busy
    return report


def settings_to_try(cfg: TuneConfig) -> tuple[dict[int, SpecConfig], list[SpecConfig]]:
    """The deep acceptance probe of each topk, and the candidates: every depth 1..cfg.depth of
    each topk (trees capped at cfg.max_tree_tokens), then the current setting."""
    probe_specs = {
        k: SpecConfig(cfg.depth, k, tree_tokens(cfg.depth, k, cfg.max_tree_tokens))
        for k in cfg.all_topks
    }
    specs = [
        SpecConfig(n, k, tree_tokens(n, k, cfg.max_tree_tokens))
        for k in cfg.all_topks
        for n in range(1, cfg.depth + 1)
    ]
    return probe_specs, specs + ([cfg.current] if cfg.current else [])


def run_probes(
    bench: Bench, probe_specs: dict[int, SpecConfig], costs: Costs, say: Callable[[str], None]
) -> dict[int, Measured]:
    """Run each topk's acceptance probe (`TuneConfig.depth` steps) and a 1-step one of the same
    topk, and calibrate `costs` on the two (`tune_model.calibrate`); the deep probes by topk.
    The runs done and the time left are shown meanwhile (`train.progress.counted_progress`)."""
    probes, total = {}, sum(1 + (spec.num_steps > 1) for spec in probe_specs.values())
    with counted_progress("tune probe runs", total) as advance:
        for k, spec in probe_specs.items():
            probes[k], shallow = bench.run(spec), None
            advance()
            if spec.num_steps > 1:
                one_step = SpecConfig(1, k, tree_tokens(1, k, bench.cfg.max_tree_tokens))
                shallow = bench.run(one_step)
                advance()
            calibrate(costs, probes[k], shallow)
            say(
                f"probe topk {k}, {spec.num_steps} steps: tau {probes[k].metrics.accept_length:.3f}"
            )
    return probes


def measure(
    bench: Bench,
    to_measure: dict[SpecConfig, Candidate],
    costs: Costs,
    cfg: TuneConfig,
    say: Callable[[str], None],
) -> list[float]:
    """Run the candidates `to_measure` for real, each once per round with plain decoding in
    `cfg.repeats` rounds (`speedup.timed_passes`), filling their measurement and `costs.t_plain`
    (from the median plain run), showing the runs done and the time left; plain decoding's
    tokens/s of every round."""
    names = dict.fromkeys([None, *to_measure])
    with counted_progress("tune timing runs", len(names) * cfg.repeats) as advance:

        def run(spec: SpecConfig | None) -> Measured:
            measured = bench.run(spec)
            advance()
            return measured

        runs = timed_passes(names, cfg.repeats, run)
    plain_tps = [run.tokens_per_s for run in runs[None]]
    plain = sorted(runs[None], key=lambda run: run.tokens_per_s)[(len(plain_tps) - 1) // 2]
    costs.t_plain = max(
        0.0,
        (plain.metrics.time_total_s - plain.metrics.time_prefill_s) / plain.rounds
        - costs.t_verify[1],
    )
    rounds = f"{cfg.repeats} round{'s' * (cfg.repeats != 1)}"
    say(f"plain decoding: median {statistics.median(plain_tps):.1f} tok/s over {rounds}")
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
    return plain_tps


@dataclass(frozen=True)
class TunedPair:
    """The target directory (with its tokenizer) and the drafter `tune` measures, as given to
    `tune_paths` / `tune_suite.tune_suite_paths`, and the device and dtype they run in."""

    target_dir: str | Path
    draft_dir: str | Path
    device: str = "cpu"
    dtype: torch.dtype = torch.float32

    def load(self, cfg: TuneConfig):
        """(tokenizer, engine) of the pair (`load_tuned`, which names the errors)."""
        return load_tuned(self.target_dir, self.draft_dir, cfg, self.device, self.dtype)


def tune_paths(
    pair: TunedPair, prompts: str, cfg: TuneConfig, progress: Callable[[str], None] | None = None
) -> TuneReport:
    """`tune` for a target and drafter on disk and a prompt source (`prompts.load_prompts`)."""
    from specdraft.bench.prompts import load_prompts
    from specdraft.data.render import prompt_ids

    tokenizer, engine = pair.load(cfg)
    ids = [prompt_ids(tokenizer, p) for p in load_prompts(prompts)]
    report = tune(engine.target, engine.draft, ids, cfg, str(pair.draft_dir), progress)
    report.target_path, report.prompt_set = str(pair.target_dir), prompts
    return report


def load_tuned(
    target_dir: str | Path,
    draft_dir: str | Path,
    cfg: TuneConfig,
    device="cpu",
    dtype=torch.float32,
):
    """(tokenizer, engine) of a target directory and a draft checkpoint, for `tune`. A corrupt
    or incomplete target config.json is a ValueError naming the file and the fix (doctor's words),
    a tokenizer that does not load a `targets.tokenizer.TargetTokenizerError` naming the directory."""
    from specdraft.doctor.inputs import given_config
    from specdraft.engine.load import load_engine
    from specdraft.serve.server import target_tokenizer
    from specdraft.targets.config import TARGET_CONFIG_FIX, check_target_config

    config = given_config(Path(target_dir), TARGET_CONFIG_FIX)
    if config is not None:  # no config.json: left to the loader
        check_target_config(target_dir, config)
    with status_while(f"tune: loading the target {target_dir} and the drafter {draft_dir}"):
        tokenizer = target_tokenizer(target_dir)
        engine = load_engine(target_dir, draft_dir, SpecConfig.chain(cfg.depth), device, dtype)
    return tokenizer, engine
