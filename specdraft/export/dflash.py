"""`export_dflash`: a DFlash drafter (`checkpoint.dflash`, any published form) for SGLang, vLLM or
the speculators form, with the launch command whose setting serves the trained block (vLLM: or
--num-steps N drafts of it, `served_setting`).

What each engine reads (`conventions.dflash.DFLASH_FACTS`, `conventions.dflash_reads`):
- sglang / vllm: z-lab's form (`checkpoint.dflash.dflash_config_json`): architectures
  DFlashDraftModel, block_size top-level and in dflash_config, dflash_config.target_layer_ids
  0-based (SGLang captures id + 1; vLLM reads them + 1 as specdraft indices), mask_token_id,
  every layer full attention; tensors layers.{i}.*, fc, hidden_norm, norm (no embedding, no head:
  both engines take the target's). Launch: SGLang `--speculative-algorithm DFLASH
  --speculative-num-draft-tokens B`, vLLM `{"method": "dflash", "num_speculative_tokens": B-1}`.
- speculators: speculators' DFlash config (speculators_model_type "dflash"), which vLLM 0.32
  translates (algos.update_dflash); the same tensors; `vllm serve OUT`.
After writing, the files are re-read strictly and every tensor is proven bit-identical, and the
written config is read back as the engine reads it (layers, attention, block).
"""

from __future__ import annotations

import dataclasses
import json
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from specdraft.checkpoint import MANIFEST_FILE, WEIGHTS_FILE, check_output_dir, write_safetensors
from specdraft.checkpoint.dflash import dflash_config_json, is_dflash_dir, load_dflash_draft
from specdraft.checkpoint.manifest import Manifest
from specdraft.conventions import dflash_reads as reads
from specdraft.conventions import parse_dtype
from specdraft.dflash import DFlashDraft
from specdraft.export.refusals import ExportError, ExportOptionError
from specdraft.export.run import EXPORT_ENGINES, READER_OF_ENGINE
from specdraft.export.target_facts import TargetFacts
from specdraft.files import atomic_dir

# export's options that set an EAGLE-3 chain or tree; a DFlash drafter's setting is its block
# (--num-steps: the drafts a round, `served_setting`).
EAGLE3_ONLY_OPTIONS = (
    "--topk",
    "--num-draft-tokens",
    "--aux-layers",
    "--sglang-version",
)


@dataclass(frozen=True)
class DFlashExport:
    """What `export_dflash` wrote: directory, engine, config.json as written, the launch command,
    the block it serves and the engine's setting for it, notes, tensors proven identical."""

    out_dir: Path
    engine: str
    config: dict[str, Any]
    launch_command: str
    block_size: int
    num_speculative_tokens: int
    notes: list[str]
    num_tensors: int


def refuse_eagle3_options(checkpoint: str | Path, given: list[str]) -> None:
    """ExportOptionError naming the EAGLE-3-only options (EAGLE3_ONLY_OPTIONS) given for a DFlash
    drafter: its block size, fixed at training, bounds the speculative setting (--num-steps:
    `served_setting`)."""
    eagle = [o for o in given if o in EAGLE3_ONLY_OPTIONS]
    if eagle:
        what, them = (
            ("EAGLE-3 settings", "them") if len(eagle) > 1 else ("an EAGLE-3 setting", "it")
        )
        raise ExportOptionError(
            f"{', '.join(eagle)}: {what}, and {checkpoint} is a DFlash drafter, whose setting is "
            "the block it was trained on (the launch line serves it; --num-steps N sets the "
            f"drafts a round); drop {them}"
        )


def served_setting(engine: str, block_size: int, num_steps: int | None) -> int:
    """The engine's setting (`dflash_reads.engine_num_speculative_tokens`'s units) for `num_steps`
    drafts a round of a drafter trained on blocks of `block_size` (None: the trained block's
    block_size - 1). vLLM 0.32 drafts num_speculative_tokens K mask queries after the bonus
    token, 1 <= K <= block_size - 1 of the trained positions (`conventions.dflash` DFLASH_FACTS);
    SGLang's DFLASH worker drafts a block of the size given, so only the trained block serves
    it; the speculators form drafts the block its config names. Raises ExportOptionError
    otherwise."""
    trained = block_size - 1
    setting = reads.engine_num_speculative_tokens(READER_OF_ENGINE[engine], block_size)
    if num_steps is None or num_steps == trained:
        return setting
    if engine == "vllm" and 1 <= num_steps < trained:
        return num_steps
    if engine == "vllm":
        raise ExportOptionError(
            f"--num-steps {num_steps}: the drafter was trained on blocks of {block_size} "
            f"({trained} drafts after the anchor), and vLLM would draft positions never trained; "
            f"give 1..{trained}"
        )
    if engine == "sglang":
        raise ExportOptionError(
            f"--num-steps {num_steps}: SGLang's DFLASH worker would draft a block of "
            f"--speculative-num-draft-tokens {num_steps + 1}, unlike the trained block of "
            f"{block_size}; drop --num-steps (SGLang serves the trained block), or export "
            f"--engine vllm, which drafts 1..{trained} of it"
        )
    raise ExportOptionError(
        f"--num-steps {num_steps}: the speculators form serves the trained block of {block_size} "
        f"({trained} drafts); drop --num-steps, or export --engine vllm, which drafts 1..{trained}"
    )


