"""`export_draft`: read the source, check it against the engine's rules (`refusals`), write the
engine's files and prove them, and give the launch command with the notes (`notes`)."""

from __future__ import annotations

import dataclasses
import json
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from specdraft.checkpoint import (
    MANIFEST_FILE,
    SOURCE_FORMS,
    WEIGHTS_FILE,
    CheckpointError,
    LoadedDraft,
    check_output_dir,
    check_vocab_map,
    is_training_checkpoint,
    load_draft,
    official_config,
    speculators_config,
    state_dict_for_layout,
    tokenizer_length,
    verify_written,
    write_safetensors,
)
from specdraft.checkpoint.id_reading import IdReading
from specdraft.conventions import AUX_KEY, captured_by, parse_dtype
from specdraft.draft import Eagle3Draft
from specdraft.engine.spec_config import SpecConfig
from specdraft.export.notes import (
    embedding_notes,
    ids_notes,
    source_notes,
    target_tokenizer_notes,
    verifier_of,
)
from specdraft.export.refusals import (
    ExportError,
    check_norm_flags,
    check_target,
    engine_ids,
    spec_for_export,
)
from specdraft.export.target_facts import TargetFacts, resolve_target
from specdraft.files import atomic_dir

EXPORT_ENGINES = ("sglang", "vllm", "speculators")
LAYOUT_OF_ENGINE = {"sglang": "sglang", "vllm": "sglang", "speculators": "speculators"}
# Which engine's reading of the written config must give back the training layers.
READER_OF_ENGINE = {"sglang": "sglang", "vllm": "vllm", "speculators": "vllm"}


@dataclass(frozen=True)
class ExportResult:
    """What `export_draft` wrote: directory, engine, config.json as written, the command to
    serve it and the speculative setting it names, notes for the user, how many tensors were
    proven bit-identical to the checkpoint's, and the ones derived because it has none
    (`checkpoint.derived_tensors`: written, not copied)."""

    out_dir: Path
    engine: str
    config: dict[str, Any]
    launch_command: str
    spec: SpecConfig
    notes: list[str]
    num_tensors: int
    derived: tuple[str, ...] = ()


def load_source(checkpoint: str | Path, reading: IdReading) -> LoadedDraft:
    """What export reads (`checkpoint.load_draft`, given `reading`: the target's layer count and
    class, SGLang version, aux_layers): a drafter directory or a training checkpoint (its manifest
    records the step; reading's aux_layers must be its own). Raises CheckpointError naming the path for anything
    else (e.g. a drafter's model.safetensors given instead of its directory)."""
    path = Path(checkpoint)
    accepted = SOURCE_FORMS
    if path.is_file() and not is_training_checkpoint(path):
        raise CheckpointError(
            f"{checkpoint} is a file but no training checkpoint; pass {accepted} "
            f"(a drafter here would be {path.parent})"
        )
    if not path.exists():
        raise CheckpointError(f"{checkpoint}: no such file or directory; pass {accepted}")
    return load_draft(path, **reading.keywords())


def engine_config(
    engine: str,
    model: Eagle3Draft,
    ids: tuple[list[int] | None, list[int] | None],
    facts: TargetFacts,
    verifier: str | None,
    spec: SpecConfig,
) -> dict[str, Any]:
    """config.json of the export for `engine`, in the model's dtype: the speculators config (the
    verifier, the class vLLM loads the target as, `num_steps` tokens) or the official one; `ids`
    (top-level, eagle_config: `refusals.engine_ids`) replace the ids either would write."""
    cfg, dtype = model.cfg, model.fc.weight.dtype
    top, nested = ids
    if engine == "speculators":
        from specdraft.targets.config import ENGINE_ARCHITECTURES

        # the class name vLLM loads the target as
        architectures = (
            [ENGINE_ARCHITECTURES.get(facts.architecture, facts.architecture)]
            if facts.architecture
            else []
        )
        config = speculators_config(
            cfg, dtype, verifier, architectures, num_speculative_tokens=spec.num_steps
        )
        config[AUX_KEY] = top
        return config
    config = official_config(cfg, dtype)
    config.pop(AUX_KEY, None)
    config.pop("eagle_config", None)
    if top is not None:
        config[AUX_KEY] = top
    if nested is not None:
        config["eagle_config"] = {AUX_KEY: nested, "use_aux_hidden_state": True}
    return config


