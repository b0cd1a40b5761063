"""A benchmark report on disk: bench.json, bench.md and the plots (throughput.png, tpot.png,
speedup.png with a baseline), each written atomically (`specdraft.files`).

bench.json is `BenchReport.to_dict()`: the config; per server its levels (`LevelResult`: tokens
per second as the mean over runs with `tokens_per_s_std` and `tokens_per_s_runs`, TTFT / TPOT
stats, the speculative counts, `num_errors`, `no_spec_signal`); `speedups` (per level the ratio
of means, `speedup_std`, `verdict`: null with one run, "invalid: N errors" with failed requests,
whose `speedup` / `speedup_std` / `noise` are then null and `valid` false); the crossover; the
warnings (null when they do not apply); and `partial`, `interrupted_at_concurrency`,
`concurrency_not_measured` for an interrupted sweep (complete: false, null, []).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specdraft.bench.comparison import BenchReport
from specdraft.bench.config import BenchInputError
from specdraft.bench.levels import LevelResult, ServerRun, tps_cell
from specdraft.bench.stats import NO_BASELINE, SpeedupPoint, noise_note, verdict
from specdraft.files import atomic_write, atomic_write_text

OTHER_NUMBERS = (
    "Why these numbers differ from `specdraft tune`'s and the demo's: bench times servers "
    "over HTTP (request handling, streaming, scheduling) with requests in flight at once on "
    "the prompts above, while tune and the demo time specdraft's engine in one process, one "
    "request at a time, so compare speedups of one setting on one prompt set."
)


def fmt(value: float | None, scale: float = 1.0, digits: int = 1) -> str:
    """A number for the markdown tables ("-" for None)."""
    return "-" if value is None else f"{value * scale:.{digits}f}"


def spec_cell(level: LevelResult) -> tuple[str, str]:
    """(tau with its M1 check, p_k) cells of a level."""
    s = level.spec
    if s is None:
        return "-", "-"
    tau = f"{s.accept_length:.3f}"
    if s.tau_from_positions is not None:
        agree = abs(s.tau_from_positions - s.accept_length) <= 1e-6 * s.accept_length
        tau += f" (1 + sum of p_k = {s.tau_from_positions:.3f}: {'counters agree' if agree else 'counters DISAGREE'})"
    p = s.acceptance_per_position
    return tau, " ".join(f"{x:.2f}" for x in p) if p is not None else "not exposed"


def markdown(report: BenchReport) -> str:
    """The report as markdown: one table per server, then speedups and the crossover."""
    cfg = report.config
    settings = (
        f"{cfg.repeats} run{'s' * (cfg.repeats != 1)} of {cfg.num_prompts} "
        f"request{'s' * (cfg.num_prompts != 1)} per level (after {cfg.warmup} warm-up "
        f"request{'s' if cfg.warmup != 1 else ''} per server), max_tokens {cfg.max_tokens}, "
        f"temperature {cfg.temperature}, ignore_eos {cfg.ignore_eos}, prompts {cfg.prompts}"
    )
    lines = [report.partial_note, ""] if report.partial else []
    lines += ["# specdraft bench", "", settings, "", OTHER_NUMBERS, ""]
    for warning in (report.failed_requests_warning, report.speculation_warning):
        lines += [warning, ""] if warning else []
    for title, run in (("speculative", report.spec), ("baseline", report.baseline)):
        if run is not None:
            lines += server_table(title, run)
    lines += ["## speedup (tokens/s with speculation / baseline, same prompts)", ""]
    if report.baseline_warning:
        lines += [report.baseline_warning, ""]
    if report.speedups is None:
        lines += [NO_BASELINE, ""]  # the crossover says nothing more
    else:
        lines += speedup_table(report)
    return "\n".join(lines)


def server_table(title: str, run: ServerRun) -> list[str]:
    """The markdown lines of one server's levels: tokens/s, TTFT, TPOT, tau, p_k, errors."""
    lines = [
        f"## {title}: {run.url} ({run.kind}, model {run.model})",
        "",
        "| concurrency | tok/s mean ± sd (min-max) | TTFT ms mean / p50 / p99 | TPOT ms mean / p50 / p99 "
        "| tau | p_k | errors |",
        "|---|---|---|---|---|---|---|",
    ]
    for lv in run.levels:
        tau, p = spec_cell(lv)
        ttft = " / ".join(fmt(v, 1e3) for v in (lv.ttft_s.mean, lv.ttft_s.p50, lv.ttft_s.p99))
        tpot = " / ".join(fmt(v, 1e3, 2) for v in (lv.tpot_s.mean, lv.tpot_s.p50, lv.tpot_s.p99))
        lines.append(
            f"| {lv.concurrency} | {tps_cell(lv)} | {ttft} | {tpot} | {tau} | {p} | {lv.num_errors} |"
        )
    return [*lines, ""]


