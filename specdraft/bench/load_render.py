"""`specdraft tune --concurrency`'s report as text (`load_schedule.LoadReport`): per batch size
batched plain decoding and each setting (chains, trees), predicted beside measured, the fitted model, the schedule and
the launch lines; and `tune_load_paths`, the run from paths on disk."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from specdraft.bench.load_schedule import LoadReport, write_schedule_files
from specdraft.bench.speedup import DECODE_TOKENS_PER_S
from specdraft.bench.tune_load import LoadBench, load_settings, setting_label, tune_load
from specdraft.bench.tune_model import TuneConfig
from specdraft.bench.tune_render import export_lines, row
from specdraft.conventions.spec_schedule import (
    SGLANG_ADAPTIVE_SOURCE,
    VLLM_SCHEDULE_KEY,
    VLLM_SCHEDULE_SOURCE,
)
from specdraft.engine.schedule import TREES_KEY
from specdraft.machine_load import busy_note


def render_load(report: LoadReport, written: dict[str, Path] | None = None) -> str:
    """The report as text; written: the files `write_schedule_files` wrote (their paths go in
    the launch lines)."""
    cfg, model, written = report.config, report.model, written or {}
    trees = [setting_label(s) for s in load_settings(cfg) if not s.is_chain]
    lines = [
        f"specdraft tune --concurrency: {report.num_prompts} prompts ({report.prompt_set}) x "
        f"{cfg.max_new_tokens} new tokens per sequence, temperature 0, chains K = 1.."
        f"{report.depth}"
        + (f" and {', '.join(trees)}" if trees else " (no tree: --topks 1)")
        + f", {cfg.repeats} timing rounds",
        f"speeds: batch {DECODE_TOKENS_PER_S}, every sequence of the batch counted",
        "model: round_s(B, D) = a(B) + b(B) D (D drafts verified per row) through the K = 1 and "
        f"K = {report.depth} chain runs (a tree's tau: its own run's), lines in B: a = "
        f"{model.a[0] * 1e3:.3f} + {model.a[1] * 1e3:.3f} B "
        f"ms, b = {model.b[0] * 1e3:.3f} + {model.b[1] * 1e3:.3f} B ms, plain round = "
        f"{model.plain[0] * 1e3:.3f} + {model.plain[1] * 1e3:.3f} B ms",
        f"{'batch / setting':<38} {'pred tau':>8} {'pred tok/s':>10} {'meas tau':>8} "
        f"{'meas tok/s':>10} speedup (quartiles)",
    ]
    for level in report.levels:
        lines.append(
            f"{f'B {level.batch_size}: plain':<38} {'':>8} {level.plain_predicted_tps:>10.1f} "
            f"{'':>8} {level.plain_tps:>10.1f} ({setting_label(level.chosen)} chosen)"
        )
        lines += [
            row(f"B {level.batch_size}: {setting_label(spec)}", c)
            for spec, c in level.candidates.items()
        ]
    rule = (
        f"rule per batch size: a median speedup of at least {cfg.min_speedup:.2f}x and a lower "
        "quartile above 1x over batched plain decoding, the fewest drafts of the ties; else K 0"
    )
    lines += [rule, f"{VLLM_SCHEDULE_KEY}: {report.rows()} (read as {VLLM_SCHEDULE_SOURCE})"]
    schedule = report.schedule()
    if schedule.trees:
        lines.append(
            f"trees ({TREES_KEY} in the serve file): {schedule.to_json()[TREES_KEY]}; vLLM's "
            "and SGLang's values hold their depth K there (both take a chain length per batch "
            "size: they draft a chain of K)"
        )
    lines += launch_lines(report, written)
    return "\n".join(lines + ([report.busy] if report.busy else []))


def launch_lines(report: LoadReport, written: dict[str, Path]) -> list[str]:
    """The files written and the vLLM, SGLang and specdraft serve launch lines, each engine's
    with the export its drafter directory needs first (`tune_render.export_lines`)."""
    serve_file, sglang_file = written.get("serve"), written.get("sglang")
    lines = [f"wrote {path}" for path in written.values()]
    lines.append(f"vLLM: {report.vllm_flags()}")
    lines += export_lines(report, "vllm", "vLLM")
    if report.sglang_adaptive() is not None:
        lines.append(f"SGLang ({SGLANG_ADAPTIVE_SOURCE}): " + report.sglang_flags(sglang_file))
    else:
        lines.append(f"SGLang: {report.sglang_flags()}")
    lines += export_lines(report, "sglang", "SGLang")
    lines.append("specdraft: " + report.serve_flags(serve_file or "SCHEDULE.json"))
    return lines


def tune_load_paths(
    pair,
    prompts: str,
    cfg: TuneConfig,
    concurrency: Sequence[int],
    max_num_seqs: int,
    progress: Callable[[str], None] | None = None,
) -> LoadReport:
    """`tune_load` for a `tune.TunedPair` on disk and a prompt source (`prompts.load_prompts`)."""
    from specdraft.bench.prompts import load_prompts
    from specdraft.data.render import prompt_ids

    say = progress or (lambda text: None)
    tokenizer, engine = pair.load(cfg)
    ids = [prompt_ids(tokenizer, p) for p in load_prompts(prompts)]
    bench = LoadBench(engine.target, engine.draft, ids, cfg)
    report = load_report(bench, concurrency, max_num_seqs, say, str(pair.draft_dir))
    report.target_path, report.prompt_set = str(pair.target_dir), prompts
    return report


def load_report(
    bench: LoadBench,
    concurrency: Sequence[int],
    max_num_seqs: int,
    say: Callable[[str], None] = lambda text: None,
    draft_path: str = "DRAFT",
) -> LoadReport:
    """Measure (`tune_load`) and conclude: the `LoadReport`."""
    busy = busy_note("the tokens/s above") if bench.device.type == "cpu" else None
    levels, model = tune_load(bench, concurrency, bench.cfg.min_speedup, say)
    report = LoadReport(bench.cfg, levels, model, bench.cfg.depth, max_num_seqs, draft_path)
    report.num_prompts, report.busy = len(bench.prompts), busy
    return report


def write_and_render(report: LoadReport, out_dir: str | Path) -> str:
    """Write the schedule files under out_dir and render the report naming them."""
    return render_load(report, write_schedule_files(report, out_dir))
