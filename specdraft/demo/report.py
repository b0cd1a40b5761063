"""What the demo measured (`DemoReport`) and how it reads: the verdict, report.md,
report.json, the plots, and the lines the demo prints."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from specdraft.bench.speedup import (
    DECODE_TOKENS_PER_S,
    WALL_TOKENS_PER_S,
    plain_variation_warning,
    speedup_text,
)
from specdraft.demo.config import DemoConfig
from specdraft.demo.portable import copy_chat_template, portable_paths, target_line
from specdraft.demo.verdict import setting_text
from specdraft.files import atomic_write_text
from specdraft.machine_load import DEFAULT_THREADS


@dataclass
class DemoReport:
    """What the demo measured; written as report.json and report.md under out."""

    target: str
    aux_layers: list[int]
    training: dict[str, Any] = field(default_factory=dict)
    doctor: list[dict[str, Any]] = field(default_factory=list)
    baseline: dict[str, Any] = field(default_factory=dict)
    sweep: list[dict[str, Any]] = field(default_factory=list)
    tree: dict[str, Any] = field(default_factory=dict)
    chosen: dict[str, Any] = field(
        default_factory=dict
    )  # empty: no setting beat plain decoding beyond noise
    verdict: str = ""
    launch_commands: dict[str, str] = field(default_factory=dict)
    lint: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    plots: list[str] = field(default_factory=list)
    drafter: dict[str, Any] = field(
        default_factory=dict
    )  # dir, steps, batch_size, num_train of the drafter used
    threads: int | None = (
        DEFAULT_THREADS  # the CPU threads the timing ran on (DemoConfig.threads; None: torch's)
    )
    busy: str | None = (
        None  # the busy-machine note of the load when the timing ran (None: idle, or a GPU)
    )
    prompts_file: str = (
        ""  # the timed prompts as a tune --prompts file (generation.TUNE_PROMPTS_FILE)
    )
    max_new_tokens: int = 0  # per prompt, in the timing
    chat_template: str | None = None  # demo --chat-template: the file the serve: line serves with


def speculative_section(report: DemoReport) -> list[str]:
    """report.md's speculative-decoding section (markdown lines): how settings were timed, the
    plain baseline, one table row per setting (tau, tokens/s, speedup, p_k), the verdict."""
    base = report.baseline["tokens_per_s"]
    runs = report.baseline.get("tokens_per_s_runs", [base])
    lines = [
        "## Speculative decoding on held-out prompts (greedy, batch 1)",
        "",
        f"Each setting was timed in {len(runs)} rounds, taking turns with plain decoding; tokens/s is the "
        "median over rounds, speedup the median (and quartiles: the middle half of the rounds) of its tokens/s "
        "over plain decoding's in the same round.",
        "",
        f"No speculation: {base:.0f} tokens/s (rounds: {min(runs):.0f}-{max(runs):.0f}).",
        "",
    ]
    warning = plain_variation_warning(runs)
    if warning:
        lines += [warning, ""]
    lines += [
        "| num_steps | topk | num_draft_tokens | tau | tokens/s | speedup (quartiles) | acceptance p_k |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in [*report.sweep, report.tree]:
        lines.append(
            f"| {r['num_steps']} | {r['topk']} | {r['num_draft_tokens']} | {r['accept_length']:.2f} "
            f"| {r['tokens_per_s']:.0f} | {speedup_text(r)} | "
            + ", ".join(f"{p:.2f}" for p in r["acceptance"])
            + " |"
        )
    slower = [r for r in [*report.sweep, report.tree] if r["speedup"] < 1.0]
    if slower:
        lines += [
            "",
            "Slower than plain decoding (median speedup below 1x): "
            + "; ".join(setting_text(r) for r in slower)
            + ".",
        ]
    return lines + [
        "",
        report.verdict,
        "",
        "Every speculative run produced exactly the plain greedy output (lossless at T = 0).",
        *other_numbers(report),
    ]


def other_numbers(report: DemoReport) -> list[str]:
    """Why `tune` and `bench` give other numbers, in one sentence, and the `tune` line that times
    the demo's prompts and its recommended (else fastest) setting again ([] without the prompts)."""
    if not report.prompts_file:
        return []
    setting = report.chosen or max([*report.sweep, report.tree], key=lambda r: r["speedup"])
    flags = (
        f"--target {report.target} --draft {report.drafter['dir']} --prompts {report.prompts_file} "
        f"--max-tokens {report.max_new_tokens} --num-steps {setting['num_steps']} "
        f"--topk {setting['topk']} --num-draft-tokens {setting['num_draft_tokens']}"
        + (f" --threads {report.threads}" if report.threads else "")
    )
    return [
        "",
        "These numbers are specdraft's engine in this process, one request at a time, on the "
        f"demo's held-out prompts ({report.max_new_tokens} new tokens each; {WALL_TOKENS_PER_S}): "
        "`specdraft tune` on the same prompts and setting times the same generation but reports "
        f"{DECODE_TOKENS_PER_S}, so its speedup lies a little further from 1x, while "
        "`specdraft bench` times a server over HTTP, with requests in flight at once and its own "
        "prompts, so its tokens/s and speedups differ.",
        "",
        f"check: specdraft tune {flags}",
    ]


