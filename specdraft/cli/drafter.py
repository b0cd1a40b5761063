"""Commands on a drafter on disk: inspect, convert, export, doctor."""

from __future__ import annotations

import json

import typer

from specdraft.cli.common import (
    AUX_NEEDS_TARGET,
    DRAFTER_HELP,
    NUM_DRAFT_TOKENS_HELP,
    NUM_STEPS_HELP,
    REDIRECTED_TEXT_WIDTH,
    SKIP_BAD_HINT,
    TOPK_HELP,
    TRUST_REMOTE_CODE_HELP,
    USAGE_ERROR,
    DoctorEngine,
    DtypeName,
    ExportEngine,
    Layout,
    app,
    argument,
    aux_override,
    check_doctor_drafter,
    check_drafter,
    check_model_dir,
    error,
    flag,
    id_reading,
    json_kwargs,
    make_console,
    read_target,
    refuse_bad_configs,
    sglang_version_option,
    user_errors,
)


@app.command()
def inspect(
    checkpoint: str = argument("CHECKPOINT", DRAFTER_HELP + ".", callback=check_drafter),
    target: str = typer.Option(
        "",
        help="Target directory: needed to read aux ids without a manifest.",
        callback=check_model_dir,
    ),
    manifest: bool = flag(
        "--manifest", help="Print the whole manifest as JSON (default: one line per field)."
    ),
    aux_layers: str | None = typer.Option(None, help=AUX_NEEDS_TARGET, callback=aux_override),
    trust_remote_code: bool = flag("--trust-remote-code", help=TRUST_REMOTE_CODE_HELP),
    sglang_version: str = sglang_version_option(),
    known_keys: bool = flag(
        "--known-keys",
        help="List the config.json keys specdraft reads or knows to be "
        "harmless, and CHECKPOINT's others, instead (exit 1 when it has others).",
    ),
) -> None:
    """Show a drafter's layout, tensors, manifest and audit verdict (exit 1 on a failed audit); a
    drafter without a manifest, given no --target: its files alone (layout, tensors, aux ids as written)."""
    from rich.table import Table

    from specdraft.checkpoint import (
        audit,
        describe_layout,
        is_training_checkpoint,
        load_draft,
        state_dict_for_layout,
    )
    from specdraft.checkpoint.layouts import TargetNeeded
    from specdraft.draft import NORM_FLAGS

    console = make_console()
    if known_keys:
        print_known_keys(console, checkpoint)
    with user_errors(console):
        refuse_bad_configs(checkpoint, "")
        reading = id_reading(
            read_target(target, trust_remote_code), aux_layers, sglang_version, checkpoint, target
        )
        try:
            loaded = load_draft(checkpoint, **reading)
        except TargetNeeded:  # the config passed the loader's checks: show what the files alone say
            print_files_without_target(console, checkpoint)
            return
    training = loaded.manifest.training if is_training_checkpoint(checkpoint) else None
    described = (
        f"training checkpoint (step {training['steps']}; export or convert writes its drafter files)"
        if training
        else describe_layout(loaded.layout, loaded.manifest is not None)
    )
    console.print(f"{checkpoint}: {described}", markup=False, soft_wrap=True)
    print_aux_note(console, checkpoint, loaded.manifest, reading)
    table = Table()
    for column in ("tensor", "shape", "dtype"):
        table.add_column(column)
    for name, tensor in state_dict_for_layout(loaded.model, loaded.layout).items():
        table.add_row(name, str(tuple(tensor.shape)), str(tensor.dtype).removeprefix("torch."))
    console.print(table)
    cfg = loaded.model.cfg
    variant = [name for name in NORM_FLAGS if getattr(cfg, name)]
    console.print(
        f"aux layers (specdraft indices): {list(cfg.aux_layers)} of {cfg.target_num_layers}; "
        f"hidden {cfg.hidden_size}, target hidden {cfg.target_hidden_size}; "
        f"draft vocab {cfg.draft_vocab_size} of {cfg.vocab_size}; "
        f"variant flags: {', '.join(variant) or 'none (plain EAGLE-3)'}",
        markup=False,
        soft_wrap=True,
    )
    if loaded.manifest is not None and manifest:
        console.print_json(loaded.manifest.to_json())
    elif loaded.manifest is not None:
        for line in _manifest_lines(json.loads(loaded.manifest.to_json())):
            console.print(line, markup=False, soft_wrap=True)
    problems = audit(loaded.model, loaded.manifest)
    for problem in problems:
        console.print(f"audit: FAIL {problem}", style="red", markup=False)
    if problems:
        raise typer.Exit(1)
    console.print("audit: PASS", style="green")


