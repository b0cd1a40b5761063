"""`specdraft store`: hidden-state stores between specdraft's format and the peers'
(speculators' offline hs_{i}.safetensors, SpecForge's data_{i}.ckpt[.gz])."""

from __future__ import annotations

from typing import Literal

import typer

from specdraft.cli.common import app, argument, aux_layer_list, flag, make_console, user_errors

StoreFormat = Literal["specdraft", "speculators", "specforge"]  # capture.convert.FORMATS
AuxConvention = Literal["specdraft", "vllm", "sglang"]  # capture.convert.CONVENTIONS

store_app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                        rich_markup_mode=None, help="Hidden-state stores: convert between formats.")
app.add_typer(store_app, name="store")


@store_app.command()
def convert(
    src: str = argument("SRC", "The store to read: specdraft, speculators or SpecForge (detected)."),
    dst: str = argument("DST", "A new directory for the converted store."),
    to: StoreFormat = typer.Option(..., "--to", help="Format to write."),
    target: str | None = typer.Option(None, help="Target model directory: needed to write a specdraft "
                                      "store from a peer's (the index records the target), and to norm "
                                      "the last state for SpecForge when the store records no target."),
    tokenizer: str | None = typer.Option(None, help="Tokenizer directory (default: the target's)."),
    aux_layers: str | None = typer.Option(None, help="The peer store's aux layer ids, e.g. '2,8,13' "
                                          "(needed to write a specdraft store from a peer's).",
                                          callback=aux_layer_list),
    aux_convention: AuxConvention | None = typer.Option(
        None, help="Convention of --aux-layers (default: vllm for a speculators store, sglang for "
                   "SpecForge's; specdraft = specdraft indices)."),
    compress: bool = flag("--compress", help="SpecForge: write .ckpt.gz files."),
) -> None:
    """Convert the hidden-state store SRC into DST in the format --to, strictly: a missing or
    extra field, a wrong shape or an unreadable file is named and nothing is written."""
    from specdraft.capture.convert import convert_store

    console = make_console()
    with user_errors(console):
        result = convert_store(src, dst, to, target=target, tokenizer=tokenizer, aux_layers=aux_layers,
                               convention=aux_convention, compress=compress)
    layers = f"; aux layers (specdraft indices) {list(result.aux_layers)}" if result.aux_layers else ""
    console.print(f"store convert: wrote {result.num_samples} samples as a {result.format} store at "
                  f"{result.path} (from the {result.source_format} store {src}){layers}",
                  style="green", markup=False, soft_wrap=True)
