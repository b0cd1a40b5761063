"""`bench --suite`: a suite (`specdraft.bench.suites`) against a server and its baseline, category
by category, at one concurrency.

Each category is measured as a bench level (`levels.level_result`): its questions are sent as
chats (/v1/chat/completions, the server's own chat template), turn by turn: turn k of a question
carries the earlier turns and the speculative server's own answers to them (from its first run),
so a multi-turn question (MT-bench) is asked as a conversation. Every turn runs `repeats` times
on each server, the runs alternating between them (as `sweep.measure_level` does); a category's
tokens/s per run = its tokens over all turns / the seconds of those turns. The speculative
counters are read around the whole category: tau, p_k per category (vLLM / specdraft /metrics;
SGLang reports them only through its native /generate, which a chat does not use). The report:
suite.json (`SuiteReport.to_dict`), suite.md and suite.png (tau and speedup per category).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from specdraft.bench.config import BenchConfig, BenchError
from specdraft.bench.levels import LevelResult, level_result
from specdraft.bench.report import make_out_dir
from specdraft.bench.stats import SpeedupPoint
from specdraft.bench.suites import Question, Suite
from specdraft.bench.sweep import check_chats, wait_for_servers, warm_up
from specdraft.client import RequestRecord, Server, run_requests, scrape
from specdraft.files import atomic_write, atomic_write_text
from specdraft.train.progress import counted_progress


@dataclass
class CategoryResult:
    """One category: its questions, their most turns, each server's level and the speedup
    (None without a baseline, or with failed requests)."""

    category: str
    num_questions: int
    num_turns: int
    spec: LevelResult
    baseline: LevelResult | None
    speedup: SpeedupPoint | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "category": self.category,
            "num_questions": self.num_questions,
            "num_turns": self.num_turns,
            "spec": self.spec.to_dict(),
            "baseline": self.baseline.to_dict() if self.baseline else None,
            "speedup": asdict(self.speedup) if self.speedup else None,
        }


@dataclass
class SuiteReport:
    """A suite run: config, concurrency, the servers (url, kind, model) and one result per category."""

    suite: str
    config: BenchConfig
    concurrency: int
    servers: dict[str, Server]
    categories: list[CategoryResult]

    @property
    def warnings(self) -> list[str]:
        """One line per category with failed requests (its tokens/s and speedup are invalid)."""
        return [
            f"WARNING: {c.category}: {lv.num_errors} of {lv.num_requests} requests failed on {role} "
            f"(first error: {lv.first_error}): its tokens/s and speedup are invalid"
            for c in self.categories
            for role, lv in (("speculative", c.spec), ("baseline", c.baseline))
            if lv is not None and lv.num_errors
        ]

    def to_dict(self) -> dict[str, Any]:
        return {
            "suite": self.suite,
            "config": asdict(self.config),
            "concurrency": self.concurrency,
            "servers": {role: asdict(s) for role, s in self.servers.items()},
            "categories": [c.to_dict() for c in self.categories],
            "warnings": self.warnings,
        }


def run_suite(
    cfg: BenchConfig,
    suite: Suite,
    progress: Callable[[str], None] | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> SuiteReport:
    """Measure every category of `suite` on cfg.url and cfg.baseline_url (if any) at
    cfg.concurrency[0] (module doc). Servers are waited for and warmed up first (`run_bench`'s
    rules); progress is told one line per category. Raises BenchError when every request of a
    category failed on a server."""
    servers = wait_for_servers(cfg, progress)
    try:
        return _measure_suite(cfg, suite, servers, progress, clock)
    except BenchError as e:  # say what a suite needs of the server
        raise BenchError(
            f"{e} (suite {suite.name} sends chat completions, rendered by the server's chat "
            "template: serve a target whose tokenizer has one, or run bench without --suite)"
        ) from None


def _measure_suite(
    cfg: BenchConfig,
    suite: Suite,
    servers: dict[str, Server],
    progress: Callable[[str], None] | None,
    clock: Callable[[], float],
) -> SuiteReport:
    first = [[{"role": "user", "content": q.turns[0]}] for q in suite.questions]
    for server in servers.values():
        check_chats(server, first, cfg)
        warm_up(server, first, cfg)
    concurrency, results = cfg.concurrency[0], []
    count = counted_progress("bench suite (categories)", len(suite.categories), bool(progress))
    with count as advance:
        for category in suite.categories:
            results.append(_measure_category(cfg, suite, category, servers, concurrency, clock))
            advance()
            if progress:
                progress(category_line(results[-1]))
    return SuiteReport(suite.name, cfg, concurrency, servers, results)


def _measure_category(
    cfg: BenchConfig,
    suite: Suite,
    category: str,
    servers: dict[str, Server],
    concurrency: int,
    clock: Callable[[], float],
) -> CategoryResult:
    """One category of `suite` on every server, with its speedup when a baseline runs."""
    questions = suite.in_category(category)
    levels = measure_category(list(servers.values()), questions, concurrency, cfg, clock)
    speedup = (
        SpeedupPoint.of(
            concurrency,
            levels[0].tokens_per_s_runs,
            levels[1].tokens_per_s_runs,
            levels[0].num_errors + levels[1].num_errors,
        )
        if len(levels) > 1
        else None
    )
    return CategoryResult(
        category,
        len(questions),
        max(len(q.turns) for q in questions),
        levels[0],
        levels[1] if len(levels) > 1 else None,
        speedup,
    )


def measure_category(
    servers: Sequence[Server],
    questions: Sequence[Question],
    concurrency: int,
    cfg: BenchConfig,
    clock: Callable[[], float] = time.perf_counter,
) -> list[LevelResult]:
    """One category on every server, turn by turn (module doc); one LevelResult per server."""
    before = [scrape(server, cfg.timeout_s) for server in servers]
    runs: list[list[tuple[list[RequestRecord], float]]] = [
        [([], 0.0)] * cfg.repeats for _ in servers
    ]
    histories: list[list[dict]] = [[] for _ in questions]
    for turn in range(max(len(q.turns) for q in questions)):
        active = [i for i, q in enumerate(questions) if len(q.turns) > turn]
        batch = [
            histories[i] + [{"role": "user", "content": questions[i].turns[turn]}] for i in active
        ]
        answers: list[str] = []
        for r in range(cfg.repeats):
            for s, server in enumerate(servers):
                records, seconds = asyncio.run(
                    run_requests(server, batch, concurrency, cfg, clock=clock)
                )
                runs[s][r] = (runs[s][r][0] + records, runs[s][r][1] + seconds)
                answers = [rec.text for rec in records] if (r, s) == (0, 0) else answers
        for i, chat, answer in zip(active, batch, answers):
            histories[i] = [*chat, {"role": "assistant", "content": answer}]
    after = [scrape(server, cfg.timeout_s) for server in servers]
    return [
        level_result(server, concurrency, server_runs, b, a)
        for server, server_runs, b, a in zip(servers, runs, before, after)
    ]


def _tau(level: LevelResult) -> tuple[str, str]:
    s = level.spec
    if s is None:
        return "-", "-"
    p = s.acceptance_per_position
    return f"{s.accept_length:.3f}", " ".join(
        f"{x:.2f}" for x in p
    ) if p is not None else "not exposed"


def category_line(c: CategoryResult) -> str:
    """ "writing (10 questions, 2 turns): tau 2.310, 812.3 tok/s, speedup 1.52x"."""
    tau, _ = _tau(c.spec)
    speedup = f", speedup {c.speedup.text()}" if c.speedup and not c.speedup.num_errors else ""
    return (
        f"{c.category} ({c.num_questions} questions, {c.num_turns} turn{'s' if c.num_turns > 1 else ''}): "
        f"tau {tau}, {c.spec.tokens_per_s:.1f} tok/s{speedup}"
    )


def suite_markdown(report: SuiteReport) -> str:
    """The report as markdown: the settings, then one row per category."""
    cfg = report.config
    lines = [
        f"# specdraft bench --suite {report.suite}",
        "",
        f"concurrency {report.concurrency}, {cfg.repeats} run{'s' * (cfg.repeats != 1)} of every turn per server, max_tokens "
        f"{cfg.max_tokens}, temperature {cfg.temperature}, ignore_eos {cfg.ignore_eos}; speculative "
        f"{report.servers['speculative'].url}"
        + (
            f", baseline {report.servers['baseline'].url}"
            if "baseline" in report.servers
            else ", no baseline"
        ),
        "",
        *report.warnings,
        "",
        "| category | questions | turns | tau | p_k | tok/s | baseline tok/s | speedup |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in report.categories:
        tau, p = _tau(c.spec)
        base = f"{c.baseline.tokens_per_s:.1f}" if c.baseline else "-"
        speedup = c.speedup.text() if c.speedup and not c.speedup.num_errors else "-"
        lines.append(
            f"| {c.category} | {c.num_questions} | {c.num_turns} | {tau} | {p} | "
            f"{c.spec.tokens_per_s:.1f} | {base} | {speedup} |"
        )
    return "\n".join(lines) + "\n"


def plot_suite(report: SuiteReport, path: Path) -> Path:
    """suite.png: tau (and, with a baseline, the speedup with its sd) per category, as bars."""
    from matplotlib.figure import Figure

    names = [c.category for c in report.categories]
    with_speedup = any(c.speedup for c in report.categories)
    fig = Figure(figsize=(max(5.0, 0.8 * len(names)), 6.0 if with_speedup else 3.5))
    axes = fig.subplots(2 if with_speedup else 1, 1, squeeze=False)[:, 0]
    axes[0].bar(
        names, [c.spec.spec.accept_length if c.spec.spec else 0.0 for c in report.categories]
    )
    axes[0].set_ylabel("accept length (tau)")
    if with_speedup:
        valid = [
            c.speedup if c.speedup and not c.speedup.num_errors else None for c in report.categories
        ]
        axes[1].bar(
            names,
            [p.speedup if p else 0.0 for p in valid],
            yerr=[p.speedup_std if p else 0.0 for p in valid],
            capsize=3,
        )
        axes[1].axhline(1.0, color="gray", linestyle="--")
        axes[1].set_ylabel("speedup (x)")
    for ax in axes:
        ax.tick_params(axis="x", labelrotation=30)
    fig.tight_layout()
    return atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=100, format="png"))


def write_suite_report(report: SuiteReport, out_dir: str | Path) -> list[Path]:
    """suite.json, suite.md and suite.png in out_dir (created; each written atomically)."""
    out = make_out_dir(out_dir)
    return [
        atomic_write_text(out / "suite.json", json.dumps(report.to_dict(), indent=2)),
        atomic_write_text(out / "suite.md", suite_markdown(report)),
        plot_suite(report, out / "suite.png"),
    ]