def print_files_without_target(console, checkpoint: str) -> None:
    """inspect of a manifest-less drafter without --target: its layout, its tensors as the loader's
    reader finds them in the files (`checkpoint.read_weights`) after the loader's key checks
    (`checkpoint.draft_tensors` on `layouts.config_without_target`: a name that matches no parameter,
    a parameter not in the file or a wrong shape raises CheckpointError, as `load_draft` does), the
    aux ids as config.json writes them (no reading: that needs the target's layer count and class),
    and what --target adds."""
    from pathlib import Path

    from rich.table import Table

    from specdraft.checkpoint import (
        describe_layout,
        detect_layout,
        draft_tensors,
        read_config,
        read_weights,
    )
    from specdraft.checkpoint.config_read import config_without_target
    from specdraft.conventions import AUX_KEY

    path = Path(checkpoint)
    config, (tensors, files), layout = read_config(path), read_weights(path), detect_layout(path)
    draft_tensors(
        config_without_target(path, layout, config, tensors), tensors, layout, files.entry
    )
    console.print(f"{checkpoint}: {describe_layout(layout, False)}", markup=False, soft_wrap=True)
    table = Table(title=f"tensors of {files.entry.name}")
    for column in ("tensor", "shape", "dtype"):
        table.add_column(column)
    for name, tensor in tensors.items():
        table.add_row(name, str(tuple(tensor.shape)), str(tensor.dtype).removeprefix("torch."))
    console.print(table)
    nested = (config.get("eagle_config") or {}).get(AUX_KEY)
    written = (
        [f"top-level {AUX_KEY} {config[AUX_KEY]} (vLLM reads them as-is)"]
        if config.get(AUX_KEY)
        else []
    )
    written += (
        [f"eagle_config's {nested} (SGLang adds 1 by the target's class and version)"]
        if nested
        else []
    )
    console.print(
        "aux ids as config.json writes them: "
        + (
            "; ".join(written)
            or "none (the engines' default [2, L//2, L-3] of the target's L layers)"
        ),
        markup=False,
        soft_wrap=True,
    )
    console.print(
        f"keys: every tensor of {files.entry.name} is one the {layout} layout loads, every parameter "
        "is in the file, shapes as config.json says (specdraft's loader checks)",
        markup=False,
        soft_wrap=True,
    )
    console.print(
        "--target DIR would add: the aux layers as specdraft indices (read by the target's layer count "
        "and class), the drafter's sizes and variant flags, and the audit (d2t / t2d, finite values; "
        "not run)",
        markup=False,
        soft_wrap=True,
    )


def print_known_keys(console, checkpoint: str) -> None:
    """inspect --known-keys: the known keys (`config_keys.known_keys_lines`), then CHECKPOINT's
    unknown ones, one a line; exits 0, or 1 when there are unknown ones."""
    from pathlib import Path

    from specdraft.checkpoint import UNIMPLEMENTED_FLAGS, is_training_checkpoint, read_config
    from specdraft.checkpoint.config_keys import known_keys_lines, unknown_config_keys

    for line in known_keys_lines(UNIMPLEMENTED_FLAGS):
        console.print(line, markup=False, soft_wrap=True)
    if is_training_checkpoint(checkpoint):
        console.print(
            f"{checkpoint}: a training checkpoint, no config.json: its drafter config is the manifest "
            "specdraft wrote, no other keys",
            markup=False,
            soft_wrap=True,
        )
        raise typer.Exit(0)
    with user_errors(console):
        refuse_bad_configs(checkpoint, "")
        unknown = unknown_config_keys(read_config(Path(checkpoint)), UNIMPLEMENTED_FLAGS)
    for entry in unknown:
        console.print(
            f"{checkpoint}/config.json: neither read nor known harmless: {entry}",
            style="red",
            markup=False,
            soft_wrap=True,
        )
    if not unknown:
        console.print(f"{checkpoint}/config.json: no other keys", markup=False, soft_wrap=True)
    raise typer.Exit(1 if unknown else 0)


