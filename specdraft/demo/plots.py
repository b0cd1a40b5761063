"""The demo's figures (`write_plots`): the per-position acceptance of the recommended setting, and
tau and speedup against num_steps, where speedup is what the verdict uses (the median of same-round
ratios to plain decoding, `bench.speedup.timing_summary`) with quartile bars, the tree and the
recommended setting marked. `plot_data` is what they draw."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specdraft.demo.report import DemoReport
from specdraft.demo.verdict import setting_text

Bars = tuple[list[float], list[float]]  # below and above the median: median - q1, q3 - median


@dataclass(frozen=True)
class Point:
    """One setting's speedup at its num_steps: median, quartile bars, legend label."""

    num_steps: int
    speedup: float
    bars: Bars
    label: str


@dataclass(frozen=True)
class PlotData:
    """What the demo's plots draw. acceptance: p_k of `acceptance_of` (the recommended setting,
    else the fastest); steps / tau / speedup / bars: the chain sweep; tree: the tree setting;
    recommended: the recommended setting's point, None when none is."""

    acceptance_of: str
    acceptance: list[float]
    steps: list[int]
    tau: list[float]
    speedup: list[float]
    bars: Bars
    tree: Point
    recommended: Point | None


def quartile_bars(rows: list[dict[str, Any]]) -> Bars:
    """The quartile bars of `rows` (timing_summary's keys) around their median speedups."""
    return (
        [r["speedup"] - r["speedup_q1"] for r in rows],
        [r["speedup_q3"] - r["speedup"] for r in rows],
    )


def point(row: dict[str, Any], label: str) -> Point:
    """A setting's speedup point."""
    return Point(row["num_steps"], row["speedup"], quartile_bars([row]), label)


def plot_data(report: DemoReport) -> PlotData:
    """The series of the demo's plots from its measurements (`PlotData`)."""
    rows = [*report.sweep, report.tree]
    shown = report.chosen or max(rows, key=lambda r: r["speedup"])
    which = "recommended" if report.chosen else "fastest; none recommended"
    tree = report.tree
    return PlotData(
        f"{which}: {setting_text(shown)}",
        list(shown["acceptance"]),
        [r["num_steps"] for r in report.sweep],
        [r["accept_length"] for r in report.sweep],
        [r["speedup"] for r in report.sweep],
        quartile_bars(report.sweep),
        point(tree, f"tree (topk {tree['topk']}, {tree['num_draft_tokens']} draft tokens)"),
        point(report.chosen, f"recommended: {setting_text(report.chosen)}")
        if report.chosen
        else None,
    )


def write_plots(report: DemoReport, out: Path) -> list[str]:
    """acceptance.png and throughput.png (`plot_data`) under out; their names."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = plot_data(report)
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.bar(range(1, len(data.acceptance) + 1), data.acceptance, color="tab:blue")
    positions = range(1, len(data.acceptance) + 1)
    ax.set_xticks(list(positions))  # whole positions (matplotlib would tick 0.75, 1.25, ...)
    ax.set(xlabel="draft position k", ylabel="acceptance p_k (share of rounds reaching k)")
    ax.set_ylim(0, 1)
    ax.set_title(f"per-position acceptance\n({data.acceptance_of})", fontsize=9)
    fig.tight_layout()
    fig.savefig(out / "acceptance.png", dpi=120)
    plt.close(fig)

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.plot(data.steps, data.tau, "o-")
    left.set(xlabel="num_steps (chain)", ylabel="accept length tau", title="tau vs num_steps")
    speedup_axes(right, data)
    fig.tight_layout()
    fig.savefig(out / "throughput.png", dpi=120)
    plt.close(fig)
    return ["acceptance.png", "throughput.png"]


def speedup_axes(ax: Any, data: PlotData) -> None:
    """The speedup panel: the chains with quartile bars, the tree, the recommended setting ringed,
    plain decoding at 1x; the axis from 0 (a cut axis would exaggerate the speedup)."""
    ax.errorbar(data.steps, data.speedup, yerr=data.bars, fmt="o-", capsize=3, label="chain")
    tree = data.tree
    ax.errorbar(
        [tree.num_steps], [tree.speedup], yerr=tree.bars, fmt="s", capsize=3, label=tree.label
    )
    if data.recommended:
        rec = data.recommended
        ax.plot([rec.num_steps], [rec.speedup], "o", ms=14, mfc="none", mec="red", label=rec.label)
    ax.axhline(1.0, color="gray", ls="--", label="no speculation")
    ax.set(
        xlabel="num_steps",
        ylabel="speedup over plain decoding",
        title="speedup: median of same-round ratios (quartile bars)",
    )
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=7)
