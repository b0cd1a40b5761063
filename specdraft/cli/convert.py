"""The convert command: a drafter rewritten in another layout (or decoder-layer names), every
tensor proven bit-identical, with the lines the written layout needs said."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from specdraft.cli.checks import check_drafter
from specdraft.cli.common import app, make_console, user_errors
from specdraft.cli.drafter import print_aux_note
from specdraft.cli.options import (
    DRAFTER_HELP,
    AuxOverride,
    LayerNames,
    Layout,
    SglangVersion,
    TargetForIds,
    TrustRemoteCode,
    argument,
    option,
)
from specdraft.cli.reading import id_reading, read_target, refuse_bad_configs

ConvertSource = Annotated[
    str, argument("SRC", DRAFTER_HELP + " (layout detected).", callback=check_drafter)
]
ConvertOut = Annotated[str, argument("DST", "Output directory.")]
ConvertLayout = Annotated[
    Layout,
    typer.Option(
        help="sglang (official EAGLE-3: config.json + model.safetensors, no "
        "specdraft manifest) | speculators (vLLM's; keeps the manifest) | specdraft "
        "(the sglang files + specdraft's manifest)",
    ),
]
ConvertLayerNames = Annotated[
    LayerNames | None,
    option(
        None,
        help="The decoder layer's tensor names: midlayer (SGLang's, read by every release) or "
        "layers.0 (ModelOpt's, TorchSpec's; SGLang < 0.5.12 skips it). Default: the layout's own.",
    ),
]


@app.command()
def convert(
    src: ConvertSource,
    dst: ConvertOut,
    layout: ConvertLayout,
    target: TargetForIds,
    aux_layers: AuxOverride,
    trust_remote_code: TrustRemoteCode,
    sglang_version: SglangVersion,
    layer_names: ConvertLayerNames,
) -> None:
    """Rewrite a drafter in another layout, losslessly (every tensor checked bit-identical)."""
    from specdraft.checkpoint import convert_draft, has_manifest

    console = make_console()
    with user_errors(console):
        refuse_bad_configs(src, "")
        given = read_target(target, trust_remote_code)  # once: aux ids and the verifier's names
        reading = id_reading(given, aux_layers, sglang_version, src, target)
        converted = convert_draft(
            src,
            dst,
            layout=layout,
            **reading.keywords(),
            target_architectures=list(given.architectures or []) or None if given else None,
            target_name_or_path=str(Path(target).resolve()) if target else None,
            layer_names=layer_names,
        )
    print_aux_note(console, src, True if has_manifest(src) else None, reading)
    print_converted(console, src, Path(dst), layout, converted)
    if layer_names == "layers.0":
        console.print(layers0_note(), markup=False, soft_wrap=True)


def layers0_note() -> str:
    """The line after `convert --layer-names layers.0`: the SGLang releases that skip such a
    decoder layer silently (`conventions.engines.DRAFT_LOADING`), and the check that catches it."""
    from specdraft.conventions.engines import DRAFT_LOADING

    until = [
        row.until
        for row in DRAFT_LOADING
        if row.engine == "sglang" and row.until and "layers.0." not in row.layer_prefixes
    ]
    bound = ".".join(map(str, max(until)))
    return (
        f"note: SGLang before {bound} skips layers.0.* tensors without a word (the layer keeps its "
        f"initial values): serve this file with SGLang {bound} or later, or vLLM "
        "(doctor --engine sglang --sglang-version V checks it)"
    )


def print_converted(console, src: str, dst: Path, layout: str, converted) -> None:
    """convert's lines after writing `dst`: its layout as inspect says and files, the tensors proven
    bit-identical, then what the layout needs said (the verifier, a manifest left out, flag notes)."""
    from specdraft.checkpoint import MANIFEST_FILE, describe_layout, detect_layout, has_manifest

    on_disk = describe_layout(detect_layout(dst), (dst / MANIFEST_FILE).is_file())
    files = ", ".join(sorted(p.name for p in dst.iterdir()))
    console.print(
        f"wrote {dst} ({on_disk}): {files}; {converted.num_copied} tensors, each bit-identical to {src}"
        + derived_text(converted.derived, src),
        markup=False,
        soft_wrap=True,
    )
    print_changed_values(console, src, dst)
    if layout == "speculators":
        print_verifier(console, src, dst)
    if layout == "sglang" and has_manifest(src):
        console.print(
            f"{src}'s manifest is left out of the official layout (--layout specdraft keeps it); "
            "reading it back needs the target (--target DIR)",
            markup=False,
            soft_wrap=True,
        )
    print_flag_notes(console, dst, layout)


def print_changed_values(console, src: str, dst: Path) -> None:
    """The note naming each config.json value `dst` gives otherwise than `src`
    (`checkpoint.config_notes.changed_values_note`); none for a training checkpoint (no config.json)."""
    from specdraft.checkpoint import is_training_checkpoint, read_config
    from specdraft.checkpoint.config_notes import changed_values_note

    if is_training_checkpoint(src):
        return
    changed = changed_values_note(read_config(Path(src)), read_config(dst))
    if changed:
        console.print(f"note: {changed}", markup=False, soft_wrap=True)


def print_verifier(console, src: str, dst: Path) -> None:
    """A speculators drafter's verifier line (`verifier_line`), and a note when it replaced the one
    `src` named (`checkpoint.verifier_replaced_note`)."""
    from specdraft.checkpoint import is_training_checkpoint, read_config, verifier_replaced_note

    console.print(verifier_line(dst), markup=False, soft_wrap=True)
    written = json.loads((dst / "config.json").read_text())["speculators_config"]["verifier"]
    replaced = (
        None
        if is_training_checkpoint(src)
        else verifier_replaced_note(read_config(Path(src)), written["name_or_path"])
    )
    if replaced:
        console.print(f"note: {replaced}", markup=False, soft_wrap=True)


def derived_text(derived: tuple[str, ...], source) -> str:
    """convert / export's words for the tensors derived because `source` has none (`checkpoint.derived_tensors`)."""
    if "d2t" in derived:
        return f"; d2t, t2d derived as the identity map ({source} has none; its head spans the target vocabulary)"
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
