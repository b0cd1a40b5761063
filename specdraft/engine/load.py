"""Loading the engine from disk: a transformers target directory as a `FastTarget` (strict, one
table of the checkpoint layout), a drafter (a specdraft / exported drafter directory, or a
training checkpoint) paired with it, the checks of the drafter's manifest against the target,
and the notes on what loads but differs from the drafter's training (`pairing_notes`).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from specdraft.checkpoint.id_reading import IdReading
from specdraft.dflash import DFlashDraft
from specdraft.draft import Eagle3Draft
from specdraft.engine.errors import EngineError, EngineFileMissing
from specdraft.engine.fast_config import ModelArgs
from specdraft.engine.fast_load import load_fast_target
from specdraft.engine.fast_model import FastTarget
from specdraft.engine.spec_config import SpecConfig
from specdraft.engine.speculate import SpeculativeEngine


def load_engine(
    target_dir: str | Path,
    draft_dir: str | Path | None,
    spec: SpecConfig | None,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    max_seq_len: int | None = None,
    tokenizer: Any = None,
    compile: bool = False,
    reading: IdReading | None = None,
) -> SpeculativeEngine:
    """Load the target (`load_engine_target`: the fast path where it applies, else the
    transformers-backed one; `engine.target_path` says which, a note says why) and (optionally)
    a draft checkpoint, and pair them. compile applies to the fast path only.

    The drafter gets the target's embedding unless it owns one. Its manifest (specdraft layout)
    must name the drafter's aux layers and the target's hidden size / layer count / vocab.
    A drafter trained for another target (the manifest's target record, else the sizes its
    config was built for) is refused naming both targets, before any tensor meets the target.
    max_seq_len defaults to min(target max positions, 4096). Raises ValueError on a mismatch,
    and the loaders' errors for unreadable checkpoints. draft_dir None or spec None = plain.
    draft_dir may be a DFlash drafter directory (`checkpoint.dflash.is_dflash_dir`: `load_block_draft`;
    its engine proposer is `dflash_block.DFlashBlock`) or a training checkpoint (RUN/checkpoints/step-N.pt or a sharded step-N
    directory, `checkpoint.load_training_checkpoint`: the drafter and its manifest come from it);
    a run directory or its checkpoints directory is refused naming RUN/draft and a step-N file.
    reading: how a drafter directory without a manifest names its aux layers (`IdReading`:
    target_class / sglang_version / aux_layers, `cli.reading.id_reading` of --aux-layers; None:
    the loader's defaults); the layer count is the target's. A drafter that records its aux layers (manifest, training checkpoint)
    refuses other aux_layers (`checkpoint.refuse_other_aux_layers`). What loads but differs from the drafter's training is in the engine's
    `notes` (`pairing_notes`), and so is where a manifest-less drafter's aux layers came from
    when its config names none (`checkpoint.aux_layers_note`).
    """
    speculative = draft_dir is not None and spec is not None
    if speculative:  # before the target loads: a run directory is no drafter
        refuse_run_directory(Path(draft_dir))
    target, path_note = load_engine_target(target_dir, dtype, device)
    max_seq_len = max_seq_len or min(target.args.max_position_embeddings, 4096)
    draft = loaded = None
    if speculative:
        loaded = load_paired_draft(draft_dir, target, target_dir, device, dtype, reading)
        draft = loaded.model
    engine = SpeculativeEngine(
        target, draft, spec, None, max_seq_len, device, tokenizer, compile and path_note is None
    )  # no CUDA graphs of transformers' forward
    engine.target_path = "fast" if path_note is None else "transformers"
    engine.notes = [path_note] if path_note else []
    if draft is not None:
        engine.notes += pairing_notes(loaded.manifest, draft_dir, target_dir, spec, tokenizer)
        engine.notes += aux_layers_notes(loaded, reading.aux_layers if reading else None)
    return engine


def load_engine_target(
    target_dir: str | Path, dtype: torch.dtype, device: torch.device | str
) -> tuple[Any, str | None]:
    """The engine's target: a `FastTarget` where its config applies (Llama/Qwen2/Qwen3/Mistral,
    `ModelArgs.from_hf_config`), else any decoder LM `specdraft.targets.load_target` reads, behind
    an `hf_target.HFTarget`; with None, or the one-line note saying the transformers path runs
    and why. Raises what the loader it picks raises (FileNotFoundError, ValueError)."""
    from specdraft.engine.hf_target import TRANSFORMERS_PATH, HFTarget  # imports transformers
    from specdraft.targets import load_target

    config_path = Path(target_dir) / "config.json"
    if not config_path.is_file():
        raise EngineFileMissing(
            f"{config_path}: not found (expected a transformers model directory)"
        )
    try:
        ModelArgs.from_hf_config(json.loads(config_path.read_text()))
    except ValueError as why:
        note = (
            f"target runs on the {TRANSFORMERS_PATH}, slower than the fast path, which does not "
            f"apply: {why}"
        )
        return HFTarget(load_target(target_dir, dtype=dtype, device=device)), note
    return load_fast_target(target_dir, dtype=dtype, device=device), None


def refuse_run_directory(path: Path) -> None:
    """Raise ValueError when `path` is a training run directory or its checkpoints directory
    (not a drafter), naming RUN/draft and one of its step-N checkpoints."""
    from specdraft.checkpoint import CHECKPOINT_DIR, checkpoint_paths, is_training_checkpoint

    run, what = None, ""
    if path.is_dir() and not (path / "config.json").exists() and not is_training_checkpoint(path):
        if (path / CHECKPOINT_DIR).is_dir():
            run, what = path, "a training run directory"
        elif path.name == CHECKPOINT_DIR or any(path.glob("step-*")):
            run, what = path.parent, "a training run's checkpoints directory"
    if run is not None:
        steps = checkpoint_paths(run)
        example = steps[-1] if steps else run / CHECKPOINT_DIR / "step-N.pt"
        raise EngineError(
            f"{path} is {what}, not a drafter: pass {run / 'draft'} (the drafter train "
            f"writes at the end) or one of its checkpoints, e.g. {example}"
        )


def load_paired_draft(
    draft_dir: str | Path,
    target: FastTarget,
    target_dir: str | Path,
    device: torch.device | str,
    dtype: torch.dtype,
    reading: IdReading | None = None,
) -> Any:
    """The drafter at draft_dir (a drafter directory or a training checkpoint), in eval mode, in
    `dtype` on `device`, with the target's embedding unless it owns one: the loader's result
    (.model, .manifest); a directory read by `reading` (`load_engine`'s). Raises ValueError when it was trained for another target (`check_trained_for`,
    `check_manifest`), CheckpointError for a wrong vocabulary map (`checkpoint.check_vocab_map`)."""
    from specdraft.checkpoint import check_vocab_map, load_draft
    from specdraft.checkpoint.dflash import is_dflash_drafter

    if is_dflash_drafter(draft_dir):
        return load_block_draft(draft_dir, target, target_dir, device, dtype)
    reading = replace(reading or IdReading(), target_num_layers=target.args.num_layers)
    loaded = load_draft(draft_dir, device=device, dtype=dtype, **reading.keywords())
    draft = loaded.model.eval()
    check_trained_for(loaded.manifest, draft, target, draft_dir, target_dir)
    if not draft.cfg.owns_embedding:
        draft.load_target_embedding(target.tok_embeddings.weight)
    check_manifest(loaded.manifest, draft, target, Path(draft_dir))
    check_vocab_map(draft, loaded.manifest, draft_dir)
    return loaded


def load_block_draft(
    draft_dir: str | Path,
    target: FastTarget,
    target_dir: str | Path,
    device: torch.device | str,
    dtype: torch.dtype,
) -> Any:
    """The DFlash drafter directory draft_dir (`checkpoint.dflash.load_dflash_draft`, strict), in
    eval mode, in `dtype` on `device`, with the target's embedding and lm_head
    (`dflash_block.target_head`): a `checkpoint.LoadedDraft` (layout "dflash"). Raises EngineError
    when it was trained for another target (its manifest's record, else its config's sizes:
    `check_trained_for`, `check_manifest`), CheckpointError as the loader does."""
    from specdraft.checkpoint import LoadedDraft
    from specdraft.checkpoint.dflash import load_dflash_draft
    from specdraft.engine.dflash_block import target_head

    draft, manifest = load_dflash_draft(
        draft_dir, device=device, dtype=dtype, target_num_layers=target.args.num_layers
    )
    check_trained_for(manifest, draft, target, draft_dir, target_dir)
    check_manifest(manifest, draft, target, Path(draft_dir))
    draft.load_target_head(*target_head(target))
    return LoadedDraft(model=draft.eval(), manifest=manifest, layout="dflash", path=Path(draft_dir))


def aux_layers_notes(loaded: Any, aux_layers: list[int] | None) -> list[str]:
    """The line saying where a manifest-less drafter's aux layers came from (`checkpoint.aux_layers_note`:
    the engines' default when its config names none, or --aux-layers), as a list; [] otherwise."""
    from specdraft.checkpoint import aux_layers_note, read_config

    if loaded.manifest is not None or loaded.layout == "dflash":  # DFlash configs name their layers
        return []
    note = aux_layers_note(
        read_config(loaded.path), None, loaded.model.cfg.target_num_layers, aux_layers
    )
    return [note] if note else []


