"""`specdraft store`: hidden-state stores between specdraft's format and the peers'
(speculators' offline hs_{i}.safetensors, SpecForge's data_{i}.ckpt[.gz])."""

from __future__ import annotations

from typing import Annotated, Literal

import typer

from specdraft.cli.checks import peer_aux_ids
from specdraft.cli.command import App
from specdraft.cli.common import app, make_console, user_errors
from specdraft.cli.options import argument, flag, option

StoreFormat = Literal["specdraft", "speculators", "specforge"]  # capture.convert.FORMATS
AuxConvention = Literal["specdraft", "vllm", "sglang"]  # capture.convert.CONVENTIONS

store_app = App(help="Hidden-state stores: convert between formats.")
app.add_typer(store_app, name="store")


StoreSource = Annotated[
    str, argument("SRC", "The store to read: specdraft, speculators or SpecForge (detected).")
]
StoreDestination = Annotated[str, argument("DST", "A new directory for the converted store.")]
To = Annotated[StoreFormat, typer.Option("--to", help="Format to write.")]
StoreTarget = Annotated[
    str | None,
    option(
        None,
        help="Target model directory: needed to write a specdraft "
        "store from a peer's (the index records the target; not for a peer "
        "store written from a specdraft one, which keeps that store's index "
        "in specdraft_store/), and to norm the last state for SpecForge when "
        "the store records no target.",
    ),
]
StoreTokenizer = Annotated[
    str | None, option(None, help="Tokenizer directory (default: the target's).")
]
PeerAuxLayers = Annotated[
    str | None,
    option(
        None,
        callback=peer_aux_ids,
        help="The peer store's aux layers (needed to write a specdraft store from a peer's without "
        "specdraft_store/): ids in a named "
        "convention, 'vllm:2,16,29' (vLLM's / speculators' eagle_aux_hidden_state_layer_ids), "
        "'sglang:1,15,28' (SGLang's, read by the --target's class) or 'specdraft:2,16,29' (specdraft "
        "indices); a list without a name is read in --aux-convention.",
    ),
]
AuxConventionOption = Annotated[
    AuxConvention | None,
    option(
        None,
        help="Convention of an --aux-layers list without a name (default: vllm for a speculators store, "
        "sglang for SpecForge's, the engines whose ids those stores are captured with).",
    ),
]
Compress = flag("--compress", help="SpecForge: write .ckpt.gz files.")


@store_app.command()
def convert(
    src: StoreSource,
    dst: StoreDestination,
    to: To,
    target: StoreTarget,
    tokenizer: StoreTokenizer,
    aux_layers: PeerAuxLayers,
    aux_convention: AuxConventionOption,
    compress: Compress,
) -> None:
    """Convert the hidden-state store SRC into DST in the format --to, strictly: a missing or
    extra field, a wrong shape or an unreadable file is named and nothing is written."""
    from specdraft.capture.convert import PeerInputs, convert_store

    console = make_console()
    named, ids = aux_layers or (None, None)
    if named is not None and aux_convention is not None and named != aux_convention:
        raise typer.BadParameter(
            f"names the {named} convention, --aux-convention {aux_convention}; give one",
            param_hint="--aux-layers",
        )
    with user_errors(console):
        given = PeerInputs(target, tokenizer, ids, named or aux_convention)
        result = convert_store(src, dst, to, given, compress=compress)
    layers = (
        f"; aux layers (specdraft indices) {list(result.aux_layers)}" if result.aux_layers else ""
    )
    console.print(
        f"store convert: wrote {result.num_samples} samples as a {result.format} store at "
        f"{result.path} (from the {result.source_format} store {src}){layers}",
        style="green",
        markup=False,
        soft_wrap=True,
    )
