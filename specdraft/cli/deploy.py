"""Commands that ready a drafter for an engine: export, doctor."""

from __future__ import annotations

from typing import Annotated

import typer

from specdraft.cli.checks import check_doctor_drafter, check_drafter, check_model_dir, json_object
from specdraft.cli.common import (
    REDIRECTED_TEXT_WIDTH,
    SKIP_BAD_HINT,
    OptionError,
    app,
    make_console,
    user_errors,
)
from specdraft.cli.convert import derived_text
from specdraft.cli.options import (
    AuxOverride,
    ChatTemplate,
    DoctorEngine,
    DtypeName,
    ExportEngine,
    ExportNumDraftTokens,
    ExportNumSteps,
    ExportTopk,
    SglangVersion,
    TrustRemoteCode,
    argument,
    flag,
    option,
)
from specdraft.cli.reading import id_reading, read_target
from specdraft.train.progress import status_while

ExportCheckpoint = Annotated[
    str,
    argument(
        "CHECKPOINT",
        "Drafter directory (e.g. RUN/draft), or a training checkpoint "
        "of --save-every (RUN/checkpoints/step-N.pt).",
        callback=check_drafter,
    ),
]
ExportOut = Annotated[str, argument("OUT", "Output directory (replaced atomically).")]
ExportEngineOption = Annotated[ExportEngine, typer.Option(help="Engine to export for.")]
ExportTarget = Annotated[
    str,
    option("", help="Target directory (default: the manifest's record).", callback=check_model_dir),
]
Verifier = Annotated[
    str,
    option(
        "",
        help="speculators verifier.name_or_path (must resolve where "
        "the server runs; default: the target's absolute path).",
    ),
]
CastDtype = Annotated[DtypeName | None, option(None, help="Cast floating tensors (default: keep).")]

DoctorCheckpoint = Annotated[
    str,
    argument(
        "CHECKPOINT",
        "Draft checkpoint directory (any layout; a training checkpoint: export it first).",
        callback=check_doctor_drafter,
    ),
]
DoctorTarget = Annotated[
    str,
    option(
        "",
        help="Target directory: capture parity, acceptance, tokenizer.",
        callback=check_model_dir,
    ),
]
DoctorEngineOption = Annotated[
    DoctorEngine | None,
    option(
        None,
        help="Engine to check for (default: from --engine-args, "
        "else all; a speculators drafter: vllm, which serves it).",
    ),
]
EngineArgs = Annotated[str, option("", help="The engine's launch command line, quoted.")]
Samples = Annotated[
    str,
    option(
        "",
        help="Capture store, JSONL (token ids, chats or texts) or a suite name "
        "(mt-bench, humaneval, gsm8k: prompts for --server and render parity).",
    ),
]
DoctorSkipBad = flag("--skip-bad", help="Skip bad --samples records instead of refusing the file.")
DoctorWait = Annotated[
    float,
    option(
        120.0,
        min=0,
        help="Seconds to wait for a --server that refuses connections (still "
        "starting) before the online check fails; 0: try once.",
    ),
]
Server = Annotated[
    str,
    option(
        "",
        help="Live server URL, e.g. http://127.0.0.1:8000 or .../v1 (online "
        "acceptance; needs --samples: prompts with the target's own outputs, e.g. the "
        "demo's store-heldout, or a suite's prompts).",
    ),
]
ServerTemplateKwargs = Annotated[
    str, option("", help="The server's chat template kwargs (JSON).", callback=json_object)
]
MaxSamples = Annotated[int, option(32, min=1, help="Samples for the offline run.")]
JsonOutput = flag("--json", help="Print the report as JSON.")
Strict = flag(
    "--strict", help="Exit 1 when a check is skipped too (an input it needs is not given)."
)


