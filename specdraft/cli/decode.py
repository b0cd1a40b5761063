"""Commands that decode with specdraft's engine here: generate, demo (serve: `cli.serve`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Annotated, Literal

import typer

from specdraft.cli.checks import check_device, check_model_dir
from specdraft.cli.common import app, make_console, set_threads, user_errors
from specdraft.cli.declared import OptionGroup
from specdraft.cli.engine_setting import EngineRun, PlainDrafting, decoding_spec, warm_up_compiled
from specdraft.cli.options import (
    ChatTemplate,
    PlainDraft,
    TargetDir,
    Threads,
    TopP,
    flag,
    option,
)
from specdraft.cli.reading import engine_reading, refuse_bad_configs
from specdraft.demo.config import NUM_HELDOUT
from specdraft.draft_config import EAGLE3_METHODS

Prompt = Annotated[str, typer.Option(help="Prompt text (tokenized as is, no chat template).")]
Temperature = Annotated[
    float, option(0.0, min=0.0, help="0 = greedy (output = the target's greedy output).")
]
SamplingTopK = Annotated[
    int, option(0, min=0, help="Sample from the k most likely tokens (0 = off).")
]
MaxNewTokens = Annotated[
    int,
    option(
        128,
        min=1,
        help="Most tokens to generate after the prompt (fewer at EOS "
        "unless --ignore-eos); prompt + these must fit the engine's longest request.",
    ),
]
NoSpec = flag("--no-spec", help="Plain decoding on the same engine, even with --draft.")
IgnoreEos = flag(
    "--ignore-eos",
    help="Do not stop at the target's EOS ids (the tokenizer's and "
    "generation_config.json's eos_token_id).",
)
Seed = Annotated[int, option(0, help="Sampling seed.")]


@app.command()
def generate(
    target: TargetDir,
    prompt: Prompt,
    draft: PlainDraft,
    temperature: Temperature,
    top_p: TopP,
    sampling_top_k: SamplingTopK,
    drafting: PlainDrafting,
    max_new_tokens: MaxNewTokens,
    no_spec: NoSpec,
    ignore_eos: IgnoreEos,
    seed: Seed,
    run: EngineRun,
) -> None:
    """Generate with specdraft's engine: speculative decoding with --draft, plain decoding without it
    (or with --no-spec). stdout: the prompt and its continuation, streamed (`> out.txt` keeps the text
    alone); stderr: notes, then the metrics table. Errors are one line on stderr; exit 2: a bad option
    value or combination (before anything loads) or an unusable input (a weights file cut short,
    a config.json that is not valid, a target without a tokenizer), 1: an input refused while
    loading or generating."""
    spec = decoding_spec(
        drafting, draft, no_spec, run.compile, run.device, plain_without_draft=True
    )
    console, info = make_console(), make_console(stderr=True)  # the text; what is said about it
    busy = _busy_note(run.device, run.threads)
    sampling = {"temperature": temperature, "top_p": top_p, "top_k": sampling_top_k, "seed": seed}
    with user_errors(info):
        set_threads(run.threads)
        engine, tokenizer = _load_engine(target, draft, spec, drafting, run, info)
        # verbose=False: the length check below says more than the tokenizer's warning
        ids = tokenizer(prompt, verbose=False)["input_ids"]
        engine.check_limits(len(ids), max_new_tokens)  # before the prompt is echoed
        if run.compile:  # compile and capture first: the metrics below are then the engine's
            warm_up_compiled(
                lambda n: engine.generate(ids, min(max_new_tokens, n), **sampling), info
            )
        result = _echo_and_generate(
            console, engine, prompt, ids, max_new_tokens, tokenizer, sampling, target, ignore_eos
        )
    console.print()
    _print_generate_summary(info, engine, result, no_spec, run.compile, busy)


def _busy_note(device: str, threads: int):
    """The busy-machine note for generate's tokens/s on the CPU (`machine_load.busy_note`)."""
    from specdraft.machine_load import busy_note

    if device != "cpu":
        return None
    remedy = "fewer threads (e.g. --threads 1) compete less" if threads != 1 else ""
    return busy_note("the tokens/s above", remedy)