def check_trained_for(
    manifest: Any,
    draft: Eagle3Draft | DFlashDraft,
    target: FastTarget,
    draft_dir: str | Path,
    target_dir: str | Path,
) -> None:
    """Raise ValueError naming both targets when the drafter was trained for another one: the
    manifest's target record, else the sizes its config was built for, against the target's."""
    cfg, args = draft.cfg, target.args
    trained = (
        dict(manifest.target)
        if manifest is not None
        else {
            "num_layers": cfg.target_num_layers,
            "hidden_size": cfg.target_hidden_size,
            "vocab_size": cfg.vocab_size,
        }
    )
    given = {
        "num_layers": args.num_layers,
        "hidden_size": args.hidden_size,
        "vocab_size": args.vocab_size,
    }
    refuse_other_target(trained, given, draft_dir, target_dir)


def refuse_other_target(
    trained: dict[str, Any], given: dict[str, Any], draft_dir: str | Path, target_dir: str | Path
) -> None:
    """Raise ValueError naming both targets when a size the drafter records (`trained`:
    num_layers, hidden_size, vocab_size, name_or_path; a size absent or None is not compared)
    differs from the target's (`given`)."""
    differ = [k for k, v in given.items() if trained.get(k) is not None and trained[k] != v]
    if not differ:
        return

    def sizes(r: dict) -> str:
        parts = (
            f"{r.get('num_layers')} layers",
            f"hidden {r.get('hidden_size')}",
            f"vocab {r.get('vocab_size')}",
        )
        return ", ".join(
            p
            for p, key in zip(parts, ("num_layers", "hidden_size", "vocab_size"))
            if r.get(key) is not None
        )

    recorded = trained.get("name_or_path")
    trained_for = (
        f"{recorded} ({sizes(trained)})"
        if recorded
        else f"one of {sizes(trained)} (path not recorded)"
    )
    raise EngineError(
        f"{draft_dir}: this drafter was trained for another target: {trained_for}, not "
        f"{target_dir} ({sizes(given)}; {', '.join(differ)} differ{'s' * (len(differ) == 1)}); "
        f"pass the target it was trained for, or a drafter trained for {target_dir}"
    )