@app.command()
def export(
    checkpoint: ExportCheckpoint,
    out: ExportOut,
    engine: ExportEngineOption,
    target: ExportTarget,
    verifier: Verifier,
    sglang_version: SglangVersion,
    num_steps: ExportNumSteps,
    topk: ExportTopk,
    num_draft_tokens: ExportNumDraftTokens,
    dtype: CastDtype,
    aux_layers: AuxOverride,
    trust_remote_code: TrustRemoteCode,
) -> None:
    """Write CHECKPOINT for one engine, prove every tensor bit-identical, print the launch command.
    Exit 2: a bad option value or combination (an invalid --num-steps / --topk / --num-draft-tokens
    triple included, before anything loads) or an unusable input; 1: an export refused."""
    from specdraft.export import export_draft, spec_for_export

    console = make_console()
    given = options_given(num_steps, topk, num_draft_tokens, aux_layers, sglang_version)
    if is_dflash_source(checkpoint):
        inputs = {"target": target, "verifier": verifier, "dtype": dtype, "num_steps": num_steps}
        export_block_drafter(console, checkpoint, out, engine, inputs, given, trust_remote_code)
        return
    with user_errors(
        None
    ):  # the options alone (ExportOptionError: exit 2), as generate's and serve's
        spec = spec_for_export(engine, num_steps or 3, topk or 1, num_draft_tokens or None)
    with user_errors(console):
        reading = id_reading(
            read_target(target, trust_remote_code), aux_layers, sglang_version, checkpoint, target
        )
        result = export_draft(
            checkpoint,
            out,
            engine=engine,
            target=target or None,
            verifier=verifier or None,
            sglang_version=sglang_version or None,
            num_steps=spec.num_steps,
            topk=spec.topk,
            num_draft_tokens=spec.num_draft_tokens,
            dtype=dtype or None,
            aux_layers=reading.aux_layers,
            trust_remote_code=trust_remote_code,
        )
    setting = [g for g in given if g in ("--num-steps", "--topk", "--num-draft-tokens")]
    print_exported(console, result, engine, checkpoint, dtype, setting)


def options_given(num_steps, topk, num_draft_tokens, aux_layers, sglang_version) -> list[str]:
    """The EAGLE-3 options export was given, by name (--num-steps, --topk, --num-draft-tokens
    first, as `print_exported` names them; then --aux-layers, --sglang-version)."""
    values = {
        "--num-steps": num_steps,
        "--topk": topk,
        "--num-draft-tokens": num_draft_tokens,
        "--aux-layers": aux_layers,
        "--sglang-version": sglang_version,
    }
    return [name for name, value in values.items() if value]


def is_dflash_source(checkpoint: str) -> bool:
    """Whether export's CHECKPOINT is a DFlash drafter, a directory or a DFlash run's training
    checkpoint (`checkpoint.dflash.is_dflash_drafter`; `export.dflash`)."""
    from specdraft.checkpoint.dflash import is_dflash_drafter

    return is_dflash_drafter(checkpoint)


def export_block_drafter(console, checkpoint, out, engine, inputs, given, remote_code) -> None:
    """export of a DFlash drafter: EAGLE-3 settings refused (ExportOptionError: exit 2), then
    `export_dflash` and its lines: what was written, the notes, the launch command serving the
    trained block."""
    from specdraft.export.dflash import export_dflash, refuse_eagle3_options

    inputs = {name: value or None for name, value in inputs.items()}
    with user_errors(console):
        refuse_eagle3_options(checkpoint, given)
        result = export_dflash(checkpoint, out, engine, trust_remote_code=remote_code, **inputs)
    cast = f" cast to {inputs['dtype']}" if inputs["dtype"] else ""
    console.print(
        f"wrote {result.out_dir} for {engine}: DFlash drafter, {result.num_tensors} tensors, "
        f"each bit-identical to the checkpoint{cast}",
        style="green",
        markup=False,
    )
    for note in result.notes:
        console.print(f"note: {note}", markup=False, soft_wrap=True)
    setting = "--speculative-num-draft-tokens" if engine == "sglang" else "num_speculative_tokens"
    console.print(
        f"launch (block {result.block_size}: {setting} {result.num_speculative_tokens}):",
        markup=False,
    )
    console.print(result.launch_command, markup=False, soft_wrap=True, highlight=False)


def print_exported(console, result, engine: str, checkpoint: str, dtype: str | None, given) -> None:
    """export's lines: what was written (the method its config.json gives the engine:
    `draft_config.method_label`) and proven, its notes, then the launch command under the
    setting it serves (`launch_heading`; `given`: the setting options passed)."""
    from specdraft.draft_config import method_label

    console.print(
        f"wrote {result.out_dir} for {engine}: {method_label(result.config)}, "
        f"{result.num_tensors} tensors, each "
        f"bit-identical to the checkpoint{' cast to ' + dtype if dtype else ''}"
        + derived_text(result.derived, checkpoint),
        style="green",
        markup=False,
    )
    for note in result.notes:
        console.print(f"note: {note}", markup=False, soft_wrap=True)
    console.print(launch_heading(result.spec, given), markup=False, soft_wrap=True)
    console.print(result.launch_command, markup=False, soft_wrap=True, highlight=False)