def _load_engine(target: str, draft: str, spec, drafting: PlainDrafting, run: EngineRun, info):
    """generate's engine and the target's tokenizer: the configs checked (`refuse_bad_configs`),
    the drafter's aux ids read by --target (`id_reading`) when it decodes speculatively, the
    tokenizer (`targets.tokenizer.load_target_tokenizer`), then `engine.load.load_engine`; the drafter's method and the engine's notes printed to `info`."""
    from specdraft.dflash import drafter_label
    from specdraft.engine.load import load_engine
    from specdraft.targets.tokenizer import load_target_tokenizer

    refuse_bad_configs(draft if spec is not None else "", target)
    reading = engine_reading(
        spec is not None, target, draft, drafting.aux_layers, drafting.sglang_version
    )
    tokenizer = load_target_tokenizer(target)
    engine = load_engine(
        target,
        draft if spec is not None else None,
        spec,
        run.device,
        run.torch_dtype(),
        run.max_seq_len or None,
        tokenizer,
        compile=run.compile,
        reading=reading,
    )
    if engine.draft is not None:
        info.print(
            f"drafter {draft}: {drafter_label(engine.draft.cfg)}", markup=False, soft_wrap=True
        )
    for note in engine.notes:
        info.print(f"note: {note}", markup=False, soft_wrap=True)
    return engine, tokenizer


def _echo_and_generate(
    console,
    engine,
    prompt: str,
    ids: list[int],
    max_new_tokens: int,
    tokenizer,
    sampling: dict,
    target: str,
    ignore_eos: bool,
):
    """Echo the prompt (dim), then stream the generated text after it on the same line, up to the
    target directory's end ids (`target.config.end_token_ids`, read before the echo) unless
    `ignore_eos`; an error raised by the engine (or Ctrl-C) first ends that line, so its message
    starts a line of its own."""
    from specdraft.targets.config import end_token_ids

    eos = [] if ignore_eos else end_token_ids(tokenizer, target)
    console.print(prompt, end="", style="dim", markup=False, highlight=False, soft_wrap=True)
    try:
        return engine.generate(
            ids,
            max_new_tokens,
            eos_ids=eos,
            on_tokens=_text_printer(console, tokenizer, ids),
            **sampling,
        )
    except BaseException:
        console.print()
        raise


def _text_printer(console, tokenizer, prompt_ids: list[int]):
    """generate's stream callback: prints the text each batch of new ids adds after the prompt
    (`decode_continuation` of the whole output so far, minus what was printed)."""
    from specdraft.engine.requests import decode_continuation

    output: list[int] = []
    shown = 0

    def stream(new_ids: list[int]) -> None:
        nonlocal shown
        output.extend(new_ids)
        text = decode_continuation(tokenizer, prompt_ids, output)
        console.print(text[shown:], end="", markup=False, highlight=False, soft_wrap=True)
        shown = len(text)

    return stream


def _print_generate_summary(
    console, engine, result, no_spec: bool, compile: bool, busy: str | None
) -> None:
    """generate's metrics table under the engine's setting (plain decoding: with --no-spec or
    without --draft), the kernels a --compile run used, that one run is no speed measurement (naming
    tune and bench), and the busy-machine note when there is one."""
    from specdraft.engine.metrics import metrics_table

    spec = engine.spec
    setting = (
        f"speculative decoding (steps {spec.num_steps}, topk {spec.topk}, draft tokens {spec.num_draft_tokens})"
        if spec is not None
        else "plain decoding" + ("" if no_spec else " (no --draft)")
    )
    console.print(
        metrics_table(result.metrics, setting)
        if engine.spec is not None
        else plain_metrics_table(result.metrics, setting)
    )
    if compile:
        drafter = f"; drafter steps: {engine.draft_kernels}" if engine.spec is not None else ""
        console.print(
            f"target forwards of up to 16 tokens: {engine.target_kernels} kernels{drafter}",
            markup=False,
        )
    console.print(ONE_RUN, markup=False, soft_wrap=True)
    if busy:
        console.print(busy, style="yellow", markup=False, soft_wrap=True)


ONE_RUN = (
    "one generation is no speed measurement (one prompt, one pass, not warmed up): "
    "`specdraft tune` times settings against plain decoding in rounds on this engine, "
    "`specdraft bench` a server"
)