def config_notes(manifest: Any, draft_dir: str | Path, target_dir: str | Path) -> list[str]:
    """`pairing_notes`' note on the target config (none when its hash matches the manifest's
    record, or none is recorded): the rope / max-positions values that changed, else the hash."""
    from transformers import AutoConfig

    from specdraft.draft_config import rope_from_hf_config
    from specdraft.targets.config import config_hash

    recorded, config = (
        manifest.target.get("config_hash"),
        AutoConfig.from_pretrained(target_dir, local_files_only=True),
    )
    digest = config_hash(config)
    if not recorded or digest == recorded:
        return []
    text = config.get_text_config()
    rope_theta, rope_scaling = rope_from_hf_config(lambda k, d=None: getattr(text, k, d))
    now = {
        "rope_theta": rope_theta,
        "rope_scaling": rope_scaling,
        "max_position_embeddings": getattr(text, "max_position_embeddings", None),
    }
    changed = [
        f"{key} {manifest.target[key]} -> {value}"
        for key, value in now.items()
        if key in manifest.target and manifest.target[key] != value
    ]
    what = ", ".join(changed) or f"config hash {recorded[:12]} -> {digest[:12]}"
    return [
        f"{target_dir}: its config differs from the one the drafter was trained on ({what}): "
        f"acceptance may drop; `specdraft doctor {draft_dir} --target {target_dir}` names the difference"
    ]


