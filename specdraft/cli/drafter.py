"""Commands that read a drafter on disk: inspect, convert (export, doctor: `cli.deploy`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from specdraft.cli.checks import check_drafter
from specdraft.cli.common import app, make_console, user_errors
from specdraft.cli.options import (
    DRAFTER_HELP,
    AuxOverride,
    SglangVersion,
    TargetForIds,
    TrustRemoteCode,
    argument,
    flag,
)
from specdraft.cli.reading import id_reading, read_target, refuse_bad_configs

if TYPE_CHECKING:
    from specdraft.checkpoint.id_reading import IdReading

Drafter = Annotated[str, argument("CHECKPOINT", DRAFTER_HELP + ".", callback=check_drafter)]
WholeManifest = flag(
    "--manifest", help="Print the whole manifest as JSON (default: one line per field)."
)
KnownKeys = flag(
    "--known-keys",
    help="List the config.json keys specdraft reads or knows to be "
    "harmless, and CHECKPOINT's others, instead (exit 1 when it has others).",
)


@app.command()
def inspect(
    checkpoint: Drafter,
    target: TargetForIds,
    manifest: WholeManifest,
    aux_layers: AuxOverride,
    trust_remote_code: TrustRemoteCode,
    sglang_version: SglangVersion,
    known_keys: KnownKeys,
) -> None:
    """Show a drafter's layout, tensors, manifest and audit verdict (exit 1 on a failed audit); a
    drafter without a manifest, given no --target: its files alone (layout, tensors, aux ids as written)."""
    from specdraft.checkpoint import load_draft
    from specdraft.checkpoint.layouts import TargetNeeded

    console = make_console()
    if known_keys:
        print_known_keys(console, checkpoint)
    if is_block_drafter(checkpoint):
        inspect_block_drafter(console, checkpoint, target, trust_remote_code, manifest)
        return
    with user_errors(console):
        refuse_bad_configs(checkpoint, "")
        reading = id_reading(
            read_target(target, trust_remote_code), aux_layers, sglang_version, checkpoint, target
        )
        try:
            loaded = load_draft(checkpoint, **reading.keywords())
        except TargetNeeded:  # the config passed the loader's checks: show what the files alone say
            print_files_without_target(console, checkpoint)
            return
    print_loaded(console, checkpoint, loaded, reading)
    if loaded.manifest is not None and manifest:
        console.print_json(loaded.manifest.to_json())
    elif loaded.manifest is not None:
        for line in _manifest_lines(json.loads(loaded.manifest.to_json())):
            console.print(line, markup=False, soft_wrap=True)
    print_audit(console, loaded, target)


def is_block_drafter(checkpoint: str) -> bool:
    """Whether CHECKPOINT is a DFlash drafter: a directory (any published form) or a DFlash run's
    training checkpoint (`checkpoint.dflash.is_dflash_drafter`)."""
    from specdraft.checkpoint.dflash import is_dflash_drafter

    return is_dflash_drafter(checkpoint)


def inspect_block_drafter(console, checkpoint: str, target: str, trust_remote_code, whole) -> None:
    """inspect of a DFlash drafter (`checkpoint.dflash_describe`): its lines, tensors, manifest
    (`whole`: as JSON) and audit (exit 1 on a tensor that is not finite)."""
    from specdraft.checkpoint.dflash_describe import describe_dflash

    with user_errors(console):
        given = read_target(target, trust_remote_code)
        seen = describe_dflash(checkpoint, given.num_hidden_layers if given else None)
    console.print(seen.lines[0], markup=False, soft_wrap=True)
    console.print(tensor_table(seen.model.state_dict()))
    for line in seen.lines[1:]:
        console.print(line, markup=False, soft_wrap=True)
    if seen.manifest is not None and whole:
        console.print_json(seen.manifest.to_json())
    elif seen.manifest is not None:
        for line in _manifest_lines(json.loads(seen.manifest.to_json())):
            console.print(line, markup=False, soft_wrap=True)
    for problem in seen.problems:
        console.print(f"audit: FAIL {problem}", style="red", markup=False)
    if seen.problems:
        raise typer.Exit(1)
    console.print("audit: PASS", style="green")


def print_loaded(console, checkpoint: str, loaded, reading: IdReading) -> None:
    """inspect of a loaded drafter: what it is, where its aux ids came from, its tensors in its
    layout, its sizes and method (the norm flags: `draft_config.method_label`)."""
    from specdraft.checkpoint import (
        describe_layout,
        is_training_checkpoint,
        state_dict_for_layout,
    )
    from specdraft.draft_config import method_label

    training = loaded.manifest.training if is_training_checkpoint(checkpoint) else None
    described = (
        f"training checkpoint (step {training['steps']}; export or convert writes its drafter files)"
        if training
        else describe_layout(loaded.layout, loaded.manifest is not None)
    )
    console.print(f"{checkpoint}: {described}", markup=False, soft_wrap=True)
    print_aux_note(console, checkpoint, loaded.manifest, reading)
    if loaded.manifest is None:
        print_reading_notes(console, checkpoint)
    console.print(tensor_table(state_dict_for_layout(loaded.model, loaded.layout)))
    cfg = loaded.model.cfg
    console.print(
        f"aux layers (specdraft indices): {list(cfg.aux_layers)} of {cfg.target_num_layers}; "
        f"hidden {cfg.hidden_size}, target hidden {cfg.target_hidden_size}; "
        f"draft vocab {cfg.draft_vocab_size} of {cfg.vocab_size}; "
        f"method: {method_label(cfg)}",
        markup=False,
        soft_wrap=True,
    )


def tensor_table(tensors: dict, title: str | None = None):
    """A rich table of tensors: name, shape, dtype."""
    from rich.table import Table

    table = Table(title=title)
    for column in ("tensor", "shape", "dtype"):
        table.add_column(column)
    for name, tensor in tensors.items():
        table.add_row(name, str(tuple(tensor.shape)), str(tensor.dtype).removeprefix("torch."))
    return table


def print_audit(console, loaded, target: str) -> None:
    """inspect's audit verdict (`checkpoint.audit`, the vocabulary map bound by the tokenizer's
    length: the manifest's record, without a manifest the --target's tokenizer): a line per
    problem and exit 1, else PASS."""
    from specdraft.checkpoint import audit, tokenizer_length

    problems = audit(loaded.model, loaded.manifest, tokenizer_length(target or None))
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
    the method its norm flags name (`draft_config.method_label`), and what --target adds."""
    from specdraft.checkpoint import (
        describe_layout,
        detect_layout,
        draft_tensors,
        read_config,
        read_weights,
    )
    from specdraft.checkpoint.config_read import config_without_target, norm_flags_of_config
    from specdraft.draft_config import method_label

    path = Path(checkpoint)
    config, (tensors, files), layout = read_config(path), read_weights(path), detect_layout(path)
    draft_tensors(
        config_without_target(path, layout, config, tensors), tensors, layout, files.entry
    )
    console.print(f"{checkpoint}: {describe_layout(layout, False)}", markup=False, soft_wrap=True)
    print_reading_notes(console, checkpoint)
    console.print(tensor_table(tensors, f"tensors of {files.entry.name}"))
    for line in (
        written_aux_ids_line(config),
        f"method: {method_label(norm_flags_of_config(path, config))} (config.json's norm flags)",
        f"keys: every tensor of {files.entry.name} is one the {layout} layout loads, every parameter "
        "is in the file, shapes as config.json says (specdraft's loader checks)",
        "--target DIR would add: the aux layers as specdraft indices (read by the target's layer count "
        "and class), the drafter's sizes, and the audit (d2t / t2d, finite values; "
        "not run)",
    ):
        console.print(line, markup=False, soft_wrap=True)