def plain_metrics_table(metrics, title: str):
    """A rich table of plain decoding's SpecMetrics: tokens and time only (tau is 1, nothing is drafted)."""
    from rich.table import Table

    table = Table(title=title)
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_row("output tokens", f"{metrics.num_output_tokens}")
    table.add_row(
        "time prefill / decode (s)",
        f"{metrics.time_prefill_s:.3f} / {metrics.time_total_s - metrics.time_prefill_s:.3f}",
    )
    table.add_row("tokens/s", f"{metrics.tokens_per_s:.1f}")
    return table


def _dflash_demo(cfg, console) -> None:
    """demo --method dflash (`demo.dflash.run_dflash_demo`), then its comparison printed."""
    from specdraft.demo.dflash import dflash_summary, run_dflash_demo

    result = run_dflash_demo(cfg, console)
    console.print(dflash_summary(result, cfg.out), markup=False, highlight=False)


@dataclass(frozen=True)
class DemoOptions(OptionGroup):
    """demo's options, in --help's order (`declared.OptionGroup`): each a `DemoConfig` field of its
    name (`config`), "" for a path left out (the bundled target and data, the tokenizer's
    template)."""

    out: Annotated[
        str, option("specdraft-demo", help="Working directory; a re-run resumes from it.")
    ]
    device: Annotated[
        str,
        option(
            "cpu", help="Device every stage runs on: cpu, cuda or cuda:N.", callback=check_device
        ),
    ]
    target: Annotated[
        str,
        option(
            "",
            help="A local transformers model (default: the bundled stories260K).",
            callback=check_model_dir,
        ),
    ]
    data: Annotated[
        str,
        option(
            "",
            help="Text file of documents separated by blank lines, or JSONL with a "
            '"text" field per line (default: the TinyStories sample); with --chat-template, JSONL '
            "chats.",
        ),
    ]
    chat_template: ChatTemplate
    train_steps: Annotated[int, option(1000, help="Drafter optimizer steps.")]
    method: Annotated[
        Literal[(*EAGLE3_METHODS, "dflash")],  # demo.config.METHODS
        option(
            "eagle3",
            help="Drafter to train: eagle3, or eagle3.1 (a norm on each aux state before fc, the "
            "post-norm state fed back: fc_norm, norm_output); as `specdraft train --method`; "
            "dflash: a DFlash block drafter trained beside the EAGLE-3 one on the same data, "
            "both's tau and speedup printed.",
        ),
    ]
    block_size: Annotated[
        int, option(8, min=2, help="The DFlash drafter's block size (--method dflash).")
    ]
    num_train: Annotated[
        int,
        option(
            800,
            help=f"Training documents (at least 2). The demo also holds out {NUM_HELDOUT} "
            f"documents of --data for its timing and doctor, so --data needs --num-train + "
            f"{NUM_HELDOUT}.",
        ),
    ]
    threads: Threads

    def config(self):
        """The `demo.config.DemoConfig` of these options (it checks them: ConfigError)."""
        from pathlib import Path

        from specdraft.demo.config import DemoConfig

        given = asdict(self)
        given["out"] = Path(self.out)
        for name in ("target", "data", "chat_template"):  # "": left out
            given[name] = Path(given[name]) if given[name] else None
        return DemoConfig(**given)


@app.command()
def demo(options: DemoOptions) -> None:
    """Run the whole pipeline on a real target and write report.md with plots. Stages, in the order
    they run and print: target, data, regenerate, capture, train, speculative generation vs plain
    decoding (picks the setting), export, doctor; then the generation table and where files are.
    --method dflash: the stages up to training, the EAGLE-3 drafter and a DFlash drafter on the
    same store, then plain decoding, EAGLE-3 chains and DFlash blocks timed on the held-out
    prompts, then the DFlash drafter exported for vLLM and SGLang with doctor on each export
    (report-dflash.json; report.md and the EAGLE-3 exports are the default demo's)."""
    from pathlib import Path

    from specdraft.demo.report import summary
    from specdraft.demo.run import run_demo

    console = make_console()
    # inputs are checked before any stage runs; a later stage's error is one line too
    with user_errors(
        console, interrupted=lambda: f"run the same command again to resume from {options.out}"
    ):
        cfg = options.config()
        if cfg.method == "dflash":
            return _dflash_demo(cfg, console)
        report = run_demo(cfg, console)
    console.print(summary(report, Path(options.out)), markup=False, highlight=False, soft_wrap=True)
    if report.busy:  # the load when the timing above ran (a re-run reuses both)
        console.print(report.busy, style="yellow", markup=False, soft_wrap=True)