def export_dflash(
    checkpoint: str | Path,
    out_dir: str | Path,
    engine: str,
    *,
    dtype: str | torch.dtype | None = None,
    target: str | Path | None = None,
    trust_remote_code: bool = False,
    verifier: str | None = None,
    num_steps: int | None = None,
) -> DFlashExport:
    """Write the DFlash drafter directory `checkpoint` for `engine` (EXPORT_ENGINES) under
    `out_dir`: to a temp directory, re-read strictly with every tensor proven bit-identical (to
    the cast, with `dtype`: "bf16" | "fp16" | "fp32"), then renamed over it. target: the target's
    directory (its layer count and vocabulary must be the drafter's; else the manifest's record);
    verifier: speculators' verifier.name_or_path (default: the target's path, else the
    manifest's); num_steps: the drafts a round the launch line sets (`served_setting`; default
    the trained block's). Raises ExportOptionError for a num_steps the engine cannot serve,
    ExportError for a target the drafter does not fit or a speculators export without a
    verifier; CheckpointError for a bad source (`load_dflash_draft`)."""
    if engine not in EXPORT_ENGINES:
        raise ExportError(f"unknown engine {engine!r}; choose one of {', '.join(EXPORT_ENGINES)}")
    out_dir = _output_dir(checkpoint, out_dir)
    given = TargetFacts.from_target_dir(target, trust_remote_code) if target else None
    model, manifest = load_dflash_draft(
        checkpoint, target_num_layers=given.num_layers if given else None
    )
    facts = given or (TargetFacts.from_manifest(manifest) if manifest else None)
    notes = _check_target(model, facts, checkpoint)
    block = model.cfg.block_size
    setting = served_setting(engine, block, num_steps)
    if target:
        _refuse_mask_conflict(model, Path(target))
    if dtype is not None and parse_dtype(dtype) != model.fc.weight.dtype:
        notes.append(f"floating tensors cast from {model.fc.weight.dtype} to {parse_dtype(dtype)}")
        model.to(parse_dtype(dtype))
    verifier = verifier or (facts.name_or_path if facts else None)
    if engine == "speculators" and not verifier:
        raise ExportError(
            "speculators needs verifier.name_or_path: pass --target DIR or --verifier NAME"
        )
    config = engine_config(engine, model, verifier, facts)
    num_tensors = _write_and_prove(model, manifest, out_dir, config, engine)
    command = dflash_launch_command(engine, verifier or "TARGET", out_dir, setting)
    notes += engine_notes(engine, model, verifier, setting)
    return DFlashExport(out_dir, engine, config, command, block, setting, notes, num_tensors)


def _output_dir(checkpoint: str | Path, out_dir: str | Path) -> Path:
    """`out_dir`, absolute: an earlier DFlash export there is replaced; anything else as
    `checkpoint.check_output_dir` allows (never the source itself)."""
    out = Path(out_dir).resolve()
    if is_dflash_dir(out) and out != Path(checkpoint).resolve():
        return out
    return check_output_dir(out_dir, source=checkpoint)


def _check_target(model: DFlashDraft, facts: TargetFacts | None, checkpoint) -> list[str]:
    """ExportError when the target has another layer count or vocabulary than the drafter was
    built for (its layer ids would name other layers, its mask token another row); the notes."""
    cfg = model.cfg
    if facts is None:
        return [f"{checkpoint} has no manifest: the target is not checked (pass --target DIR)"]
    if (facts.num_layers, facts.vocab_size) != (cfg.target_num_layers, cfg.vocab_size):
        raise ExportError(
            f"{facts.source}: {facts.num_layers} layers and {facts.vocab_size} ids, but the "
            f"drafter was trained on a target of {cfg.target_num_layers} layers and "
            f"{cfg.vocab_size} ids (its target_layer_ids {list(cfg.target_layer_ids)} and mask "
            f"token {cfg.mask_token_id} belong to that target); pass its own target"
        )
    return []


def _refuse_mask_conflict(model: DFlashDraft, target: Path) -> None:
    """ExportError when the target's tokenizer holds the mask token's text at another id than the
    drafter's (`dflash_reads.mask_token_conflict`: SGLang would refuse to start); a target
    without a tokenizer `targets.tokenizer.load_target_tokenizer` loads is not checked."""
    from specdraft.targets.tokenizer import TargetTokenizerError, load_target_tokenizer

    try:
        vocab = load_target_tokenizer(target).get_vocab()
    except TargetTokenizerError:
        return
    conflict = reads.mask_token_conflict(dflash_config_json(model.cfg), vocab)
    if conflict is not None:
        raise ExportError(
            f"{target}: its tokenizer holds {conflict[0]!r} at id {conflict[1]}, the drafter's "
            f"mask token is {model.cfg.mask_token_id}: SGLang refuses to start on it; serve the "
            "tokenizer the drafter was trained with"
        )