def print_reading_notes(console, checkpoint: str) -> None:
    """A "note:" line per value of a manifest-less drafter's config.json an engine reads otherwise
    than specdraft, or no engine reads (`checkpoint.config_notes.reading_notes`)."""
    from specdraft.checkpoint import read_config
    from specdraft.checkpoint.config_notes import reading_notes

    for note in reading_notes(read_config(Path(checkpoint))):
        console.print(f"note: {note}", markup=False, soft_wrap=True)


def written_aux_ids_line(config: dict) -> str:
    """The aux ids a drafter's config.json writes, top-level (vLLM's) and in eagle_config (SGLang's)."""
    from specdraft.conventions import AUX_KEY

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
    return "aux ids as config.json writes them: " + (
        "; ".join(written) or "none (the engines' default [2, L//2, L-3] of the target's L layers)"
    )


def print_known_keys(console, checkpoint: str) -> None:
    """inspect --known-keys: the known keys (`config_keys.known_keys_lines`), then CHECKPOINT's
    ignored ones and refused ones, one a line; exits 0, or 1 when there are refused ones."""
    from specdraft.checkpoint import UNIMPLEMENTED_FLAGS, is_training_checkpoint, read_config
    from specdraft.checkpoint.config_keys import (
        ignored_config_keys,
        known_keys_lines,
        unknown_config_keys,
    )

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
        config = read_config(Path(checkpoint))
        unknown = unknown_config_keys(config, UNIMPLEMENTED_FLAGS)
    ignored = ignored_config_keys(config)
    for key in ignored:
        console.print(
            f"{checkpoint}/config.json: ignored (no engine reads it): {key}",
            markup=False,
            soft_wrap=True,
        )
    for entry in unknown:
        console.print(
            f"{checkpoint}/config.json: neither read nor known harmless: {entry}",
            style="red",
            markup=False,
            soft_wrap=True,
        )
    if not unknown:
        none = "no refused keys" if ignored else "no other keys"
        console.print(f"{checkpoint}/config.json: {none}", markup=False, soft_wrap=True)
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


def print_aux_note(console, checkpoint: str, manifest, reading: IdReading) -> None:
    """The line saying where a manifest-less drafter's aux layers came from (`layouts.aux_layers_note`)."""
    from specdraft.checkpoint import aux_layers_note, read_config

    if (
        manifest is not None
    ):  # its ids are the manifest's (a training checkpoint has no config.json)
        return
    note = aux_layers_note(
        read_config(Path(checkpoint)), manifest, reading.target_num_layers, reading.aux_layers
    )
    if note:
        console.print(f"note: {note}", markup=False, soft_wrap=True)