def generation_line(report: DemoReport) -> str:
    """The generation stage in one line, printed when it ends (before export and doctor run):
    plain decoding's tokens/s, the fastest setting, the recommended one (the table: summary)."""
    best = max([*report.sweep, report.tree], key=lambda r: r["speedup"])
    pick = (
        f"recommended: {setting_text(report.chosen)}" if report.chosen else "no setting recommended"
    )
    return (
        f"speculative generation: plain decoding {report.baseline['tokens_per_s']:.0f} tokens/s; fastest "
        f"(highest median speedup over plain decoding in the same round) {setting_text(best)}, "
        f"tau {best['accept_length']:.2f}, {speedup_text(best)}; {pick}"
    )


def doctor_line(report: DemoReport) -> str:
    """The doctor stage in one line: its distinct checks, each run on every sample set and counted
    once, by its worst verdict over the sets (fail, else pass, else skipped); failed checks with
    their sample set and lint failures by name (details: report.md)."""
    from specdraft.doctor.run import counts_text, verdict_counts

    sets = list(dict.fromkeys(f["samples"] for f in report.doctor))
    seen: dict[str, set[str]] = {}
    for f in report.doctor:
        seen.setdefault(f["check"], set()).add(f["verdict"])
    worst = [
        next(v for v in ("fail", "pass", "skip") if v in verdicts) for verdicts in seen.values()
    ]
    failed = [f"{f['check']} ({f['samples']})" for f in report.doctor if f["verdict"] == "fail"]
    failed += [
        f"lint {engine}: {f['check']}"
        for engine, findings in report.lint.items()
        for f in findings
        if f["verdict"] == "fail"
    ]
    where = f"on each of {len(sets)} sample sets" if len(sets) != 1 else "on sample set"
    return (
        f"doctor: {len(seen)} checks, run {where} ({', '.join(sets)}): {counts_text(verdict_counts(worst))}"
        + (f"; failed: {', '.join(failed)}" if failed else "")
        + " (report.md has the evidence)"
    )


def method_prefix(drafter: dict) -> str:
    """ "eagle3.1 (fc_norm, norm_output), ": the drafter's method before its training figures
    ("" for a report that records none)."""
    return f"{drafter['method']}, " if drafter.get("method") else ""


def summary(report: DemoReport, out: Path) -> str:
    """What `specdraft demo` prints when it is done: the speculative-decoding section of
    report.md, then where the drafter, the report and the plots are."""
    return "\n".join(
        [
            *speculative_section(report),
            "",
            f"drafter: {report.drafter['dir']}",
            *generate_command(report),
            f"report: {out / 'report.md'} (training, doctor, launch commands for vLLM / SGLang)",
            "plots: " + ", ".join(str(out / p) for p in report.plots),
        ]
    )


def generate_command(report: DemoReport) -> list[str]:
    """ "try: specdraft generate ..." and "serve: specdraft serve ..." (README's lines) with the
    recommended setting and the CPU threads the demo's timing ran on (--threads, every command's
    `machine_load.DEFAULT_THREADS` by default), or the fastest one when none is recommended
    (generate's and serve's own default, 3 steps, is not what the demo recommends)."""
    rows = [*report.sweep, report.tree]
    setting = report.chosen or max(rows, key=lambda r: r["speedup"])
    why = "" if report.chosen else "  (the fastest setting here; none is recommended)"
    flags = (
        f"--target {report.target} --draft {report.drafter['dir']} --num-steps {setting['num_steps']} "
        f"--topk {setting['topk']} --num-draft-tokens {setting['num_draft_tokens']}"
    )
    threads = f" --threads {report.threads}" if report.threads else ""
    served = f" --chat-template {report.chat_template}" if report.chat_template else ""
    return [
        f'try: specdraft generate {flags}{threads} --prompt "Once upon a time"{why}',
        f"serve: specdraft serve {flags}{threads}{served} --port 8000{why}",
    ]


