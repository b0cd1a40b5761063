"""Rewriting a drafter in another layout, then proving the written files the same drafter: every
tensor bit-identical (`verify_written`, export's proof too) and the config read back equal."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from specdraft.checkpoint.audit import tensor_digest
from specdraft.checkpoint.config_read import owned_embedding_config
from specdraft.checkpoint.dirs import (
    has_manifest,
    is_training_checkpoint,
    read_config,
    source_verifier,
)
from specdraft.checkpoint.layouts import (
    MANIFEST_FILE,
    WEIGHTS_FILE,
    CheckpointError,
    layer_prefix,
    state_dict_for_layout,
)
from specdraft.checkpoint.load import key_mismatch_message, load_draft, read_draft_config
from specdraft.checkpoint.manifest import LoadedDraft
from specdraft.checkpoint.save import check_output_dir, save_draft
from specdraft.checkpoint.weights import open_safetensors
from specdraft.draft import Eagle3Draft


@dataclass(frozen=True)
class Converted:
    """What `convert_draft` proved: how many tensors are bit-identical to the source's, and the
    ones derived because the source has none (written, not copied)."""

    num_copied: int
    derived: tuple[str, ...]


def convert_draft(
    src: str | Path,
    dst: str | Path,
    *,
    layout: str,
    target_num_layers: int | None = None,
    target_class: str | None = None,
    sglang_version: str | None = None,
    aux_layers: list[int] | None = None,
    target_architectures: list[str] | None = None,
    target_name_or_path: str | None = None,
    layer_names: str | None = None,
) -> Converted:
    """Rewrite a drafter in `layout`, then re-read both and prove every tensor bit-identical and
    the drafter config the same (the ``sglang`` layout drops the manifest, so its config.json
    alone must rebuild the drafter).

    A specdraft-layout destination needs the source's manifest; speculators carries it too.
    Aux ids are read and written by the rule of `target_class` (default: the manifest's,
    `Manifest.target_class`; "llama" when it records none and every class's rule writes the
    layers alike, else CheckpointError naming --target) and `sglang_version`; the written file's
    two id lists name the same layers.
    A speculators destination records `target_name_or_path` (the --target directory) and
    `target_architectures` as its verifier, as export does (replacing another the source names:
    `verifier_replaced_note`), else the verifier the source records (its own speculators
    verifier, or the manifest's target); None when nothing names it (vLLM started on the drafter
    then has no target). `layer_names`: the written decoder layer's names, "midlayer" or
    "layers.0" (`layouts.LAYER_NAMES`; default: the layout's own), either read by vLLM 0.32 and
    SGLang >= 0.5.12.
    Returns how many tensors are bit-identical to the source's, and the derived ones (the source
    has none: `derived_tensors`); raises CheckpointError when a tensor differs or is
    missing (case FC-01), or the re-read config differs. Costs about the source's size in memory
    (the written file is re-read one tensor at a time, `verify_written`).
    """
    check_output_dir(dst, source=src)
    layer_prefix(layout, layer_names)  # an unknown name is refused before any reading
    if layout == "specdraft":  # before asking for the target
        _refuse_without_manifest(src, target_num_layers)
    ids = {"target_class": target_class or "llama", "sglang_version": sglang_version}
    source = load_draft(src, target_num_layers=target_num_layers, aux_layers=aux_layers, **ids)
    if target_class is None and source.manifest is not None:
        ids["target_class"] = _manifest_class(source, src, sglang_version)
    verifier = _verifier_record(source, src, target_name_or_path, target_architectures)
    return _write_and_prove(source, dst, layout, ids, verifier, layer_names)


def _manifest_class(source: LoadedDraft, src: str | Path, sglang_version: str | None) -> str:
    """The rule class the aux ids of `source` (a drafter with a manifest) are written by: the
    manifest's record (`Manifest.target_class`); when it records none, "llama" if no class's
    rule reads the ids written so as other layers (`conventions.misreadings`), else
    CheckpointError naming `src`, the classes and --target."""
    from specdraft.conventions import ConventionError, misreadings, to_engine_ids

    recorded = source.manifest.target_class()
    if recorded is not None:
        return recorded
    cfg = source.model.cfg
    layers, num_layers = list(cfg.aux_layers), cfg.target_num_layers
    misread = []
    for engine, version in (("vllm", None), ("sglang", sglang_version)):
        try:
            ids = to_engine_ids(layers, engine, num_layers, "llama", version)
        except ConventionError:  # the Llama reading writes no such key
            continue
        misread += [
            f"{engine} ids {ids} on {where}"
            for where in misreadings(ids, engine, num_layers, layers, version)
        ]
    if misread:
        raise CheckpointError(
            f"{src}: its manifest records no target class, and aux layers {layers} written by "
            f"the Llama rule would be misread ({'; '.join(misread)}): pass the target "
            "(--target DIR)"
        )
    return "llama"


def _write_and_prove(
    source: LoadedDraft,
    dst: str | Path,
    layout: str,
    ids: dict[str, str | None],
    verifier: tuple[str | None, list[str] | None],
    layer_names: str | None,
) -> Converted:
    """`convert_draft`'s writing: `source` saved in `layout` at `dst` with `verifier` (name,
    architectures), its config read back and its tensors proven bit-identical."""
    save_draft(
        source.model,
        dst,
        layout=layout,
        manifest=source.manifest,
        verifier=verifier[0],
        verifier_architectures=verifier[1],
        layer_names=layer_names,
        **ids,
    )
    _check_config_reads_back(source, dst, layout, ids)
    copied = verify_written(source.model, dst, layout, layer_names) - len(source.derived)
    return Converted(copied, source.derived)


def _refuse_without_manifest(src: str | Path, target_num_layers: int | None) -> None:
    """CheckpointError naming `src` when it carries no manifest, which the specdraft layout
    carries and no --target can supply (the other layouts can be written instead)."""
    if has_manifest(src):
        return
    with_target = (
        "" if target_num_layers else ", with --target DIR (without a manifest the aux ids need it)"
    )
    raise CheckpointError(
        f"{src}: no {MANIFEST_FILE}, which the specdraft layout carries and --target "
        f"cannot supply; convert to --layout sglang or speculators instead{with_target}"
    )


def _verifier_record(
    source: LoadedDraft,
    src: str | Path,
    target_name_or_path: str | None,
    target_architectures: list[str] | None,
) -> tuple[str | None, list[str] | None]:
    """(verifier name_or_path, architectures) a speculators destination records: the --target's
    when given, else the source's speculators verifier or the manifest's target (`convert_draft`)."""
    verifier = {} if is_training_checkpoint(src) else source_verifier(read_config(Path(src)))
    recorded = (source.manifest.target if source.manifest is not None else None) or {}
    name = target_name_or_path or verifier.get("name_or_path") or recorded.get("name_or_path")
    if target_name_or_path:
        return name, target_architectures
    if recorded.get("architecture"):
        return name, [recorded["architecture"]]
    return name, verifier.get("architectures")


def _check_config_reads_back(
    source: LoadedDraft, dst: str | Path, layout: str, ids: dict[str, str | None]
) -> None:
    """CheckpointError naming `dst` and the fields when its files rebuild another DraftConfig than
    the source's (the ``sglang`` layout has no manifest: its config.json alone must rebuild it)."""
    _, manifest, written = read_draft_config(dst, source.model.cfg.target_num_layers, **ids)
    written = owned_embedding_config(written, manifest, state_dict_for_layout(source.model, layout))
    if written != source.model.cfg:
        want, have = source.model.cfg.to_dict(), written.to_dict()
        differ = [f"{k} {want[k]!r} -> {have.get(k)!r}" for k in want if want[k] != have.get(k)]
        raise CheckpointError(
            f"{dst}: the drafter config reads back differently: {', '.join(differ)}"
        )


def verify_written(
    expected: Eagle3Draft, out_dir: str | Path, layout: str, layer_names: str | None = None
) -> int:
    """Prove `out_dir`/model.safetensors (as `save_draft` and export write it) holds exactly
    `expected`'s tensors in `layout` (decoder layer under `layer_names`), bit for bit. Each tensor is read back through its own
    `open_safetensors` handle and let go before the next, so proving costs one tensor's size.
    Returns how many; CheckpointError names the first that differs, is missing or is not expected."""
    want = state_dict_for_layout(expected, layout, layer_names)
    file = Path(out_dir) / WEIGHTS_FILE
    with open_safetensors(file, "write it again", CheckpointError) as f:
        names = set(f.keys())
    if names != set(want):
        raise CheckpointError(
            key_mismatch_message(file, layout, sorted(names - set(want)), sorted(set(want) - names))
        )
    for name, tensor in want.items():
        with open_safetensors(file, "write it again", CheckpointError) as f:
            same = tensor_digest(f.get_tensor(name)) == tensor_digest(tensor)
        if not same:
            raise CheckpointError(f"{file}: tensor {name} differs after writing")
    return len(want)
