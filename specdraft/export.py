"""Export a trained drafter for one serving engine: layout, config rules, refusals, launch command.

`export = convert + one engine's config rules + refusals + launch command` (DESIGN.md §2):
- sglang: the official layout (`midlayer.*`); SGLang reads only the nested
  `eagle_config.eagle_aux_hidden_state_layer_ids`, in its convention (id k = index k+1).
- vllm: the official layout (vLLM renames `midlayer.` to `layers.0.`); the top-level ids, as-is.
- speculators: `layers.0.*` with a speculators config (served by vLLM) whose
  `verifier.name_or_path` must resolve on the serving host.
Each config gets both id keys when both engines can express the layers (one file serves both),
`draft_vocab_size`, `norm_before_residual` and the EAGLE-3.1 norm flags the drafter sets,
`tie_word_embeddings: false` and the drafter's rope/max positions (taken from the target at
training); a flag the engine does not implement is refused (`check_norm_flags`). The manifest is written
alongside. An engine that would read the files differently from training is refused with the
reason. After writing, every tensor is re-read and proven bit-identical under its new name.
The source is a drafter directory (any layout) or a training checkpoint that `train
--save-every` wrote (RUN/checkpoints/step-N.pt, or a step-N directory from several ranks).
"""

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
    Manifest,
    aux_layers_note,
    check_output_dir,
    check_vocab_map,
    is_training_checkpoint,
    load_draft,
    official_config,
    read_config,
    read_weights,
    speculators_config,
    state_dict_for_layout,
    verifier_replaced_note,
    verify_written,
    write_safetensors,
)
from specdraft.conventions import AUX_KEY, ConventionError, captured_by, parse_dtype, to_engine_ids
from specdraft.conventions.engines import (
    SPECULATORS_EXCLUSIVE_FLAGS,
    flag_refusal,
    sglang_embedding,
    sglang_replaces_embedding,
)
from specdraft.draft import NORM_FLAGS, DraftConfig, rope_from_hf_config
from specdraft.engine.spec_config import SpecConfig, chain_rule_message
from specdraft.errors import SpecdraftError
from specdraft.files import atomic_dir

EXPORT_ENGINES = ("sglang", "vllm", "speculators")
LAYOUT_OF_ENGINE = {"sglang": "sglang", "vllm": "sglang", "speculators": "speculators"}
# Which engine's reading of the written config must give back the training layers.
READER_OF_ENGINE = {"sglang": "sglang", "vllm": "vllm", "speculators": "vllm"}
NUM_AUX = 3  # vLLM, SGLang < 0.5.12 hard-code 3 aux states; >= 0.5.12 sizes fc from config
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
)  # a directory's tokenizer


class ExportError(SpecdraftError, ValueError):
    """An export that the engine would read differently from training; names the reason."""


@dataclass(frozen=True)
class TargetFacts:
    """What export and doctor need to know about the target, and where it came from.

    source: "target DIR" (its config.json) or "manifest". target_class: one of
    `conventions.TARGET_CLASSES` | None (unknown). rope_* / max_position_embeddings: None when the source does not say.
    """

    num_layers: int
    hidden_size: int
    vocab_size: int
    target_class: str | None
    architecture: str | None
    rope_theta: float | None
    rope_scaling: dict[str, Any] | None
    max_position_embeddings: int | None
    name_or_path: str | None
    source: str

    @classmethod
    def from_target_dir(cls, path: str | Path, trust_remote_code: bool = False) -> TargetFacts:
        """Read a transformers target directory's config.json (nothing else is loaded), as
        published (`target.read_target_config`: no prompt, no quantization kernels; remote code
        only with `trust_remote_code`)."""
        from specdraft.targets.config import (
            read_target_config,
            target_class_of,
        )  # the engines' class table

        path = Path(path)
        full = read_target_config(path, trust_remote_code)
        text = full.get_text_config()
        theta, scaling = rope_from_hf_config(lambda k, d=None: getattr(text, k, d))
        architecture = (full.architectures or [None])[0]
        return cls(
            text.num_hidden_layers,
            text.hidden_size,
            text.vocab_size,
            target_class_of(architecture, text.model_type),
            architecture,
            theta,
            scaling,
            getattr(text, "max_position_embeddings", None),
            str(path.resolve()),
            f"target {path}",
        )

    @classmethod
    def from_manifest(cls, manifest: Manifest) -> TargetFacts:
        """The target as the manifest recorded it at training (CheckpointError when too thin)."""
        from specdraft.targets.config import target_class_of

        t, draft = manifest.target or {}, manifest.draft or {}
        num_layers = t.get("num_layers") or draft.get("target_num_layers")
        hidden = t.get("hidden_size") or draft.get("target_hidden_size")
        vocab = t.get("vocab_size") or draft.get("vocab_size")
        if not (num_layers and hidden and vocab):
            raise CheckpointError(
                "the manifest does not record the target's layer count, hidden "
                "size and vocabulary; pass the target (--target DIR)"
            )
        # a wrapper's class comes from its architecture (older manifests recorded Llava as "llama")
        target_class = target_class_of(t.get("architecture"), "") or t.get("target_class")
        return cls(
            num_layers,
            hidden,
            vocab,
            target_class,
            t.get("architecture"),
            t.get("rope_theta"),
            t.get("rope_scaling"),
            t.get("max_position_embeddings"),
            t.get("name_or_path"),
            "manifest",
        )


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