def doctor_rows(findings: list[dict[str, Any]]) -> list[str]:
    """report.md's doctor table rows: a check with the same verdict and evidence on every sample
    set once (its samples column names them all), any other check one row per set."""
    sets = list(dict.fromkeys(f["samples"] for f in findings))
    by_check: dict[str, list[dict[str, Any]]] = {}
    for f in findings:
        by_check.setdefault(f["check"], []).append(f)
    rows = []
    for check, group in by_check.items():
        if (
            len(sets) > 1
            and len(group) == len(sets)
            and len({(f["verdict"], f["evidence"]) for f in group}) == 1
        ):
            group = [{**group[0], "samples": " and ".join(sets)}]
        rows += [f"| {f['samples']} | {check} | {f['verdict']} | {f['evidence']} |" for f in group]
    return rows


def report_markdown(report: DemoReport, cfg: DemoConfig) -> str:
    """report.md: what ran, tau, per-position acceptance, tokens/s, doctor verdicts, commands;
    its paths relative to cfg.out, where it lies, a target outside it as $TARGET
    (`portable.portable_paths`)."""
    lines = [
        "# specdraft demo",
        "",
        f"Target: `{report.target}`; aux layers (specdraft indices) {report.aux_layers}.",
        "",
        "## Training",
        "",
        *(
            [
                f"Drafter: {method_prefix(report.drafter)}{report.drafter['steps']} optimizer "
                f"steps (batch {report.drafter.get('batch_size', '?')}) "
                f"on {report.drafter.get('num_train', '?')} training documents.",
                "",
            ]
            if report.drafter
            else []
        ),
        f"Validation (simulated tau {report.training.get('tau', float('nan')):.2f}; a "
        f"{len(report.training.get('accuracy', []))}-step chain replayed over the validation text: tau "
        f"{report.training.get('replayed_tau') or float('nan'):.2f}): per-step accuracy "
        + ", ".join(f"{a:.2f}" for a in report.training.get("accuracy", [])),
        "",
    ]
    lines += speculative_section(report)
    lines += [
        "",
        "## Doctor",
        "",
        "| samples | check | verdict | evidence |",
        "|---|---|---|---|",
        *doctor_rows(report.doctor),
    ]
    for engine, findings in report.lint.items():
        failed = [f["check"] for f in findings if f["verdict"] == "fail"]
        lines.append("")
        lines.append(
            f"Lint for {engine}: {'FAIL ' + ', '.join(failed) if failed else 'no failures'}."
        )
    lines += ["", doctor_command(cfg)]
    lines += launch_section(report, cfg)
    lines += ["", *[f"![{p}]({p})" for p in report.plots], ""]
    return portable_paths("\n".join(lines), cfg.out, cfg.target, cfg.chat_template)


def doctor_command(cfg: DemoConfig) -> str:
    """report.md's line for re-running doctor against a deployment (its paths made portable with
    the rest of the report)."""
    target = Path(cfg.target) if cfg.target else cfg.out / "target"
    command = (
        f"specdraft doctor {cfg.out / 'export' / 'sglang'} --target {target} "
        f"--samples {cfg.out / 'store-heldout'} --engine-args '<a launch line below>'"
    )
    return (
        f"Re-run it on a deployment: `{command}` (`--server URL` adds a live server's acceptance)."
    )


def launch_section(report: DemoReport, cfg: DemoConfig) -> list[str]:
    """report.md's launch commands, with where to run them and what to set first."""
    lines = [
        "",
        "## Launch on a GPU machine",
        "",
        "Copy this report's folder to the machine and run these from inside it: every path in "
        "this report is relative to the folder.",
        *target_line(cfg.out, cfg.target),
        "",
    ]
    if not report.chosen:
        lines += [
            "Not a recommendation (no setting beat plain decoding here): these commands use the setting "
            "with the highest median speedup; check it on the GPU machine with `specdraft bench`.",
            "",
        ]
    lines += [f"- {engine}: `{command}`" for engine, command in report.launch_commands.items()]
    if "speculators" in report.launch_commands:
        lines += [
            "",
            "vLLM takes the speculators export's target from its config.json "
            "(`speculators_config.verifier.name_or_path`: the target's path on this machine): on "
            "another machine, write the target's path there into it.",
        ]
    return lines


def write_report(report: DemoReport, cfg: DemoConfig) -> None:
    """report.json and report.md under cfg.out (report.plots names the plots written before,
    `plots.write_plots`), and a --chat-template from outside cfg.out copied into it, as report.md
    names it (`portable.copy_chat_template`)."""
    copy_chat_template(cfg.chat_template, cfg.out)
    atomic_write_text(cfg.out / "report.json", json.dumps(asdict(report), indent=2, default=str))
    atomic_write_text(cfg.out / "report.md", report_markdown(report, cfg))