def launch_heading(spec, given: list[str]) -> str:
    """The line above export's launch command: the speculative setting it serves and where that
    came from (`given`: the setting options passed; the rest are export's defaults)."""
    setting = f"steps {spec.num_steps}, topk {spec.topk}, draft tokens {spec.num_draft_tokens}"
    if len(given) == 3:
        return f"launch ({setting}, as given):"
    if given:
        return f"launch ({setting}: {', '.join(given)} as given, the rest export's defaults):"
    return (
        f"launch ({setting}: export's default, not tuned; the demo's summary and specdraft tune measure the "
        "fastest setting: pass theirs as --num-steps, --topk, --num-draft-tokens):"
    )


@app.command()
def doctor(
    checkpoint: DoctorCheckpoint,
    target: DoctorTarget,
    engine: DoctorEngineOption,
    engine_args: EngineArgs,
    samples: Samples,
    skip_bad: DoctorSkipBad,
    wait: DoctorWait,
    server: Server,
    sglang_version: SglangVersion,
    aux_layers: AuxOverride,
    trust_remote_code: TrustRemoteCode,
    template_kwargs: ServerTemplateKwargs,
    chat_template: ChatTemplate,
    max_samples: MaxSamples,
    json_output: JsonOutput,
    strict: Strict,
) -> None:
    """Check a drafter against its training record, target and deployment (exit 1 on a fail, on a
    skip with --strict, or on a target and drafter directory given in each other's place, 2 on
    other unusable inputs: a CHECKPOINT without a drafter config, a CHECKPOINT or --target
    config.json that is not valid JSON or a weights file of either cut short, a --samples file
    that cannot be read)."""
    with status_while("doctor: loading torch and its checks", plain=False):  # torch, transformers
        from specdraft.doctor import run_doctor

    console = make_console()
    # an input doctor cannot judge (a ValueError) is a usage error: exit 2, not 1
    with user_errors(console, SKIP_BAD_HINT, usage_errors=ValueError):
        if server:
            check_server_samples(server, samples)
        reading = id_reading(read_target(target, trust_remote_code), aux_layers, sglang_version)
        report = run_doctor(
            checkpoint,
            target=target or None,
            engine=engine or None,
            engine_args=engine_args or None,
            samples=samples or None,
            server=server or None,
            sglang_version=sglang_version or None,
            aux_layers=reading.aux_layers,
            trust_remote_code=trust_remote_code,
            max_samples=max_samples,
            skip_bad=skip_bad,
            server_wait_s=wait,
            template_kwargs=template_kwargs,
            chat_template=chat_template or None,
        )
    print_report(console, report, checkpoint, json_output, strict)


def print_report(console, report, checkpoint: str, json_output: bool, strict: bool) -> None:
    """doctor's report, as JSON or a table with its notes; exit 1 on a fail, or with `strict` on a
    skip (said in a line after the table; JSON stays parseable)."""
    from specdraft.doctor import report_json, report_table

    if json_output:
        typer.echo(report_json(report))
    else:
        console.print(
            report_table(
                report,
                f"specdraft doctor {checkpoint}",
                expand=console.is_terminal,
                wrap_at=None if console.is_terminal else REDIRECTED_TEXT_WIDTH,
            )
        )
        for note in report.notes:
            console.print(f"note: {note}", markup=False, soft_wrap=True)
    skipped = report.counts()["skip"]
    if strict and skipped and report.ok and not json_output:
        console.print(
            f"--strict: {skipped} check{'s' * (skipped != 1)} skipped",
            style="bold red",
            markup=False,
        )
    if not report.ok or (strict and skipped):
        raise typer.Exit(1)


def check_server_samples(server: str, samples: str) -> None:
    """doctor --server: a URL `client.check_url` accepts, and --samples to prompt it with
    (OptionError naming the fix otherwise)."""
    from specdraft.client import check_url

    check_url(server, "--server")
    if not samples:
        raise OptionError(
            f"--server {server} needs --samples: pass --samples FILE with the target's own "
            "outputs (a capture store or JSONL, e.g. the demo's store-heldout) for the online "
            "acceptance check"
        )