def engine_config(
    engine: str, model: DFlashDraft, verifier: str | None, facts: TargetFacts | None
) -> dict[str, Any]:
    """config.json for `engine`: z-lab's form (sglang, vllm) or speculators' DFlash config."""
    config = dflash_config_json(model.cfg)
    config["torch_dtype"] = str(model.fc.weight.dtype).removeprefix("torch.")
    if engine != "speculators":
        return config
    cfg = model.cfg
    layer = {k: v for k, v in config.items() if k not in ("dflash_config", "block_size")}
    layer.pop("num_target_layers")
    return {
        "architectures": ["DFlashSpeculator"],
        "speculators_model_type": "dflash",
        "speculators_version": "0.9.0",
        "transformer_layer_config": {**layer, "architectures": ["Qwen3ForCausalLM"]},
        "draft_vocab_size": cfg.vocab_size,
        "target_hidden_size": cfg.hidden_size,
        "block_size": cfg.block_size,
        "aux_hidden_state_layer_ids": list(cfg.aux_layers),
        "mask_token_id": cfg.mask_token_id,
        # vLLM 0.32 sets dflash_config.causal = not this (default True) for every layer
        "sliding_window_non_causal": True,
        "projector_type": "dflash",
        "sample_from_anchor": False,
        "speculators_config": {
            "algorithm": "dflash",
            "default_proposal_method": "greedy",
            "proposal_methods": [
                {"proposal_type": "greedy", "speculative_tokens": cfg.block_size - 1}
            ],
            "verifier": {
                "name_or_path": verifier,
                "architectures": [facts.architecture] if facts and facts.architecture else [],
            },
        },
    }


def _write_and_prove(
    model: DFlashDraft, manifest: Manifest | None, out_dir: Path, config: dict, engine: str
) -> int:
    """Write to a temp dir; re-read it strictly (every tensor bit-identical) and read the config as
    the engine does (layers, attention); then put it in place of `out_dir`. Returns the count."""
    tensors = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    with atomic_dir(out_dir) as tmp:
        write_safetensors(tensors, tmp / WEIGHTS_FILE, metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
        if manifest is not None:
            extra = {**manifest.extra, "export": {"engine": engine}}
            (tmp / MANIFEST_FILE).write_text(dataclasses.replace(manifest, extra=extra).to_json())
        back, _ = load_dflash_draft(tmp, target_num_layers=model.cfg.target_num_layers)
        differ = [k for k, v in back.state_dict().items() if not torch.equal(v, tensors[k])]
        reading = reads.vllm_reading(config)
        captured = reads.engine_aux_layers(reading, READER_OF_ENGINE[engine])
        runs = reads.engine_attention(reading, READER_OF_ENGINE[engine])
        if differ or back.cfg != model.cfg or captured != model.cfg.aux_layers:
            raise ExportError(
                f"internal: the written drafter reads back otherwise ({differ[:4]}, {captured})"
            )
        if any(a != reads.TRAINED_ATTENTION for a in runs):
            raise ExportError(f"internal: {engine} would run {[a.describe() for a in runs]}")
    return len(tensors)


def dflash_launch_command(engine: str, target: str, out_dir: Path, setting: int) -> str:
    """The serving command of a DFlash export under the engine's `setting` (`served_setting`):
    SGLang's --speculative-num-draft-tokens, vLLM's num_speculative_tokens."""
    if engine == "sglang":
        return (
            f"python -m sglang.launch_server --model-path {shlex.quote(target)} "
            f"--speculative-algorithm DFLASH --speculative-draft-model-path "
            f"{shlex.quote(str(out_dir))} --speculative-num-draft-tokens {setting}"
        )
    if engine == "vllm":
        spec = {"method": "dflash", "model": str(out_dir), "num_speculative_tokens": setting}
        return (
            f"vllm serve {shlex.quote(target)} --speculative-config {shlex.quote(json.dumps(spec))}"
        )
    return f"vllm serve {shlex.quote(str(out_dir))}"


def engine_notes(engine: str, model: DFlashDraft, verifier: str | None, setting: int) -> list[str]:
    """What the user must know to serve the export: the block and setting, the mask token."""
    cfg = model.cfg
    notes = [
        f"block {cfg.block_size} (anchor + {cfg.block_size - 1} drafts); target layers "
        f"{list(cfg.target_layer_ids)} 0-based = specdraft indices {list(cfg.aux_layers)}; "
        f"mask token {cfg.mask_token_id} (a row of the target's embedding: no tokenizer change)"
    ]
    if engine == "vllm" and setting < cfg.block_size - 1:
        notes.append(
            f"vLLM drafts {setting} of the {cfg.block_size - 1} trained positions a round "
            "(--num-steps)"
        )
    if engine == "sglang":
        notes.append("SGLang serves DFLASH on CUDA, NPU or XPU devices only (0.5.22)")
    if engine == "speculators":
        notes.append(f"verifier.name_or_path = {verifier!r} must resolve on the serving host")
    return notes