def launch_command(
    engine: str, target: str, out_dir: Path, spec: SpecConfig, vllm_extra: dict | None = None
) -> str:
    """The serving command line for an export, with the engine's flags (DESIGN.md §2);
    vllm_extra: more --speculative-config keys for vLLM (e.g. its
    num_speculative_tokens_per_batch_size)."""
    if engine == "sglang":
        return " ".join(
            [
                "python -m sglang.launch_server --model-path",
                shlex.quote(target),
                "--speculative-algorithm EAGLE3 --speculative-draft-model-path",
                shlex.quote(str(out_dir)),
                *spec.sglang_args(),
            ]
        )
    if engine == "vllm":
        config = {
            "method": "eagle3",
            "model": str(out_dir),
            "num_speculative_tokens": spec.num_speculative_tokens,
            **(vllm_extra or {}),
        }
        return f"vllm serve {shlex.quote(target)} --speculative-config {shlex.quote(json.dumps(config))}"
    return f"vllm serve {shlex.quote(str(out_dir))}"


def export_draft(
    checkpoint: str | Path,
    out_dir: str | Path,
    *,
    engine: str,
    target: str | Path | None = None,
    verifier: str | None = None,
    sglang_version: str | None = None,
    num_steps: int = 3,
    topk: int = 1,
    num_draft_tokens: int | None = None,
    dtype: str | torch.dtype | None = None,
    aux_layers: list[int] | None = None,
    trust_remote_code: bool = False,
) -> ExportResult:
    """Write `checkpoint` (a drafter directory or a training checkpoint, `load_source`) for
    `engine` ("sglang" | "vllm" | "speculators") under `out_dir`: to a temp directory, re-read
    strictly with every tensor proven bit-identical (to the cast, with `dtype`), then renamed.

    target: the target's transformers directory (its config gives layer count, class, rope; else
    the manifest's record; its tokenizer, when it has one, is compared with the manifest's: a
    difference is a note). verifier: the speculators `verifier.name_or_path` (default: the target
    directory's absolute path, else the manifest's name_or_path). sglang_version: pins how SGLang
    reads explicit ids where versions differ (DeepSeek class, embeddings). num_steps / topk /
    num_draft_tokens: the launch command's, validated like SpecConfig (default a 3-step chain;
    num_draft_tokens None = num_steps + 1). dtype: "bf16" | "fp16" | "fp32" casts the floating
    tensors (round to nearest; d2t / t2d keep theirs), None keeps the checkpoint's. aux_layers:
    the training layers (specdraft indices) of a drafter without a manifest, replacing its
    config's ids (default: those, else the engines' default, `config_read.aux_layers_of_config`).
    trust_remote_code: read a target config whose model_type only its own code defines.
    Raises ExportError with the reason for anything the engine would read differently from
    training; CheckpointError for a bad source (a wrong vocabulary map included).
    """
    if engine not in EXPORT_ENGINES:
        raise ExportError(f"unknown engine {engine!r}; choose one of {', '.join(EXPORT_ENGINES)}")
    spec = spec_for_export(engine, num_steps, topk, num_draft_tokens)
    out_dir = check_output_dir(out_dir, source=checkpoint)
    source, facts = _read_source(checkpoint, target, trust_remote_code, sglang_version, aux_layers)
    notes = _check_drafter(engine, source, facts, checkpoint, target, dtype, sglang_version)
    layers = list(source.model.cfg.aux_layers)
    top, nested, id_notes = engine_ids(layers, engine, facts, sglang_version)
    verifier, verifier_notes = verifier_of(engine, verifier, facts, checkpoint)
    config = engine_config(engine, source.model, (top, nested), facts, verifier, spec)
    num_tensors = _write_and_verify(source, out_dir, config, engine, facts, sglang_version, layers)
    notes += ids_notes(layers, top, nested) + id_notes + verifier_notes
    notes += source_notes(source, checkpoint, aux_layers, config)
    notes += target_tokenizer_notes(source, checkpoint, target)
    command = launch_command(engine, verifier or "TARGET", out_dir.resolve(), spec)
    num_copied = num_tensors - len(source.derived)
    return ExportResult(out_dir, engine, config, command, spec, notes, num_copied, source.derived)