def speedup_table(report: BenchReport) -> list[str]:
    """The markdown lines of the speedups (a baseline was measured), the noise note and the
    crossover."""
    lines = [
        "| concurrency | speedup (ratio of means) | sd | verdict | run-to-run noise |",
        "|---|---|---|---|---|",
    ]
    judged = (
        report.has_verdicts
    )  # one run: no sd, no verdict ("-"), no spread to call steady or noisy
    lines += [speedup_row(p, judged, report.config.tie_band) for p in report.speedups]
    note = noise_note([p for p in report.speedups if not p.num_errors])
    lines += ["", note] if note else []
    return [*lines, "", report.crossover.text, ""]


def speedup_row(point: SpeedupPoint, judged: bool, tie_band: float) -> str:
    """One row of the speedup table; a level with failed requests shows no number, only
    "invalid: N errors" (its tokens/s count the successful requests alone)."""
    if point.num_errors:
        return f"| {point.concurrency} | invalid: {point.num_errors} errors | - | - | - |"
    return (
        f"| {point.concurrency} | {point.speedup:.2f}x | {f'{point.speedup_std:.2f}' if judged else '-'} | "
        f"{verdict(point, tie_band) if judged else '-'} | {noise_cell(point, judged)} |"
    )


def noise_cell(point: SpeedupPoint, judged: bool) -> str:
    """The run-to-run noise cell of a speedup row: "noisy: verdict inconclusive" when either
    server's runs spread more than NOISY_SPREAD of their mean, "steady" when both are within it,
    "one run: no spread" without repeats (nothing to judge)."""
    if point.noise:
        return "noisy: verdict inconclusive"
    return "steady" if judged else "one run: no spread"


Series = tuple[list[int], list[float], list[float] | None]  # concurrencies, values, sd or None


@dataclass(frozen=True)
class Plot:
    """One bench figure as drawn: its title, y label, per server (or "speedup") the points, whose
    sd is None where it has no error bars (one run per level, TPOT's p50), whether the y axis
    starts at 0 (tokens/s, TPOT: a cut axis would exaggerate a difference), and a dashed reference
    line (y, legend label) or None."""

    title: str
    ylabel: str
    lines: dict[str, Series]
    from_zero: bool = True
    reference: tuple[float, str] | None = None


