"""The notes an export gives the user (what the files mean for each engine, where the aux
layers and the verifier came from, a tokenizer that differs), and the refusals found while
writing them (an embedding SGLang would replace by another)."""

from __future__ import annotations

from pathlib import Path

from specdraft.checkpoint import (
    TOKENIZER_FILES,
    LoadedDraft,
    aux_layers_note,
    is_training_checkpoint,
    read_config,
    read_weights,
    verifier_replaced_note,
)
from specdraft.checkpoint.config_notes import changed_values_note, reading_notes
from specdraft.conventions.engines import (
    sglang_embedding,
    sglang_replaces_embedding,
)
from specdraft.export.refusals import ExportError
from specdraft.export.target_facts import TargetFacts


def embedding_notes(
    engine: str, source: LoadedDraft, checkpoint: str | Path, target: str | Path | None
) -> list[str]:
    """For SGLang, the note on an owned embed_tokens that SGLang replaces by the target's identical one
    (kept in the files: vLLM and specdraft read it); ExportError when SGLang would run another
    embedding than the trained one (`conventions.engines.sglang_embedding`, doctor's rule too, on
    the tensor as the source stores it: the loader casts it to fc's dtype)."""
    from specdraft.targets import target_embedding

    cfg = source.model.cfg
    if engine != "sglang" or not cfg.owns_embedding:
        return []
    written = source.model.embed_tokens.weight.detach()
    stored = (
        read_weights(checkpoint)[0].get("embed_tokens.weight", written)
        if Path(checkpoint).is_dir()
        else written
    )
    declared = {"hidden_size": cfg.hidden_size, "target_hidden_size": cfg.target_hidden_size}
    try:
        as_trained, what = sglang_embedding(
            declared, stored, lambda: None if target is None else target_embedding(target)
        )
    except (FileNotFoundError, OSError, ValueError) as e:
        raise ExportError(
            f"cannot compare the drafter's embed_tokens with the target's: {e}"
        ) from None
    if not as_trained:
        raise ExportError(
            f"cannot export for sglang: {what}; export --engine vllm or speculators (vLLM keeps "
            "a drafter's own embedding that differs from the target's)"
        )
    if not sglang_replaces_embedding(declared):
        return []
    cast = (
        ""
        if stored.dtype == written.dtype
        else f"; written as {written.dtype} like every tensor here (the source stores it as {stored.dtype})"
    )
    return [f"embed_tokens.weight is kept: SGLang runs {what} (set_embed), so as trained{cast}"]


def ids_notes(layers: list[int], top: list[int] | None, nested: list[int] | None) -> list[str]:
    """The note naming the aux layers and the ids each key holds."""
    id_keys = [
        f"{key} ids {ids} ({reader})"
        for key, ids, reader in (("top-level", top, "vLLM"), ("eagle_config", nested, "SGLang"))
        if ids is not None
    ]
    return [f"aux layers {layers} (specdraft indices): {', '.join(id_keys)}"]


def verifier_of(
    engine: str, verifier: str | None, facts: TargetFacts, checkpoint: str | Path
) -> tuple[str | None, list[str]]:
    """The verifier name (given, else the target's) and its notes: where it must resolve, and the
    one the source's own speculators config named when this one replaces it
    (`checkpoint.verifier_replaced_note`); speculators needs one (ExportError)."""
    verifier = verifier or facts.name_or_path
    if engine != "speculators":
        return verifier, []
    if not verifier:
        raise ExportError(
            "speculators needs verifier.name_or_path: pass --target DIR or --verifier NAME"
        )
    notes = [
        f"verifier.name_or_path = {verifier!r} must resolve on the serving host "
        "(a path there or a hub name); pass --verifier NAME to change it"
    ]
    if not is_training_checkpoint(checkpoint):
        replaced = verifier_replaced_note(read_config(Path(checkpoint)), verifier)
        notes += [replaced] if replaced else []
    return verifier, notes


def source_notes(
    source: LoadedDraft, checkpoint: str | Path, aux_layers: list[int] | None, written: dict
) -> list[str]:
    """What the source means for the export: without a manifest, that (and where the aux layers
    came from, `config_read.aux_layers_note`; what the engines read of its config.json,
    `config_notes.reading_notes`), or a training checkpoint's step; then each value the
    `written` config.json gives otherwise than the source's (`config_notes.changed_values_note`)."""
    training = (source.manifest.training if source.manifest is not None else None) or {}
    if "checkpoint" in training:
        return [
            f"the drafter of training checkpoint {checkpoint} (step {training['steps']}); "
            "its manifest records the step"
        ]
    if is_training_checkpoint(checkpoint):
        return []
    config = read_config(Path(checkpoint))
    changed = changed_values_note(config, written)
    notes = [changed] if changed else []
    if source.manifest is None:
        aux = aux_layers_note(config, None, source.model.cfg.target_num_layers, aux_layers)
        notes = (
            ["the source has no specdraft manifest: doctor cannot compare with training"]
            + ([aux] if aux else [])
            + reading_notes(config)
            + notes
        )
    return notes


def target_tokenizer_notes(
    source: LoadedDraft, checkpoint: str | Path, target: str | Path | None
) -> list[str]:
    """The note on a --target tokenizer that differs from the manifest's (`engine.load.tokenizer_notes`);
    none without --target, a manifest's tokenizer record, or tokenizer files in the target directory."""
    from specdraft.engine.load import tokenizer_notes

    if target is None or source.manifest is None or not source.manifest.tokenizer:
        return []
    if not any((Path(target) / name).is_file() for name in TOKENIZER_FILES):
        return []
    from specdraft.targets.tokenizer import TargetTokenizerError, load_target_tokenizer

    try:
        tokenizer = load_target_tokenizer(target)
    except TargetTokenizerError as e:
        return [f"{e.reason}, so it is not compared with the one the drafter was trained with"]
    return tokenizer_notes(source.manifest, tokenizer, checkpoint, target)