def _read_source(
    checkpoint: str | Path,
    target: str | Path | None,
    trust_remote_code: bool,
    sglang_version: str | None,
    aux_layers: list[int] | None,
) -> tuple[LoadedDraft, TargetFacts]:
    """The source drafter (`load_source`, its aux ids read by the --target's class) and the target
    facts (the --target's, else the manifest's); ExportError when neither names the target,
    CheckpointError for a wrong vocabulary map (`checkpoint.check_vocab_map`, bound by the
    --target's tokenizer when the manifest records none)."""
    given = TargetFacts.from_target_dir(target, trust_remote_code) if target is not None else None
    reading = (
        IdReading(given.num_layers, given.target_class or "llama", sglang_version, aux_layers)
        if given
        else IdReading()
    )
    source = load_source(checkpoint, reading)
    facts = given or resolve_target(None, source.manifest)
    if facts is None:
        raise ExportError(f"{checkpoint}: no manifest to say what the target is; pass --target DIR")
    check_vocab_map(source.model, source.manifest, checkpoint, tokenizer_length(target))
    return source, facts


def _check_drafter(
    engine: str,
    source: LoadedDraft,
    facts: TargetFacts,
    checkpoint: str | Path,
    target: str | Path | None,
    dtype: str | torch.dtype | None,
    sglang_version: str | None,
) -> list[str]:
    """The drafter against the engine and the target (norm flags, for `sglang_version` when given;
    sizes, embedding: ExportError), then cast to `dtype`; the notes so far."""
    cfg = source.model.cfg
    check_norm_flags(engine, cfg, sglang_version)
    notes = check_target(cfg, facts) + embedding_notes(engine, source, checkpoint, target)
    if dtype is not None and parse_dtype(dtype) != source.model.fc.weight.dtype:
        notes.append(
            f"floating tensors cast from {source.model.fc.weight.dtype} to {parse_dtype(dtype)}"
        )
        source.model.to(parse_dtype(dtype))
    return notes


def _write_and_verify(
    source: LoadedDraft,
    out_dir: Path,
    config: dict[str, Any],
    engine: str,
    facts: TargetFacts,
    sglang_version: str | None,
    layers: list[int],
) -> int:
    """Write to a temp dir, prove tensors and aux reading, then put it in place of `out_dir`
    (`files.atomic_dir`: on any error `out_dir` is left as it was)."""
    layout = LAYOUT_OF_ENGINE[engine]
    with atomic_dir(out_dir) as tmp:
        write_safetensors(
            state_dict_for_layout(source.model, layout),
            tmp / WEIGHTS_FILE,
            metadata={"format": "pt"},
        )
        (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
        if (
            source.manifest is not None
        ):  # the same record, marked as an export (`tune.needs_export`)
            manifest = dataclasses.replace(
                source.manifest, extra={**source.manifest.extra, "export": {"engine": engine}}
            )
            (tmp / MANIFEST_FILE).write_text(manifest.to_json())
        num_tensors = verify_written(source.model, tmp, layout)
        reader = READER_OF_ENGINE[engine]
        # only the key `reader` reads: a nested-only SGLang file is not read as vLLM would misread it
        captured = captured_by(config, reader, facts.num_layers, facts.target_class, sglang_version)
        if captured != layers:
            raise ExportError(
                f"internal: {reader} would read layers {captured} "
                f"from the written config, not {layers}"
            )
    return num_tensors
