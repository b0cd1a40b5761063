"""`run_demo`, the entry `specdraft demo` calls: every stage in order, then the report."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console

from specdraft.bench.speedup import pick_setting
from specdraft.conventions import default_aux_layers
from specdraft.demo import stages
from specdraft.demo.cache import reconcile_cache
from specdraft.demo.config import DemoConfig
from specdraft.demo.generation import heldout_prompts, stage_generation, write_tune_prompts
from specdraft.demo.inputs import check_inputs
from specdraft.demo.plots import write_plots
from specdraft.demo.report import (
    DemoReport,
    doctor_line,
    generation_line,
    write_report,
)
from specdraft.demo.verdict import verdict_text
from specdraft.draft_config import method_flags, method_label
from specdraft.errors import UnusableInput

Say = Callable[[str], None]


def run_demo(cfg: DemoConfig, console: Console | None = None) -> DemoReport:
    """Run every stage (cached under cfg.out) and write report.json, report.md and the plots.
    Inputs are checked before any stage runs (ValueError naming the flag and the fix)."""
    say, target_dir, aux_layers, stores, heldout_file = prepare(cfg, console)
    draft_dir, training = stages.stage_train(cfg, stores["train"], target_dir, say)
    report = drafter_report(cfg, target_dir, aux_layers, draft_dir, training)
    say(
        f"drafter: {report.drafter['method']}, {training.get('steps')} optimizer steps, at {draft_dir}"
    )
    say("speculative generation vs plain decoding on held-out prompts")
    prompts = heldout_prompts(target_dir, heldout_file, cfg.prompt_tokens, cfg.chat_template)
    report.prompts_file = str(write_tune_prompts(target_dir, prompts, heldout_file.parent))
    report.baseline, report.sweep, report.tree, report.busy = stage_generation(
        cfg, target_dir, draft_dir, prompts, say
    )
    chosen, chain = choose(report, cfg)
    say(generation_line(report))
    exports = export_stage(cfg, report, draft_dir, target_dir, chosen, chain, say)
    say("doctor")
    report.doctor, report.lint = stages.stage_doctor(draft_dir, target_dir, stores, exports, cfg)
    say(doctor_line(report))
    report.plots = write_plots(report, cfg.out)
    write_report(report, cfg)
    return report


def prepare(
    cfg: DemoConfig, console: Console | None
) -> tuple[Say, Path, list[int], dict[str, Path], Path]:
    """The stages before training, each cached: inputs checked (`start`), the target and its aux
    layers, the data, regenerated and captured (the training and held-out stores). Returns what
    prints a demo line, the target directory, its aux layers, the stores by name ("train",
    "held-out") and the held-out documents' file."""
    say = start(cfg, console or Console())
    target_dir, aux_layers = target_stage(cfg, say)
    reconcile_cache(cfg, say)
    train_file, heldout_file = stages.stage_data(cfg, say)
    stores = {
        name: stages.stage_capture(
            cfg,
            target_dir,
            stages.stage_regenerate(cfg, target_dir, data_file, say),
            store,
            aux_layers,
            say,
        )
        for name, data_file, store in (
            ("train", train_file, "store"),
            ("held-out", heldout_file, "store-heldout"),
        )
    }
    return say, target_dir, aux_layers, stores, heldout_file


def drafter_report(
    cfg: DemoConfig,
    target_dir: Path,
    aux_layers: list[int],
    draft_dir: Path,
    training: dict[str, Any],
) -> DemoReport:
    """The report so far: the target, the drafter (its method: `draft_config.method_label`) and its
    training record (`stage_train`'s)."""
    return DemoReport(
        target=str(target_dir),
        aux_layers=aux_layers,
        training=training.get("validation") or {},
        threads=cfg.threads,
        max_new_tokens=cfg.max_new_tokens,
        chat_template=str(cfg.chat_template) if cfg.chat_template is not None else None,
        drafter={
            "dir": str(draft_dir),
            "method": method_label(method_flags(cfg.eagle_method)),
            "steps": training.get("steps"),
            "num_train": cfg.num_train,
            "batch_size": (training.get("config") or {}).get("batch_size"),
        },
    )


def start(cfg: DemoConfig, console: Console) -> Say:
    """Check the inputs, create --out, set the CPU threads; returns what prints one demo line."""
    import torch

    check_inputs(cfg)
    try:
        cfg.out.mkdir(parents=True, exist_ok=True)
    except OSError as e:  # no permission: check_inputs has refused a file in its place
        raise UnusableInput(
            f"--out {cfg.out}: cannot create it ({e.strerror or e}); pass a directory you can write"
        ) from None
    if cfg.device == "cpu" and cfg.threads:
        torch.set_num_threads(cfg.threads)

    def say(
        text: str,
    ) -> None:  # one line each, whatever the terminal's width (not a terminal: rich wraps at 80)
        console.print(f"[bold]demo[/bold] {text}", soft_wrap=True)

    return say


def target_stage(cfg: DemoConfig, say: Say) -> tuple[Path, list[int]]:
    """The target directory (`stages.stage_target`) and its aux layers, each said in one line."""
    from transformers import AutoConfig

    target_dir = stages.stage_target(cfg, say)
    num_layers = AutoConfig.from_pretrained(str(target_dir)).get_text_config().num_hidden_layers
    aux_layers = list(default_aux_layers(num_layers))
    say(
        f"target {target_dir} ({num_layers} layers): aux layers {aux_layers} "
        + ("(the standard [2, L//2, L-3] collapses below 7 layers)" if num_layers < 7 else "")
    )
    return target_dir, aux_layers


def choose(
    report: DemoReport, cfg: DemoConfig
) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """The recommended setting and the recommended chain (None: none beat plain decoding beyond
    the noise); sets report.verdict and report.chosen."""
    rows = [*report.sweep, report.tree]
    chosen = pick_setting(rows, cfg.min_speedup)
    chain = (
        chosen if chosen and chosen["topk"] == 1 else pick_setting(report.sweep, cfg.min_speedup)
    )
    report.verdict = verdict_text(
        rows, chosen, cfg.timing_repeats, cfg.min_speedup, cfg.train_steps, cfg.num_train
    )
    report.chosen = {k: v for k, v in (chosen or {}).items() if k != "outputs"}
    return chosen, chain


def export_stage(
    cfg: DemoConfig,
    report: DemoReport,
    draft_dir: Path,
    target_dir: Path,
    chosen: dict[str, Any] | None,
    chain: dict[str, Any] | None,
    say: Say,
) -> dict[str, Any]:
    """`stages.stage_export` with the recommended setting and chain, or the fastest ones when none
    is recommended; sets report.launch_commands. Returns engine -> ExportResult."""

    def fastest(rows: list[dict[str, Any]]) -> dict[str, Any]:
        return max(rows, key=lambda r: r["speedup"])

    exports = stages.stage_export(
        cfg,
        draft_dir,
        target_dir,
        chosen or fastest([*report.sweep, report.tree]),
        (chain or fastest(report.sweep))["num_steps"],
    )
    say(
        "export: "
        + ", ".join(
            f"{engine} -> {cfg.out / 'export' / engine} ({result.num_tensors} tensors bit-identical)"
            for engine, result in exports.items()
        )
    )
    report.launch_commands = {
        e: stages.served_command(cfg, r.launch_command) for e, r in exports.items()
    }
    return exports
