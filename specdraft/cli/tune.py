"""`specdraft tune`: the speculative settings of specdraft's engine here, predicted and measured."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from specdraft.cli.checks import check_min_speedup, positive_int_list
from specdraft.cli.common import OptionError, app, make_console, set_threads, user_errors
from specdraft.cli.engine_setting import (
    DraftingOptions,
    current_setting,
    dflash_block_size,
    engine_dtype,
    refuse_block_options,
    spec_from_flags,
)
from specdraft.cli.options import (
    PROMPTS_HELP,
    EngineDevice,
    EngineDtypeOption,
    TargetDir,
    Threads,
    TuneDraft,
    option,
)
from specdraft.conventions.spec_schedule import VLLM_DEFAULT_MAX_NUM_SEQS

TunePrompts = Annotated[str, option("builtin", help=PROMPTS_HELP + ".")]
TuneMaxTokens = Annotated[int, option(64, min=1, help="New tokens per prompt (temperature 0).")]
CurrentNumSteps = Annotated[
    int,
    option(
        0,
        min=0,
        help="Current setting, always measured too: draft depth (0 = what generate and serve "
        "run by default: the 3-step chain, a DFlash drafter's block size - 1 drafts); --topk and "
        "--num-draft-tokens need it (not with a DFlash drafter).",
    ),
]
CurrentTopk = Annotated[
    int | None,
    option(None, min=1, help="Current setting: children per node (1 with --num-steps alone)."),
]
CurrentNumDraftTokens = Annotated[
    int,
    option(
        0,
        min=0,
        help="Current setting: verified nodes (0 = num_steps + 1 "
        "for a chain; a tree, --topk > 1, needs a value).",
    ),
]
ProbeSteps = Annotated[
    int,
    option(
        8,
        min=1,
        help="Depth of the acceptance probes (a DFlash drafter: block size - 1 if not given).",
    ),
]
Topks = Annotated[
    str,
    option(
        "1,2,4",
        help="Children per node to consider (a DFlash drafter: 1, chains).",
        callback=positive_int_list,
    ),
]
MaxTreeTokens = Annotated[int, option(16, min=2, help="Cap on a tree's verified nodes.")]
NumMeasure = Annotated[int, option(3, min=1, help="Best predictions to measure for real.")]
MinSpeedup = Annotated[
    float,
    option(
        1.05,
        help="Median speedup a recommended setting needs (its lower "
        "quartile must also be above 1x), as the demo's rule; > 0.",
        callback=check_min_speedup,
    ),
]
TuneRepeats = Annotated[
    int,
    option(
        5,
        min=1,
        help="Timing rounds: each measured setting and plain decoding run "
        "once per round, order rotated; speedups are medians and quartiles of "
        "same-round ratios.",
    ),
]
JsonOut = Annotated[str, option("", help="Also write the report as JSON here.")]


def _concurrency_list(value: str, param: typer.CallbackParam = None) -> tuple[int, ...]:
    """--concurrency: "" (batch 1, today's tune), else `positive_int_list`."""
    return positive_int_list(value, param) if value.strip() else ()


Concurrency = Annotated[
    str,
    option(
        "",
        help="Batch sizes to tune K for (e.g. 1,2,4,8): B concurrent prompts through the batching "
        "engine, batched plain decoding and every chain depth 1..--probe-steps at each; writes "
        "the K-by-batch-size schedule for vLLM, SGLang and specdraft serve (empty: batch 1).",
        callback=_concurrency_list,
    ),
]
VllmMaxNumSeqs = Annotated[
    int,
    option(
        VLLM_DEFAULT_MAX_NUM_SEQS,
        min=1,
        help="With --concurrency: the schedule's last row ends here, vLLM's --max-num-seqs "
        "(vLLM 0.32's default on a >= 70 GiB GPU).",
    ),
]
ScheduleDir = Annotated[
    str,
    option(
        ".",
        help="With --concurrency: write spec_schedule.json (serve --spec-schedule) and "
        "sglang_adaptive.json here (an existing directory).",
    ),
]
TuneSuite = Annotated[
    str,
    option(
        "",
        help="Tune on a bundled suite's chats (mt-bench, humaneval, gsm8k; instead of --prompts), "
        "turn by turn with the target's own answers; then tau, p_k and speedup per category.",
    ),
]


@app.command()
def tune(
    ctx: typer.Context,
    target: TargetDir,
    draft: TuneDraft,
    prompts: TunePrompts,
    max_tokens: TuneMaxTokens,
    num_steps: CurrentNumSteps,
    topk: CurrentTopk,
    num_draft_tokens: CurrentNumDraftTokens,
    probe_steps: ProbeSteps,
    topks: Topks,
    max_tree_tokens: MaxTreeTokens,
    num_measure: NumMeasure,
    min_speedup: MinSpeedup,
    repeats: TuneRepeats,
    json_out: JsonOut,
    device: EngineDevice,
    dtype: EngineDtypeOption,
    threads: Threads,
    suite: TuneSuite,
    concurrency: Concurrency,
    max_num_seqs: VllmMaxNumSeqs,
    schedule_dir: ScheduleDir,
) -> None:
    """Predict and measure tokens/s of speculative settings; recommend one, or no speculation."""
    from specdraft.bench.tune_model import TuneConfig

    console = make_console()
    with user_errors(console):
        _refuse_bad_json_out(json_out)
        probe_steps, topks, current = _search(
            ctx, draft, (num_steps, topk, num_draft_tokens), probe_steps, topks
        )
        cfg = TuneConfig(
            max_tokens,
            probe_steps,
            topks,
            max_tree_tokens,
            num_measure,
            min_speedup,
            current,
            repeats=repeats,
        )
        set_threads(threads)
        if concurrency:
            load = (concurrency, max_num_seqs, schedule_dir, json_out)
            return _run_load(console, target, draft, prompts, suite, cfg, device, dtype, load)
        report, rows, chosen = _run_tune(console, target, draft, prompts, suite, cfg, device, dtype)
    _render_tune(console, report, rows, chosen, json_out)


def _run_load(console, target, draft, prompts, suite, cfg, device, dtype, load) -> None:
    """tune --concurrency (`bench.load_render.tune_load_paths`): the schedule, its files under
    --schedule-dir, the report, and --json-out (a DFlash drafter's chains through the batch
    engine's `engine.dflash_rows`). OptionError for --suite or a --schedule-dir that is not a
    directory."""
    from pathlib import Path

    concurrency, max_num_seqs, schedule_dir, json_out = load
    if suite:
        raise OptionError("--concurrency tunes on --prompts: drop --suite")
    if not Path(schedule_dir).is_dir():
        raise OptionError(f"--schedule-dir {schedule_dir}: give an existing directory")
    from specdraft.bench.load_render import tune_load_paths, write_and_render
    from specdraft.bench.tune import TunedPair
    from specdraft.files import atomic_write_text

    pair = TunedPair(target, draft, device, engine_dtype(dtype))
    report = tune_load_paths(
        pair,
        prompts,
        cfg,
        concurrency,
        max_num_seqs,
        lambda text: console.print(text, markup=False),
    )
    console.print(write_and_render(report, schedule_dir), markup=False, highlight=False)
    if json_out:
        atomic_write_text(json_out, json.dumps(report.to_dict(), indent=2))


def _search(ctx: typer.Context, draft: str, current: tuple, probe_steps: int, topks: tuple):
    """tune's probe depth, topks and current setting (current: --num-steps, --topk,
    --num-draft-tokens): as given for an EAGLE-3 drafter (`current_setting`); a DFlash drafter's
    (`dflash_block_size`) chains only, the current one of block_size - 1 drafts unless
    --num-steps / --num-draft-tokens say fewer (`refuse_block_options`), probed block_size - 1
    deep unless --probe-steps says less. OptionError naming --topks for a tree width, or
    --probe-steps past block_size - 1, with a DFlash drafter."""
    num_steps, topk, num_draft_tokens = current
    block_size = dflash_block_size(draft)
    if block_size is None:
        return probe_steps, topks, current_setting(draft, num_steps, topk, num_draft_tokens)
    drafting = DraftingOptions(topk, num_steps or None, num_draft_tokens or None, None, "")
    steps = refuse_block_options(drafting, block_size, draft)
    where, most = f"the DFlash drafter {draft} (block size {block_size})", block_size - 1
    given = {k: ctx.get_parameter_source(k).name != "DEFAULT" for k in ("topks", "probe_steps")}
    if given["topks"] and max(topks) > 1:
        raise OptionError(
            f"--topks {','.join(map(str, topks))} names EAGLE-3 tree widths; {where} proposes "
            "chains only: drop --topks"
        )
    if given["probe_steps"] and probe_steps > most:
        raise OptionError(
            f"--probe-steps {probe_steps}: {where} proposes at most {most} drafts per round: "
            f"pass --probe-steps 1..{most}"
        )
    depth = probe_steps if given["probe_steps"] else most
    return depth, (1,), spec_from_flags(False, draft, steps, 1, num_draft_tokens)


def _run_tune(console, target: str, draft: str, prompts: str, suite: str, cfg, device: str, dtype):
    """tune on --suite's chats (`bench.tune_suite.tune_suite_paths`: report, rows per category,
    the suite) or on --prompts (`bench.tune.tune_paths`: report, no rows, no suite)."""
    from specdraft.train.progress import status_while

    with status_while("tune: loading torch and the engine", plain=False):  # torch, transformers
        from specdraft.bench.tune import TunedPair, tune_paths

    def say(text: str) -> None:
        console.print(text, markup=False)

    pair = TunedPair(target, draft, device, engine_dtype(dtype))
    if not suite:
        return tune_paths(pair, prompts, cfg, progress=say), [], None
    from specdraft.bench.suites import load_suite
    from specdraft.bench.tune_suite import tune_suite_paths

    chosen = load_suite(suite)
    report, rows = tune_suite_paths(pair, chosen, cfg, progress=say)
    return report, rows, chosen


def _render_tune(console, report, rows, chosen, json_out: str) -> None:
    """tune's report (`bench.tune_render.render`), its categories with --suite, and --json-out."""
    from specdraft.bench.tune_render import render
    from specdraft.files import atomic_write_text

    console.print(render(report), markup=False, highlight=False, soft_wrap=True)
    if rows:
        from specdraft.bench.tune_suite import render_categories

        console.print(
            render_categories(chosen, rows, report.recommendation is not None),
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
    if json_out:
        data = {**report.to_dict(), **({"categories": [r.to_dict() for r in rows]} if rows else {})}
        atomic_write_text(json_out, json.dumps(data, indent=2))


def _refuse_bad_json_out(json_out: str) -> None:
    """--json-out: empty, or a file path in an existing directory (OptionError before tuning)."""
    from pathlib import Path

    if json_out and (Path(json_out).is_dir() or not Path(json_out).resolve().parent.is_dir()):
        raise OptionError(f"--json-out {json_out}: give a file path in an existing directory")