def pairing_notes(
    manifest: Any,
    draft_dir: str | Path,
    target_dir: str | Path,
    spec: SpecConfig,
    tokenizer: Any = None,
) -> list[str]:
    """What loads but is not what the drafter was trained for (each a one-line note; the sizes
    were checked before): a target config whose hash differs from the manifest's record (the same
    sizes, e.g. another rope_theta: the aux states move; a transformers release that adds config
    fields changes the hash too, so this is a note, not an error), a tokenizer (when given) whose
    fingerprint differs from the manifest's (`tokenizer_notes`), and num_steps past the drafter's
    TTT steps (positions training never unrolled to). No manifest: nothing to compare."""
    if manifest is None:
        return []
    notes = config_notes(manifest, draft_dir, target_dir)
    notes += tokenizer_notes(manifest, tokenizer, draft_dir, target_dir)
    ttt_steps = ((manifest.training or {}).get("config") or {}).get("ttt_steps")
    if (manifest.extra or {}).get("method") == "dflash":
        ttt_steps = None  # a block drafter is trained without a TTT unroll
    if ttt_steps and spec.num_steps > ttt_steps:
        notes.append(
            f"num_steps {spec.num_steps} > the drafter's {ttt_steps} training-time-test steps: draft "
            f"steps past {ttt_steps} were never trained and are rarely accepted"
        )
    return notes


def tokenizer_notes(
    manifest: Any, tokenizer: Any, draft_dir: str | Path, target_dir: str | Path
) -> list[str]:
    """The one-line note (generate, serve, export) when `tokenizer`'s fingerprint differs from the
    one the manifest records (`data.render.tokenizer_changes`); [] when it matches or either is absent."""
    from specdraft.data.render import tokenizer_changes

    if manifest is None or tokenizer is None:
        return []
    changed = tokenizer_changes(manifest.tokenizer, tokenizer)
    if not changed:
        return []
    return [
        f"{target_dir}: its tokenizer differs from the one the drafter was trained with ({', '.join(changed)}): "
        f"acceptance may drop; `specdraft doctor {draft_dir} --target {target_dir}` names the difference"
    ]


def check_manifest(
    manifest: Any, draft: Eagle3Draft | DFlashDraft, target: FastTarget, path: Path
) -> None:
    """Raise ValueError when a specdraft manifest disagrees with the drafter or the target."""
    if manifest is None:
        return
    problems = []
    if list(manifest.aux_layers) != list(draft.cfg.aux_layers):
        problems.append(
            f"manifest aux_layers {manifest.aux_layers} != drafter config "
            f"{list(draft.cfg.aux_layers)}"
        )
    for key, value in (
        ("hidden_size", target.args.hidden_size),
        ("num_layers", target.args.num_layers),
        ("vocab_size", target.args.vocab_size),
    ):
        if key in manifest.target and manifest.target[key] != value:
            problems.append(f"manifest target {key} {manifest.target[key]} != the target's {value}")
    if problems:
        raise EngineError(f"{path}: drafter was trained for another target: " + "; ".join(problems))