def _manifest_lines(fields: dict) -> list[str]:
    """`inspect`'s manifest summary: one line per field, objects by their keys, long values cut."""
    lines = ["manifest (--manifest prints it whole):"]
    for key, value in fields.items():
        text = (
            f"{len(value)} fields" + (f": {', '.join(value)}" if value else "")
            if isinstance(value, dict)
            else json.dumps(value)
        )
        lines.append(f"  {key}: {text if len(text) <= 90 else text[:87] + '...'}")
    return lines


@app.command()
def convert(
    src: str = argument("SRC", DRAFTER_HELP + " (layout detected).", callback=check_drafter),
    dst: str = argument("DST", "Output directory."),
    layout: Layout = typer.Option(
        ...,
        help="sglang (official EAGLE-3: config.json + model.safetensors, no "
        "specdraft manifest) | speculators (vLLM's; keeps the manifest) | specdraft "
        "(the sglang files + specdraft's manifest)",
    ),
    target: str = typer.Option(
        "",
        help="Target directory: needed to read aux ids without a manifest.",
        callback=check_model_dir,
    ),
    aux_layers: str | None = typer.Option(None, help=AUX_NEEDS_TARGET, callback=aux_override),
    trust_remote_code: bool = flag("--trust-remote-code", help=TRUST_REMOTE_CODE_HELP),
    sglang_version: str = sglang_version_option(),
) -> None:
    """Rewrite a drafter in another layout, losslessly (every tensor checked bit-identical)."""
    from pathlib import Path

    from specdraft.checkpoint import (
        MANIFEST_FILE,
        convert_draft,
        describe_layout,
        detect_layout,
        has_manifest,
        is_training_checkpoint,
        read_config,
        verifier_replaced_note,
    )

    console = make_console()
    with user_errors(console):
        refuse_bad_configs(src, "")
        given = read_target(
            target, trust_remote_code
        )  # read once: aux ids and the verifier's architectures
        reading = id_reading(given, aux_layers, sglang_version, src, target)
        converted = convert_draft(
            src,
            dst,
            layout=layout,
            **reading,
            target_architectures=list(given.architectures or []) or None if given else None,
            target_name_or_path=str(Path(target).resolve()) if target else None,
        )
    print_aux_note(console, src, True if has_manifest(src) else None, reading)
    on_disk = describe_layout(
        detect_layout(Path(dst)), (Path(dst) / MANIFEST_FILE).is_file()
    )  # as inspect says
    files = ", ".join(sorted(p.name for p in Path(dst).iterdir()))
    console.print(
        f"wrote {dst} ({on_disk}): {files}; {converted.num_copied} tensors, each bit-identical to {src}"
        + derived_text(converted.derived, src),
        markup=False,
        soft_wrap=True,
    )
    if layout == "speculators":
        console.print(verifier_line(Path(dst)), markup=False, soft_wrap=True)
        written = json.loads((Path(dst) / "config.json").read_text())["speculators_config"][
            "verifier"
        ]["name_or_path"]
        replaced = (
            None
            if is_training_checkpoint(src)
            else verifier_replaced_note(read_config(Path(src)), written)
        )
        if replaced:
            console.print(f"note: {replaced}", markup=False, soft_wrap=True)
    if layout == "sglang" and has_manifest(src):
        console.print(
            f"{src}'s manifest is left out of the official layout (--layout specdraft keeps it); "
            "reading it back needs the target (--target DIR)",
            markup=False,
            soft_wrap=True,
        )
    print_flag_notes(console, Path(dst), layout)


def derived_text(derived: tuple[str, ...], source) -> str:
    """convert / export's words for the tensors derived because `source` has none (`checkpoint.derived_tensors`)."""
    return f"; {', '.join(derived)} derived from d2t ({source} has none)" if derived else ""


def verifier_line(dst) -> str:
    """What a speculators drafter at `dst` records as its verifier (vLLM's target when started on
    the drafter, `conventions.engines.SPECULATORS_VERIFIER_READ`), and how to fill what is missing."""
    from specdraft.conventions.engines import SPECULATORS_VERIFIER_READ

    verifier = json.loads((dst / "config.json").read_text())["speculators_config"]["verifier"]
    architectures = verifier.get("architectures")
    known = (
        f"architectures {architectures}"
        if architectures
        else "architectures unknown (pass --target DIR)"
    )
    if verifier.get("name_or_path"):
        return (
            f"verifier: {verifier['name_or_path']!r}, {known} (`vllm serve {dst}` serves it as the target: "
            "it must resolve on the serving host)"
        )
    return (
        f"note: verifier.name_or_path is null, so `vllm serve {dst}` has no target ({SPECULATORS_VERIFIER_READ}): "
        f"pass --target DIR to record its path, or launch vLLM on the target (specdraft export --engine vllm "
        f"prints the command); {known}"
    )


