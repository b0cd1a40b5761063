"""`specdraft demo --method dflash`: a DFlash block drafter beside the EAGLE-3 drafter, on the same
data and engine.

The stages before training are the default demo's, with its cache (`run.prepare`); the EAGLE-3
drafter is its drafter (out/train, `stages.stage_train`, reused when the default demo ran), the
DFlash drafter is trained on the same store into out/train-dflash (`dflash_fields`). Plain
decoding, EAGLE-3 chains and DFlash blocks then run greedily on the held-out prompts, each timed in
rounds in turns with plain decoding (`generation.timed_settings`: every output equal to plain
decoding's), and the demo prints each setting's tau and its speedup
(the median same-round ratio to plain decoding, quartiles beside it) and writes
out/report-dflash.json. Last, the DFlash drafter is exported for vLLM and SGLang
(`export.dflash.export_dflash`, into out/export-dflash/ENGINE) and each export is checked by
doctor with its own launch line (`deployments`): the report carries each launch line and doctor's
counts, and the summary prints them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from specdraft.bench.speedup import plain_variation_warning, speedup_text, timing_summary
from specdraft.demo import stages
from specdraft.demo.config import DemoConfig
from specdraft.demo.generation import heldout_prompts, timed_settings
from specdraft.demo.run import prepare
from specdraft.files import atomic_write_json
from specdraft.targets.mask_token import dflash_mask_token
from specdraft.train.dflash_loss import reference_gamma

EAGLE_CHAINS = (2, 3, 4)  # the EAGLE-3 chains timed beside DFlash (the default demo sweeps 1..6)
REPORT_FILE = "report-dflash.json"


@dataclass
class DFlashDemo:
    """What `run_dflash_demo` measured: the two drafters' directories and training steps, and a row
    per setting (method, num_steps, accept_length, timing_summary's fields)."""

    eagle_dir: str
    dflash_dir: str
    dflash_steps: int | None
    rows: list[dict[str, Any]] = field(default_factory=list)
    busy: str | None = None
    # engine -> {"export": dir, "launch_command", "doctor": verdict counts, "failed": check names}
    deployments: dict[str, dict[str, Any]] = field(default_factory=dict)


def run_dflash_demo(cfg: DemoConfig, console: Console | None = None) -> DFlashDemo:
    """The demo's stages up to training, both drafters, then the timed comparison; writes
    out/report-dflash.json. Raises what the default demo raises, and UnusableInput for a target
    without a usable mask token (`targets.mask_token.dflash_mask_token`)."""
    from specdraft.machine_load import busy_note

    say, target_dir, _, stores, heldout_file = prepare(cfg, console)
    eagle_dir, _ = stages.stage_train(cfg, stores["train"], target_dir, say)
    fields = dflash_fields(cfg, target_dir)
    dflash_dir, training = stages.stage_train(cfg, stores["train"], target_dir, say, fields)
    say(
        f"DFlash drafter: block size {cfg.block_size}, {cfg.dflash_layers} layer(s), "
        f"{training.get('steps')} optimizer steps, at {dflash_dir}"
    )
    say("EAGLE-3 chains and DFlash blocks vs plain decoding on held-out prompts")
    prompts = heldout_prompts(target_dir, heldout_file, cfg.prompt_tokens, cfg.chat_template)
    result = DFlashDemo(str(eagle_dir), str(dflash_dir), training.get("steps"))
    result.busy = busy_note("the tokens/s and speedups above") if cfg.device == "cpu" else None
    result.rows = compare(cfg, target_dir, eagle_dir, dflash_dir, prompts)
    say("DFlash export for vLLM and SGLang, each checked by doctor with its launch line")
    result.deployments = deployments(cfg, dflash_dir, target_dir)
    atomic_write_json(cfg.out / REPORT_FILE, result.__dict__)
    return result


def deployments(cfg: DemoConfig, dflash_dir: Path, target_dir: Path) -> dict[str, dict[str, Any]]:
    """Export the DFlash drafter for vLLM and SGLang into out/export-dflash/ENGINE and run doctor
    on each export with its own launch command (served with the demo's --chat-template, as the
    EAGLE-3 demo's exports are): engine -> its export directory, launch command, doctor's verdict
    counts and the names of the checks that failed."""
    from specdraft.doctor.run import run_doctor
    from specdraft.export.dflash import export_dflash

    out = {}
    for engine in ("vllm", "sglang"):
        exported = export_dflash(
            dflash_dir, cfg.out / "export-dflash" / engine, engine, target=target_dir
        )
        launch = stages.served_command(cfg, exported.launch_command)
        report = run_doctor(exported.out_dir, target=target_dir, engine=engine, engine_args=launch)
        out[engine] = {
            "export": str(exported.out_dir),
            "launch_command": launch,
            "doctor": report.counts(),
            "failed": [f.check for f in report.failed],
        }
    return out


def dflash_fields(cfg: DemoConfig, target_dir: Path) -> dict[str, Any]:
    """The TrainConfig fields of the demo's DFlash drafter: its block size and layer count, the
    mask token (`targets.mask_token.dflash_mask_token`), cfg.dflash_anchors blocks per document, cfg.dflash_steps steps at
    cfg.dflash_lr, the loss weighted towards early positions (`dflash_loss.reference_gamma`: 4 for
    the block of 8; the A/B against the uniform loss is in benchmarks/RESULTS.md)."""
    return {
        "method": "dflash",
        "lr": cfg.dflash_lr,
        "block_size": cfg.block_size,
        "num_anchors": cfg.dflash_anchors,
        "loss_decay_gamma": reference_gamma(cfg.block_size),
        "total_steps": cfg.dflash_steps,
        "draft_overrides": {
            "num_hidden_layers": cfg.dflash_layers,
            "mask_token_id": dflash_mask_token(target_dir),
        },
    }


def compare(
    cfg: DemoConfig,
    target_dir: Path,
    eagle_dir: Path,
    dflash_dir: Path,
    prompts: list[list[int]],
) -> list[dict[str, Any]]:
    """Plain decoding, EAGLE_CHAINS and DFlash at `dflash_drafts(cfg)` drafts per round, timed in
    cfg.timing_repeats rounds on the same engine: a row per setting (plain first)."""
    from specdraft.engine.spec_config import SpecConfig

    settings = {
        "plain": ("plain", None, None),
        **{f"EAGLE-3 chain {n}": ("eagle3", eagle_dir, n) for n in EAGLE_CHAINS},
        **{f"DFlash {n} drafts": ("dflash", dflash_dir, n) for n in dflash_drafts(cfg)},
    }
    specs = {
        name: (draft, None if n is None else SpecConfig.chain(n))
        for name, (_, draft, n) in settings.items()
    }
    runs, plain_tps = timed_settings(cfg, target_dir, specs, prompts)
    return [
        {
            "setting": name,
            "method": method,
            "num_steps": n or 0,
            "accept_length": runs[name][0]["accept_length"],
            "acceptance": runs[name][0]["acceptance"],
            **timing_summary([run["tokens_per_s"] for run in runs[name]], plain_tps),
        }
        for name, (method, _, n) in settings.items()
    ]


def dflash_drafts(cfg: DemoConfig) -> tuple[int, ...]:
    """The DFlash settings timed: 3 drafts per round (EAGLE-3's default chain) and the whole block
    (block_size - 1)."""
    return tuple(sorted({min(3, cfg.block_size - 1), cfg.block_size - 1}))


def dflash_summary(result: DFlashDemo, out: Path) -> str:
    """The printed comparison: a row per setting (tau, tokens/s, the speedup with its quartiles),
    the best of each method, and where the drafters and the report are."""
    lines = [f"{'setting':<20} {'tau':>6} {'tok/s':>8}  speedup (quartiles)"]
    for r in result.rows:
        lines.append(
            f"{r['setting']:<20} {r['accept_length']:>6.2f} {r['tokens_per_s']:>8.1f}  "
            f"{speedup_text(r)}"
        )
    warning = plain_variation_warning(result.rows[0]["tokens_per_s_runs"])
    if warning:
        lines.append(warning)
    for method, name in (("eagle3", "EAGLE-3"), ("dflash", "DFlash")):
        best = max((r for r in result.rows if r["method"] == method), key=lambda r: r["speedup"])
        lines.append(
            f"fastest {name}: {best['setting']}, tau {best['accept_length']:.2f}, speedup "
            f"{speedup_text(best)}"
        )
    lines.append(f"drafters: EAGLE-3 {result.eagle_dir}, DFlash {result.dflash_dir}")
    dflash_best = max(
        (r for r in result.rows if r["method"] == "dflash"), key=lambda r: r["speedup"]
    )
    if dflash_best["speedup_q1"] <= 1.0:
        lines.append(
            f"DFlash was not faster than plain decoding here (best {speedup_text(dflash_best)}): "
            "the DFlash launch lines below check the export; they are no recommendation"
        )
    for engine, d in result.deployments.items():
        counts = ", ".join(f"{n} {verdict}" for verdict, n in d["doctor"].items())
        failed = f" (failed: {', '.join(d['failed'])})" if d["failed"] else ""
        lines += [
            f"DFlash for {engine}: {d['export']}; doctor: {counts}{failed}",
            f"  {d['launch_command']}",
        ]
    lines.append(f"report: {out / REPORT_FILE}")
    lines.append(
        "the EAGLE-3 drafter's report.md, exports and launch lines: the same `specdraft demo` "
        "command without --method dflash (it reuses this run's stages)"
    )
    if result.busy:
        lines.append(result.busy)
    return "\n".join(lines)
