"""`specdraft train`: a drafter trained on a capture store or on the target online."""

from __future__ import annotations

import functools
from typing import Annotated, Any

import typer

from specdraft.cli.checks import check_model_dir, json_object
from specdraft.cli.common import SKIP_BAD_HINT, app, make_console, set_threads, user_errors
from specdraft.cli.options import (
    REASONING_HELP,
    ChatTemplate,
    DtypeName,
    ReasoningMode,
    Threads,
    argument,
    flag,
    option,
)
from specdraft.cli.train_options import with_settings

TrainSource = Annotated[
    str,
    argument(
        "SOURCE",
        "Capture store directory (`specdraft capture`); with --online, JSONL chats/texts, "
        "save_to_disk dir or text file.",
    ),
]
RunDir = Annotated[
    str, argument("OUT", "Run directory: checkpoints/, metrics.jsonl, tensorboard/, draft/.")
]
ConfigFile = Annotated[
    str, option("", help="TrainConfig JSON file; the options below override it.")
]
TrainTarget = Annotated[
    str,
    option(
        "",
        help="Target directory: the live target with --online; offline only when the store's "
        "recorded path moved.",
        callback=check_model_dir,
    ),
]
Online = flag("--online", help="Run --target on SOURCE's records at every step (no capture store).")
OnlineNoChat = flag("--no-chat", help="With --online: plain text (base models).")
OnlineTemplateKwargs = Annotated[
    str,
    option("{}", help="With --online: JSON kwargs for the chat template.", callback=json_object),
]
OnlineTokenizer = Annotated[
    str, option("", help="With --online: tokenizer directory (default: the target's).")
]
OnlineTargetDtype = Annotated[
    DtypeName | None,
    option(None, help="With --online: dtype the target runs in.  [default: float32]"),
]
OnlineSkipBad = flag("--skip-bad", help="With --online: skip and count bad records.")
OnlineReasoning = Annotated[
    ReasoningMode | None,
    option(None, help=f"With --online: {REASONING_HELP}  [default: keep]"),
]
Resume = flag(
    "--resume",
    help="Continue from OUT's newest checkpoint with its settings (options left out come from "
    "it); a larger --steps / --epochs extends the run (the lr schedule is recomputed).",
)


@app.command()
@with_settings(after="config")
def train(
    ctx: typer.Context,
    source: TrainSource,
    out: RunDir,
    config: ConfigFile,
    target: TrainTarget,
    online: Online,
    no_chat: OnlineNoChat,
    template_kwargs: OnlineTemplateKwargs,
    chat_template: ChatTemplate,
    tokenizer: OnlineTokenizer,
    target_dtype: OnlineTargetDtype,
    skip_bad: OnlineSkipBad,
    reasoning: OnlineReasoning,
    resume: Resume,
    threads: Threads,
    **settings: Any,
) -> None:
    """Train a drafter on SOURCE into OUT: EAGLE-3 (--method eagle3, the default, or eagle3.1) or DFlash (--method dflash); several GPUs: torchrun --nproc-per-node N -m specdraft.cli train ....

    The device is chosen automatically: the GPU when torch sees one (under torchrun, each rank's
    LOCAL_RANK GPU), else the CPU.
    """
    from specdraft.train.config import ONLINE_OPTIONS, run_config, train_source
    from specdraft.train.loop import train as run_training
    from specdraft.train.run_dir import interrupted_message

    console = make_console()
    say = functools.partial(console.print, markup=False, soft_wrap=True)
    with user_errors(console, SKIP_BAD_HINT, interrupted=lambda: interrupted_message(out)):
        set_threads(threads)
        data = train_source(source, online, target, **{k: ctx.params[k] for k in ONLINE_OPTIONS})
        cfg = run_config(config, out, resume, say, **settings)
        result = run_training(
            cfg,
            data,
            out,
            resume=resume,
            command=command_line(),
            target_config=target or None,
            on_note=lambda text: say(f"note: {text}"),
        )
    _render_train(console, out, cfg, result)


def command_line() -> str:
    """This process's command as the manifest records it: `specdraft` and its arguments."""
    import sys

    return " ".join(["specdraft", *sys.argv[1:]])


def _render_train(console, out: str, cfg, result) -> None:
    """What a finished `specdraft train` prints on rank 0: steps, loss, files, a warm-up note, validation."""
    if result.draft_dir is None:
        return  # not rank 0
    if result.train_loss is None:  # resumed at the last step
        console.print(
            f"{out} is already at step {result.steps} of {result.steps}: nothing to train; draft "
            f"{result.draft_dir}",
            markup=False,
            soft_wrap=True,
        )
    else:
        console.print(
            f"{result.steps} steps, last train loss {result.train_loss:.4f}; draft "
            f"{result.draft_dir}; metrics {result.metrics_path}",
            markup=False,
        )
    if result.validation:
        _render_validation(console, result.validation)
        if result.validation["tau"] < LOW_TAU:
            console.print(low_tau_note(result.validation["tau"], result.steps, cfg), markup=False)


# a simulated tau below it: the drafter accepts almost nothing (a drafter worth serving reaches 2+)
LOW_TAU = 1.1


def low_tau_note(tau: float, steps: int, cfg) -> str:
    """What a drafter that accepts almost nothing means, and its likely causes in this run."""
    causes = []
    if cfg.warmup_steps >= steps:
        causes.append(f"the lr warm-up ({cfg.warmup_steps} steps) outlasted the run")
    causes.append(
        f"too little training ({steps} steps at --lr {cfg.lr}: small data or short runs need a "
        "larger lr, e.g. --lr 3e-3 as the demo)"
    )
    causes.append("too little data (capture more samples)")
    return (
        f"warning: simulated tau {tau:.3f} < {LOW_TAU}: this drafter accepts almost nothing and "
        f"speculation with it would be slower than none; likely: {'; '.join(causes)}"
    )


def _render_validation(console, validation: dict) -> None:
    acc = " ".join(f"{a:.3f}" for a in validation["accuracy"])
    alpha = " ".join(f"{a:.3f}" for a in validation["alpha"])
    console.print(
        f"validation accuracy per step {acc}; alpha {alpha}; simulated tau {validation['tau']:.3f}",
        markup=False,
    )
    if validation.get("block_tau") is not None:
        p = " ".join(f"{a:.3f}" for a in validation["block_acceptance"])
        console.print(
            f"blocks at {validation['blocks']} anchors sampled uniformly from the validation "
            f"text, each scored as an engine's round there at T = 0: p_k {p}, tau "
            f"{validation['block_tau']:.3f}",
            markup=False,
        )
    if validation.get("replayed_tau") is not None:
        steps = len(validation["accuracy"])
        p = " ".join(f"{a:.3f}" for a in validation["replayed_acceptance"])
        after = (
            " (each round's anchor the token after the last accepted one, as the engine runs: "
            "what it measures on this text)"
            if validation.get("block_tau") is not None
            else ""
        )
        console.print(
            f"a {steps}-step chain engine's rounds at T = 0 walked over the validation text"
            f"{after}: p_k {p}, tau {validation['replayed_tau']:.3f} over "
            f"{validation['replayed_rounds']} rounds",
            markup=False,
        )