def print_flag_notes(console, path, layout: str) -> None:
    """A note per drafter flag that the engine a `layout` is written for does not implement
    (`conventions.engines.flag_refusal`): convert writes the flags as they are, export refuses them."""
    from specdraft.checkpoint import read_config
    from specdraft.checkpoint.config_read import norm_flags_of_config
    from specdraft.conventions.engines import flag_refusal

    engine = "speculators" if layout == "speculators" else "sglang"
    flags = norm_flags_of_config(path, read_config(path))
    for name in (name for name, on in flags.items() if on):
        reason = flag_refusal(engine, name)
        if reason:
            console.print(
                f"note: {reason}: do not serve {path} there (specdraft export --engine ENGINE "
                "checks what each engine computes)",
                markup=False,
                soft_wrap=True,
            )


@app.command()
def export(
    checkpoint: str = argument(
        "CHECKPOINT",
        "Drafter directory (e.g. RUN/draft), or a training checkpoint "
        "of --save-every (RUN/checkpoints/step-N.pt).",
        callback=check_drafter,
    ),
    out: str = argument("OUT", "Output directory (replaced atomically)."),
    engine: ExportEngine = typer.Option(..., help="Engine to export for."),
    target: str = typer.Option(
        "", help="Target directory (default: the manifest's record).", callback=check_model_dir
    ),
    verifier: str = typer.Option(
        "",
        help="speculators verifier.name_or_path (must resolve where "
        "the server runs; default: the target's absolute path).",
    ),
    sglang_version: str = sglang_version_option(),
    num_steps: int | None = typer.Option(
        None,
        min=1,
        help=NUM_STEPS_HELP + " in the launch command (vLLM: num_speculative_tokens); default 3.",
    ),
    topk: int | None = typer.Option(
        None, min=1, help=TOPK_HELP + "; default 1, a chain, the only shape vLLM runs."
    ),
    num_draft_tokens: int = typer.Option(0, min=0, help=NUM_DRAFT_TOKENS_HELP),
    dtype: DtypeName | None = typer.Option(None, help="Cast floating tensors (default: keep)."),
    aux_layers: str | None = typer.Option(None, help=AUX_NEEDS_TARGET, callback=aux_override),
    trust_remote_code: bool = flag("--trust-remote-code", help=TRUST_REMOTE_CODE_HELP),
) -> None:
    """Write CHECKPOINT for one engine, prove every tensor bit-identical, print the launch command.
    Exit 2: a bad option value or combination (an invalid --num-steps / --topk / --num-draft-tokens
    triple included, before anything loads) or an unusable input; 1: an export refused."""
    from specdraft.export import export_draft, spec_for_export

    console = make_console()
    setting = {
        "num_steps": num_steps or 3,
        "topk": topk or 1,
        "num_draft_tokens": num_draft_tokens or None,
    }
    with user_errors(None, exit_code=USAGE_ERROR):  # the options alone, as generate's and serve's
        spec_for_export(engine, **setting)
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
            **setting,
            dtype=dtype or None,
            aux_layers=reading.get("aux_layers"),
            trust_remote_code=trust_remote_code,
        )
    console.print(
        f"wrote {result.out_dir} for {engine}: {result.num_tensors} tensors, each "
        f"bit-identical to the checkpoint{' cast to ' + dtype if dtype else ''}"
        + derived_text(result.derived, checkpoint),
        style="green",
        markup=False,
    )
    for note in result.notes:
        console.print(f"note: {note}", markup=False, soft_wrap=True)
    given = [
        name
        for name, value in (
            ("--num-steps", num_steps),
            ("--topk", topk),
            ("--num-draft-tokens", num_draft_tokens),
        )
        if value
    ]
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
    checkpoint: str = argument(
        "CHECKPOINT",
        "Draft checkpoint directory (any layout; a training checkpoint: export it first).",
        callback=check_doctor_drafter,
    ),
    target: str = typer.Option(
        "",
        help="Target directory: capture parity, acceptance, tokenizer.",
        callback=check_model_dir,
    ),
    engine: DoctorEngine | None = typer.Option(
        None,
        help="Engine to check for (default: from --engine-args, "
        "else all; a speculators drafter: vllm, which serves it).",
    ),
    engine_args: str = typer.Option("", help="The engine's launch command line, quoted."),
    samples: str = typer.Option(
        "",
        help="Capture store, JSONL (token ids, chats or texts) or a suite name "
        "(mt-bench, humaneval, gsm8k: prompts for --server and render parity).",
    ),
    skip_bad: bool = flag(
        "--skip-bad", help="Skip bad --samples records instead of refusing the file."
    ),
    wait: float = typer.Option(
        120.0,
        min=0,
        help="Seconds to wait for a --server that refuses connections (still "
        "starting) before the online check fails; 0: try once.",
    ),
    server: str = typer.Option(
        "",
        help="Live server URL, e.g. http://127.0.0.1:8000 or .../v1 (online "
        "acceptance; needs --samples: prompts with the target's own outputs, e.g. the "
        "demo's store-heldout).",
    ),
    sglang_version: str = sglang_version_option(),
    aux_layers: str | None = typer.Option(None, help=AUX_NEEDS_TARGET, callback=aux_override),
    trust_remote_code: bool = flag("--trust-remote-code", help=TRUST_REMOTE_CODE_HELP),
    template_kwargs: str = typer.Option("", help="The server's chat template kwargs (JSON)."),
    max_samples: int = typer.Option(32, min=1, help="Samples for the offline run."),
    json_output: bool = flag("--json", help="Print the report as JSON."),
    strict: bool = flag(
        "--strict", help="Exit 1 when a check is skipped too (an input it needs is not given)."
    ),
) -> None:
    """Check a drafter against its training record, target and deployment (exit 1 on a fail, on a
    skip with --strict, or on a
    target and drafter directory given in each other's place, 2 on other unusable inputs: a
    CHECKPOINT without a drafter config, a CHECKPOINT or --target config.json that is not valid
    JSON or a weights file of either cut short, a --samples file that cannot be read)."""
    from specdraft.doctor import report_json, report_table, run_doctor

    console = make_console()
    with user_errors(console, SKIP_BAD_HINT):
        try:  # an input doctor cannot judge (a ValueError) is a usage error: exit 2, not 1
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
                aux_layers=reading.get("aux_layers"),
                trust_remote_code=trust_remote_code,
                max_samples=max_samples,
                skip_bad=skip_bad,
                server_wait_s=wait,
                template_kwargs=json_kwargs(template_kwargs, "--template-kwargs")
                if template_kwargs
                else None,
            )
        except ValueError as e:
            error(e, SKIP_BAD_HINT)
            raise typer.Exit(USAGE_ERROR) from e
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
    if strict and skipped and report.ok and not json_output:  # JSON stays parseable
        console.print(
            f"--strict: {skipped} check{'s' * (skipped != 1)} skipped",
            style="bold red",
            markup=False,
        )
    if not report.ok or (strict and skipped):
        raise typer.Exit(1)


def check_server_samples(server: str, samples: str) -> None:
    """doctor --server: a URL `client.check_url` accepts, and --samples to prompt it with
    (ValueError naming the fix otherwise)."""
    from specdraft.client import check_url

    check_url(server, "--server")
    if not samples:
        raise ValueError(
            f"--server {server} needs --samples: pass --samples FILE with the target's own "
            "outputs (a capture store or JSONL, e.g. the demo's store-heldout) for the online "
            "acceptance check"
        )


def print_aux_note(console, checkpoint: str, manifest, reading: dict) -> None:
    """The line saying where a manifest-less drafter's aux layers came from (`layouts.aux_layers_note`)."""
    from pathlib import Path

    from specdraft.checkpoint import aux_layers_note, read_config

    if (
        manifest is not None
    ):  # its ids are the manifest's (a training checkpoint has no config.json)
        return
    note = aux_layers_note(
        read_config(Path(checkpoint)),
        manifest,
        reading["target_num_layers"],
        reading.get("aux_layers"),
    )
    if note:
        console.print(f"note: {note}", markup=False, soft_wrap=True)
