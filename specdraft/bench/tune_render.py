"""`specdraft tune`'s report as text (`tune.TuneReport`): the probes, the costs, the model, the
candidates and the recommendation with the engine flags."""

from __future__ import annotations

from pathlib import Path

from specdraft.bench.speedup import DECODE_TOKENS_PER_S, WALL_TOKENS_PER_S, speedup_text
from specdraft.bench.tune_model import Candidate, spec_text
from specdraft.bench.tune_report import TuneReport
from specdraft.checkpoint import describe_layout, detect_layout, has_manifest

PREDICTION_WARN_FACTOR = 2.0  # predicted vs measured tokens/s beyond which render warns
OTHER_NUMBERS = (
    "why these numbers differ from bench's and the demo's: tune times specdraft's engine in this "
    f"process, one request at a time ({DECODE_TOKENS_PER_S}), while `specdraft bench` adds a "
    "server's HTTP and scheduling overhead and requests in flight at once, and the demo times its "
    f"own held-out prompts ({WALL_TOKENS_PER_S}, so its speedup lies a little closer to 1x; its "
    "report prints the tune line that repeats it), so compare speedups of one setting on one "
    "prompt set"
)


def render(report: TuneReport, max_rows: int = 12) -> str:
    """The report as text: probes (with tau = 1 + sum p_k), costs, model, candidates with
    predicted and measured (median) tokens/s and speedup (quartiles), the current setting and
    the recommendation as flags."""
    cfg = report.config
    lines = [
        f"specdraft tune: {report.num_prompts} prompts ({report.prompt_set}) x "
        f"{cfg.max_new_tokens} new tokens, temperature 0",
        *probe_lines(report),
        *cost_lines(report),
        (
            f"{'setting':<38} {'pred tau':>8} {'pred tok/s':>10} {'meas tau':>8} {'meas tok/s':>10} "
            "speedup (quartiles)"
        ),
    ]
    shown = [
        c for i, c in enumerate(report.candidates) if i < max_rows or c.measured_tps is not None
    ]
    for c in shown:
        lines.append(row(spec_text(c.spec), c))
    if report.current:
        lines.append(row("current: " + spec_text(report.current.spec), report.current))
    if report.prediction_error() > PREDICTION_WARN_FACTOR:
        lines.append(
            f"warning: predictions are off by up to {report.prediction_error():.1f}x from the "
            "measurements (timings taken while the machine was busy?): the recommendation "
            "uses the measured column; re-run on a quiet machine for the predicted one"
        )
    lines += recommendation_lines(report)
    lines += [OTHER_NUMBERS, *([report.busy] if report.busy else [])]
    return "\n".join(lines)


def probe_lines(report: TuneReport) -> list[str]:
    """The acceptance probes: p_k per position and tau = 1 + sum p_k (the M1 check)."""
    lines = ["acceptance probes:"]
    for probe in report.probes.values():
        m = probe.metrics
        p = " ".join(f"{x:.2f}" for x in m.acceptance_per_position)
        lines.append(
            f"  {spec_text(probe.spec)}: p_k = {p}; tau {m.accept_length:.3f} = 1 + sum p_k "
            f"{1 + sum(m.acceptance_per_position):.3f}"
        )
    return lines


def cost_lines(report: TuneReport) -> list[str]:
    """The timed costs (ms), the model, and plain decoding measured against its prediction."""
    cfg, costs = report.config, report.costs

    def ms(d: dict[int, float]) -> str:
        return ", ".join(f"{k}: {v * 1e3:.3f}" for k, v in sorted(d.items()))

    return [
        f"costs (ms): target forward over T tokens {{{ms(costs.t_verify)}}}",
        (
            f"  drafter step per topk {{{ms(costs.t_draft)}}}; round overhead per topk "
            f"{{{ms(costs.t_round)}}}; plain overhead {costs.t_plain * 1e3:.3f}"
        ),
        "model: tokens/s = (1 + sum_{j<=steps} p_j) / (steps * t_draft + t_verify(draft tokens) + overhead)",
        (
            f"plain decoding: measured {report.plain_measured_tps:.1f} tok/s, median of {cfg.repeats} round{'s' * (cfg.repeats != 1)} (the "
            f"model calibrates its overhead on the median run: 1 / (t_verify(1) + overhead) = "
            f"{report.plain_predicted_tps:.1f})"
        ),
    ]


def row(name: str, c: Candidate) -> str:
    """One table row ('-' where not measured)."""
    measured = (
        f"{c.measured_tau:>8.3f} {c.measured_tps:>10.1f} {speedup_text(c.timing)}"
        if c.timing is not None
        else f"{'-':>8} {'-':>10} -"
    )
    return f"{name:<38} {c.predicted_tau:>8.3f} {c.predicted_tps:>10.1f} {measured}"


def recommendation_lines(report: TuneReport) -> list[str]:
    """The verdict (with the rule, and the settings tied within the noise), the engine flags, and
    the `specdraft export` to run first when the drafter is not an export."""
    rec, cfg = report.recommendation, report.config
    rule = (
        f"rule: a median speedup of at least {cfg.min_speedup:.2f}x and a lower quartile above 1x over "
        f"{cfg.repeats} round{'s' * (cfg.repeats != 1)}, each setting timed once per round in turns with plain decoding"
    )
    if rec is None:
        top = max((c for c in report.candidates if c.timing is not None), key=lambda c: c.speedup)
        lines = [
            f"recommendation: no speculation: none beat plain decoding beyond the noise ({rule}); the best "
            f"measured, {spec_text(top.spec)}, reached {speedup_text(top.timing)}"
        ]
    else:
        lines = [
            f"recommendation: {spec_text(rec.spec)}: median {rec.measured_tps:.1f} tok/s measured, speedup "
            f"{speedup_text(rec.timing)} over plain decoding; predicted {rec.predicted_tps:.1f} ({rule})"
        ]
        ties = [c for c in report.ties() if c is not rec]
        if ties:
            lines.append(
                "  chosen among settings tied within the noise (half the fastest one's interquartile range): "
                + "; ".join(f"{spec_text(c.spec)} {speedup_text(c.timing)}" for c in ties)
                + "; the pick has the fewest draft tokens (the same speed for less work)"
            )
    for engine, name in (("sglang", "SGLang"), ("vllm", "vLLM")):
        lines.append(f"  {name}: {report.launch_flags(engine)}")
        lines += export_lines(report, engine, name)
    return lines


def export_lines(report, engine: str, name: str) -> list[str]:
    """What the launch line's drafter directory is, when it is not the drafter given (`report`: a
    `TuneReport` or `load_schedule.LoadReport`, whose existing / export_command / served_path
    name it): the
    drafter's layout as inspect and doctor name it (`checkpoint.describe_layout`), then the
    export on disk it names, or the `specdraft export` that writes it."""
    found, command = report.existing(engine), report.export_command(engine)
    if found is None and command is None:
        return []
    path = Path(report.draft_path)
    what = f"    {path}: {describe_layout(detect_layout(path), has_manifest(path))}; "
    if found is not None:
        return [what + f"the line names its {name} export, already at {found}"]
    return [
        what + f"`specdraft export` checks it against {name}'s rules and writes "
        f"{report.served_path(engine)}: first run {command}"
    ]
