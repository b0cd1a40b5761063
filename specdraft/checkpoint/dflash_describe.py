"""What `specdraft inspect` says of a DFlash drafter: its form, block, mask token, target layers
in both numberings, how each engine reads its config.json (`conventions.dflash_reads`), and its
tensors' audit (every value finite)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from specdraft.checkpoint.dflash import dflash_config_json, load_dflash_draft
from specdraft.checkpoint.dflash_forms import dflash_form
from specdraft.checkpoint.dirs import is_training_checkpoint, read_config
from specdraft.checkpoint.manifest import Manifest
from specdraft.conventions import ENGINE_NAMES
from specdraft.conventions import dflash_reads as reads
from specdraft.dflash import DFlashDraft

FORM_NAMES = {
    "dflash": "DFlashDraftModel config (z-lab's, SpecForge's, specdraft's form)",
    "speculators": "speculators dflash config (loaded by vLLM)",
}


@dataclass(frozen=True)
class DFlashDescription:
    """A DFlash drafter read for inspect: the model, its manifest (None without one), the lines
    describing it, and the audit's problems (empty: every tensor finite)."""

    model: DFlashDraft
    manifest: Manifest | None
    lines: list[str]
    problems: list[str]


def describe_dflash(path: str | Path, target_num_layers: int | None = None) -> DFlashDescription:
    """The DFlash drafter directory or DFlash run's training checkpoint `path` read strictly
    (`load_dflash_draft`, `target_num_layers` for a form that does not record it) and described
    (a checkpoint's engine readings: of the config.json export writes for it). Raises
    CheckpointError as the loader."""
    path = Path(path)
    model, manifest = load_dflash_draft(path, target_num_layers=target_num_layers)
    cfg = model.cfg
    if is_training_checkpoint(path):
        config = dflash_config_json(cfg)
        form = f"training checkpoint (step {manifest.training['steps']}; export writes its files)"
    else:
        config = read_config(path)
        form = FORM_NAMES[dflash_form(config)]
    lines = [
        f"{path}: DFlash drafter, {form}, {'with' if manifest else 'no'} specdraft manifest",
        f"block size {cfg.block_size} (anchor + {cfg.block_size - 1} drafts); mask token "
        f"{cfg.mask_token_id}; {cfg.num_hidden_layers} draft layers, hidden {cfg.hidden_size}, "
        f"vocab {cfg.vocab_size} (the target's embedding and lm_head)",
        f"target layer ids (DFlash, 0-based) {list(cfg.target_layer_ids)} of "
        f"{cfg.target_num_layers} = aux layers (specdraft indices) {list(cfg.aux_layers)}",
    ]
    lines += [engine_line(config, engine, cfg.block_size) for engine in reads.DFLASH_ENGINES]
    if manifest is not None and list(manifest.aux_layers) != list(cfg.aux_layers):
        lines.append(f"manifest aux layers {manifest.aux_layers} differ from the config's")
    bad = [k for k, v in model.state_dict().items() if not torch.isfinite(v).all()]
    problems = [f"tensors with NaN or inf values: {', '.join(bad)}"] if bad else []
    return DFlashDescription(model, manifest, lines, problems)


def engine_line(config: dict, engine: str, block_size: int) -> str:
    """How `engine` reads the drafter's config.json: layers captured, attention, the setting."""
    reading = reads.vllm_reading(config) if engine == "vllm" else config
    layers = reads.engine_aux_layers(reading, engine)
    attention = sorted({a.describe() for a in reads.engine_attention(reading, engine)})
    setting = (
        f"--speculative-num-draft-tokens {block_size}"
        if engine == "sglang"
        else f"num_speculative_tokens {reads.engine_num_speculative_tokens(engine, block_size)}"
    )
    return (
        f"{ENGINE_NAMES[engine]} reads: aux layers {list(layers) if layers else 'none named'}; "
        f"draft attention {' / '.join(attention)}; the trained block is served by {setting}"
    )