def load_source(
    checkpoint: str | Path, target_num_layers: int | None, **reading: Any
) -> LoadedDraft:
    """What export reads (`checkpoint.load_draft`, given `reading`: target class, SGLang version,
    aux_layers): a drafter directory or a training checkpoint (its manifest records the step;
    reading's aux_layers must be its own). Raises CheckpointError naming the path for anything
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
    return load_draft(path, target_num_layers=target_num_layers, **reading)


def resolve_target(target: str | Path | None, manifest: Manifest | None) -> TargetFacts | None:
    """TargetFacts from the target directory when given, else from the manifest, else None."""
    if target is not None:
        return TargetFacts.from_target_dir(target)
    return TargetFacts.from_manifest(manifest) if manifest is not None else None


def spec_for_export(
    engine: str, num_steps: int = 3, topk: int = 1, num_draft_tokens: int | None = None
) -> SpecConfig:
    """The speculative triple of the launch command (SpecConfig's rule; default a 3-step chain).

    num_draft_tokens None = num_steps + 1 (a chain); a tree needs it given. vLLM and
    speculators drafts are chains here. Raises ExportError naming the rule (a value below 1
    included: none is replaced by a default).
    """
    steps, k = num_steps, topk
    for name, value in (("num_steps", steps), ("topk", k), ("num_draft_tokens", num_draft_tokens)):
        if value is not None and (not isinstance(value, int) or value < 1):
            raise ExportError(f"{name} {value!r}: must be >= 1")
    if engine != "sglang" and k != 1:
        raise ExportError(
            f"--topk {k}: the {engine} launch command drafts a chain "
            "(num_speculative_tokens); use --topk 1"
        )
    if k > 1 and num_draft_tokens is None:
        raise ExportError(
            f"--topk {k} (a tree) needs --num-draft-tokens in 2.."
            f"{SpecConfig(steps, k, 2).max_draft_tokens}"
        )
    if engine != "sglang" and num_draft_tokens not in (
        None,
        steps + 1,
    ):  # vLLM: no num_draft_tokens
        raise ExportError(chain_rule_message(steps, num_draft_tokens, engine="vllm"))
    try:
        return SpecConfig(steps, k, steps + 1 if num_draft_tokens is None else num_draft_tokens)
    except ValueError as e:
        raise ExportError(str(e)) from None


def engine_ids(
    layers: list[int], engine: str, facts: TargetFacts, sglang_version: str | None
) -> tuple[list[int] | None, list[int] | None, list[str]]:
    """(top-level ids, nested eagle_config ids, notes) that make `engine` capture `layers`.

    The key the engine reads is required (ExportError with the reason when it cannot express
    the layers); the other key is written when its engine can express them too.
    """
    if len(layers) != NUM_AUX:
        raise ExportError(
            f"cannot export for {engine}: SGLang and vLLM hard-code {NUM_AUX} aux "
            f"states (fc input = {NUM_AUX} x target hidden); this drafter fuses "
            f"{len(layers)} (layers {layers})"
        )
    if facts.target_class is None:
        raise ExportError(
            "the target class (Llama/Qwen, DeepSeek, ...) is unknown, and engines read "
            "aux ids by class: pass the target (--target DIR)"
        )

    def convert(eng: str) -> list[int]:
        return to_engine_ids(layers, eng, facts.num_layers, facts.target_class, sglang_version)

    try:
        ids = convert(engine)
    except ConventionError as e:
        raise ExportError(f"cannot export aux layers {layers} for {engine}: {e}") from None
    if engine == "speculators":
        return ids, None, []
    other = "vllm" if engine == "sglang" else "sglang"
    try:
        other_ids, notes = convert(other), []
    except ConventionError as e:
        other_ids = None
        key = "top-level" if other == "vllm" else "eagle_config"
        notes = [
            (
                f"no {key} ids: {other} cannot capture layers {layers} ({e}); serve this "
                f"export with {engine} only"
            )
        ]
    return (other_ids, ids, notes) if engine == "sglang" else (ids, other_ids, notes)


def _config_for(
    engine: str,
    cfg: DraftConfig,
    dtype: torch.dtype,
    ids: tuple,
    facts: TargetFacts,
    verifier: str | None,
    spec: SpecConfig,
) -> dict[str, Any]:
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


def check_norm_flags(engine: str, cfg: DraftConfig) -> None:
    """Raise ExportError when `engine` does not compute one of the norm flags the drafter sets
    (`conventions.FLAG_RULES`: SGLang has no norm_before_residual), or, for the speculators
    layout, sets both flags the speculators library refuses together. The flags an engine
    implements are written unchanged (`checkpoint.layouts.norm_flags_config`)."""
    set_flags = [name for name in NORM_FLAGS if getattr(cfg, name)]
    reasons = [reason for name in set_flags if (reason := flag_refusal(engine, name))]
    if reasons:
        raise ExportError(
            f"cannot export for {engine}: {'; '.join(reasons)}; this drafter was trained with it "
            "(serve it with vLLM: --engine vllm)"
        )
    if engine == "speculators" and all(name in set_flags for name in SPECULATORS_EXCLUSIVE_FLAGS):
        raise ExportError(
            "cannot export for speculators: the drafter sets both norm_before_fc and fc_norm, which "
            "speculators 0.9.0 refuses together (models/eagle3/config.py _check_norm_flags); "
            "export for vLLM or SGLang (--engine vllm|sglang), which apply both"
        )


def _check_target(cfg: DraftConfig, facts: TargetFacts) -> list[str]:
    """Refuse a target of other sizes; note rope / positions that differ from training."""
    sizes = {
        "num_layers": (cfg.target_num_layers, facts.num_layers),
        "hidden_size": (cfg.target_hidden_size, facts.hidden_size),
        "vocab_size": (cfg.vocab_size, facts.vocab_size),
    }
    bad = [f"{k} {a} (trained) vs {b} ({facts.source})" for k, (a, b) in sizes.items() if a != b]
    if bad:
        raise ExportError(f"the drafter was trained on another target: {'; '.join(bad)}")
    notes = []
    served = {
        "rope_theta": (cfg.rope_theta, facts.rope_theta),
        "rope_scaling": (cfg.rope_scaling, facts.rope_scaling),
        "max_position_embeddings": (cfg.max_position_embeddings, facts.max_position_embeddings),
    }
    for key, (trained, target) in served.items():
        if target is not None and trained != target and facts.source != "manifest":
            notes.append(
                f"{key}: the drafter was trained with {trained}, {facts.source} says "
                f"{target}; the export keeps {trained} (run specdraft doctor)"
            )
    return notes


def launch_command(engine: str, target: str, out_dir: Path, spec: SpecConfig) -> str:
    """The serving command line for an export, with the engine's flags (DESIGN.md §2)."""
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
    `engine` ("sglang" | "vllm" | "speculators") under `out_dir`.

    target: the target's transformers directory (its config gives layer count, class, rope;
    else the manifest's record). verifier: the speculators `verifier.name_or_path` (default:
    the target directory's absolute path, else the manifest's name_or_path). sglang_version:
    pins how SGLang reads explicit ids where versions differ (DeepSeek class, embeddings).
    num_steps / topk / num_draft_tokens: the launch command's settings, validated like
    SpecConfig (default a 3-step chain; num_draft_tokens None = num_steps + 1). dtype: "bf16" | "fp16" | "fp32" to cast the floating
    tensors (round to nearest; d2t / t2d keep theirs), None to keep the checkpoint's. aux_layers:
    the training layers (specdraft indices) of a drafter without a manifest, replacing its config's
    ids (default: those ids, else the engines' default, `layouts.aux_layers_of_config`).
    trust_remote_code: read a target config whose model_type only its own code defines; the
    written tensors are then proven bit-identical to the cast. Writes to a temp directory, re-reads it strictly and
    proves every tensor bit-identical, then renames. Raises ExportError with the reason for
    anything the engine would read differently from training; CheckpointError for a bad source
    (a wrong vocabulary map included, `checkpoint.check_vocab_map`). With `target`, its tokenizer
    (when it has one) is compared with the manifest's record: a difference is a note.
    """
    if engine not in EXPORT_ENGINES:
        raise ExportError(f"unknown engine {engine!r}; choose one of {', '.join(EXPORT_ENGINES)}")
    spec = spec_for_export(engine, num_steps, topk, num_draft_tokens)
    out_dir = check_output_dir(out_dir, source=checkpoint)
    given = TargetFacts.from_target_dir(target, trust_remote_code) if target is not None else None
    reading = (
        {
            "target_class": given.target_class or "llama",
            "sglang_version": sglang_version,
            "aux_layers": aux_layers,
        }
        if given
        else {}
    )
    source = load_source(checkpoint, given.num_layers if given else None, **reading)
    facts = given or resolve_target(None, source.manifest)
    if facts is None:
        raise ExportError(f"{checkpoint}: no manifest to say what the target is; pass --target DIR")
    check_vocab_map(source.model, source.manifest, checkpoint)
    cfg, layers = source.model.cfg, list(source.model.cfg.aux_layers)
    check_norm_flags(engine, cfg)
    notes = _check_target(cfg, facts) + _embedding_notes(engine, source, checkpoint, target)
    if dtype is not None and parse_dtype(dtype) != source.model.fc.weight.dtype:
        notes.append(
            f"floating tensors cast from {source.model.fc.weight.dtype} to {parse_dtype(dtype)}"
        )
        source.model.to(parse_dtype(dtype))
    top, nested, id_notes = engine_ids(layers, engine, facts, sglang_version)
    notes += _ids_notes(layers, top, nested) + id_notes
    verifier, verifier_notes = _verifier(engine, verifier, facts)
    replaced = (
        verifier_replaced_note(read_config(Path(checkpoint)), verifier)
        if engine == "speculators" and not is_training_checkpoint(checkpoint)
        else None
    )
    notes += verifier_notes + ([replaced] if replaced else [])
    config = _config_for(
        engine, cfg, source.model.fc.weight.dtype, (top, nested), facts, verifier, spec
    )
    num_tensors = _write_and_verify(source, out_dir, config, engine, facts, sglang_version, layers)
    notes += _source_notes(source, checkpoint, aux_layers) + _tokenizer_notes(
        source, checkpoint, target
    )
    return ExportResult(
        out_dir,
        engine,
        config,
        launch_command(engine, verifier or "TARGET", out_dir.resolve(), spec),
        spec,
        notes,
        num_tensors - len(source.derived),
        source.derived,
    )


def _embedding_notes(
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


def _ids_notes(layers: list[int], top: list[int] | None, nested: list[int] | None) -> list[str]:
    """The note naming the aux layers and the ids each key holds."""
    id_keys = [
        f"{key} ids {ids} ({reader})"
        for key, ids, reader in (("top-level", top, "vLLM"), ("eagle_config", nested, "SGLang"))
        if ids is not None
    ]
    return [f"aux layers {layers} (specdraft indices): {', '.join(id_keys)}"]


def _verifier(
    engine: str, verifier: str | None, facts: TargetFacts
) -> tuple[str | None, list[str]]:
    """The verifier name (given, else the target's) and its note; speculators needs one (ExportError)."""
    verifier = verifier or facts.name_or_path
    if engine != "speculators":
        return verifier, []
    if not verifier:
        raise ExportError(
            "speculators needs verifier.name_or_path: pass --target DIR or --verifier NAME"
        )
    return verifier, [
        f"verifier.name_or_path = {verifier!r} must resolve on the serving host "
        "(a path there or a hub name); pass --verifier NAME to change it"
    ]


def _source_notes(
    source: LoadedDraft, checkpoint: str | Path, aux_layers: list[int] | None
) -> list[str]:
    """What the source's manifest means for the export: none (and where the aux layers came from,
    `layouts.aux_layers_note`), or a training checkpoint's step."""
    if source.manifest is None:
        aux = aux_layers_note(
            read_config(Path(checkpoint)), None, source.model.cfg.target_num_layers, aux_layers
        )
        return ["the source has no specdraft manifest: doctor cannot compare with training"] + (
            [aux] if aux else []
        )
    if "checkpoint" in (source.manifest.training or {}):
        return [
            f"the drafter of training checkpoint {checkpoint} (step {source.manifest.training['steps']}); "
            "its manifest records the step"
        ]
    return []


def _tokenizer_notes(
    source: LoadedDraft, checkpoint: str | Path, target: str | Path | None
) -> list[str]:
    """The note on a --target tokenizer that differs from the manifest's (`engine.load.tokenizer_notes`);
    none without --target, a manifest's tokenizer record, or tokenizer files in the target directory."""
    from specdraft.engine.load import tokenizer_notes

    if target is None or source.manifest is None or not source.manifest.tokenizer:
        return []
    if not any((Path(target) / name).is_file() for name in TOKENIZER_FILES):
        return []
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(target, local_files_only=True)
    except (OSError, ValueError) as e:
        return [
            f"{target}: its tokenizer cannot be read ({type(e).__name__}), so it is not compared with "
            "the one the drafter was trained with"
        ]
    return tokenizer_notes(source.manifest, tokenizer, checkpoint, target)


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