def plot_data(report: BenchReport) -> dict[str, Plot]:
    """What throughput.png, tpot.png and (with a valid speedup) speedup.png draw. A level with
    failed requests is left out: its tokens/s and TPOT count the successful requests alone,
    which ran with fewer requests in flight than the level names (invalid, `tps_cell`)."""
    bars = report.config.repeats > 1  # one run: no spread to draw
    runs = [(t, r) for t, r in (("speculative", report.spec), ("baseline", report.baseline)) if r]

    def lines(value: Any, sd: Any) -> dict[str, Series]:
        valid = {title: [lv for lv in run.levels if not lv.num_errors] for title, run in runs}
        return {
            title: (
                [lv.concurrency for lv in levels],
                [value(lv) for lv in levels],
                [sd(lv) for lv in levels] if sd else None,
            )
            for title, levels in valid.items()
        }

    data = {
        "throughput.png": Plot(
            "output throughput vs concurrency",
            "output tokens/s" + (" (mean ± sd)" if bars else ""),
            lines(lambda lv: lv.tokens_per_s, (lambda lv: lv.tokens_per_s_std) if bars else None),
        ),
        "tpot.png": Plot(
            "time per output token vs concurrency",
            "TPOT p50 (ms)",
            lines(lambda lv: (lv.tpot_s.p50 or 0.0) * 1e3, None),
        ),
    }
    points = [p for p in report.speedups or [] if not p.num_errors]  # invalid: not drawn
    if points:
        data["speedup.png"] = Plot(
            "speedup over the baseline vs concurrency",
            "speedup (x)" + (" (± sd)" if bars else ""),
            {
                "speedup": (
                    [p.concurrency for p in points],
                    [p.speedup for p in points],
                    [p.speedup_std for p in points] if bars else None,
                )
            },
            from_zero=False,
            reference=(1.0, "no speculation"),
        )
    return data


def plot(report: BenchReport, out_dir: Path) -> list[Path]:
    """The figures of `plot_data` against concurrency, as PNG files in out_dir."""
    from matplotlib.figure import Figure

    runs = [report.spec, report.baseline]
    ticks = sorted({lv.concurrency for run in runs if run is not None for lv in run.levels})
    paths = []
    for name, spec in plot_data(report).items():
        fig = Figure(figsize=(5, 3.5))
        ax = fig.add_subplot()
        for title, (x, y, err) in spec.lines.items():
            if x and err is None:
                ax.plot(x, y, "o-", label=title)
            elif x:
                ax.errorbar(x, y, yerr=err, fmt="o-", capsize=3, label=title)
        if spec.reference:
            ax.axhline(spec.reference[0], color="gray", linestyle="--", label=spec.reference[1])
        if spec.from_zero:
            ax.set_ylim(bottom=0)
        ax.set_title(spec.title)
        paths.append(save_figure(fig, ax, spec.ylabel, out_dir / name, ticks))
    return paths


def save_figure(fig: Any, ax: Any, ylabel: str, path: Path, ticks: list[int]) -> Path:
    """Label, log-x with the measured concurrencies `ticks`, legend, save atomically."""
    ax.set_xscale("log", base=2)
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.minorticks_off()
    ax.set_xlabel("concurrency")
    ax.set_ylabel(ylabel)
    if ax.get_legend_handles_labels()[0]:  # a figure with every point left out has nothing to name
        ax.legend()
    fig.tight_layout()
    return atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=100, format="png"))


def refuse_file_out(out_dir: str | Path, option: str = "out_dir") -> None:
    """BenchInputError (a ValueError) when `out_dir` is an existing file (`write_report` needs a
    directory there): call it before a sweep, not after."""
    if Path(out_dir).exists() and not Path(out_dir).is_dir():
        raise BenchInputError(f"{option} {out_dir} is a file; give a directory")


def make_out_dir(out_dir: str | Path) -> Path:
    """`out_dir` made (with its parents) for a report; BenchInputError naming it when the OS
    refuses (no permission, a parent that is a file)."""
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise BenchInputError(
            f"{out}: cannot create the report directory ({e.strerror or e}); give --out a "
            "directory you can write"
        ) from None
    return out


def write_report(report: BenchReport, out_dir: str | Path) -> list[Path]:
    """bench.json, bench.md and the plots in out_dir (created; each file written atomically; a
    partial report, `partial_report`, the same way, marked as such in both)."""
    out = make_out_dir(out_dir)
    paths = []
    for name, text in (
        ("bench.json", json.dumps(report.to_dict(), indent=2)),
        ("bench.md", markdown(report)),
    ):
        paths.append(atomic_write_text(out / name, text))
    return paths + plot(report, out)
