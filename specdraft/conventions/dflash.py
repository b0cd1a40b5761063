"""What the engines and reference trainers read of a DFlash drafter: the target layers chosen by
default (`dflash_target_layer_ids`), the config keys (`DFLASH_FACTS`), each with the file and
version it was read from. Re-check the rows when bumping an engine.

DFlash numbers target layers 0-based, id i = the output of decoder layer i (transformers'
``hidden_states[i + 1]``: z-lab dflash/model.py `extract_context_feature`, offset 1), so a
specdraft index (`specdraft.conventions`) is id + 1.
"""

from __future__ import annotations

from dataclasses import dataclass

from specdraft.conventions.ids import ConventionError


@dataclass(frozen=True)
class DFlashFact:
    """One fact of a DFlash drafter's format as `engine` reads it, with its source."""

    fact: str
    engine: str
    value: str
    source: str


_ZLAB = "z-lab/dflash dflash/model.py (main, 2026)"
_SGL_UTILS = "sglang srt/speculative/dflash_utils.py (main, 2026; the 0.5.23 line)"
_SGL_MODEL = "sglang srt/models/dflash.py (main, 2026; the 0.5.23 line)"
_SPECFORGE = "SpecForge specforge/core/dflash.py OnlineDFlashModel (main, 2026)"

DFLASH_FACTS: tuple[DFlashFact, ...] = (
    DFlashFact(
        "target layer ids",
        "sglang",
        "dflash_config.target_layer_ids, 0-based (hidden state after layer i); none given: "
        "build_target_layer_ids(L, num_draft_layers), one layer: [L//2], "
        "else round(1 + i·(L-4)/(n-1))",
        _SGL_UTILS,
    ),
    DFlashFact(
        "target layer ids", "z-lab", "dflash_config.target_layer_ids, hidden_states[id + 1]", _ZLAB
    ),
    DFlashFact("block size", "sglang", "dflash_config.block_size, default 16", _SGL_MODEL),
    DFlashFact("block size", "z-lab", "dflash_config.block_size, default 16", _ZLAB),
    DFlashFact(
        "mask token",
        "z-lab",
        "dflash_config.mask_token_id; the tokenizer gets '<|MASK|>' as its mask_token",
        _ZLAB + " + README",
    ),
    DFlashFact("mask token", "sglang", "DEFAULT_DFLASH_MASK_TOKEN '<|MASK|>'", _SGL_UTILS),
    DFlashFact(
        "tensor names",
        "sglang",
        "layers.{i}.self_attn.{q,k,v,o}_proj / q_norm / k_norm, "
        "layers.{i}.mlp.{gate,up,down}_proj, layers.{i}.{input,post_attention}_layernorm, fc, "
        "hidden_norm, norm; no embedding or lm_head (the target's)",
        _SGL_MODEL,
    ),
    DFlashFact(
        "draft attention",
        "sglang",
        "full_attention layers are ENCODER_ONLY (bidirectional within the block); "
        "sliding_attention layers causal with config.sliding_window",
        _SGL_MODEL,
    ),
    DFlashFact(
        "training loss",
        "specforge",
        "cross-entropy on the data token at block position k >= 1 (position k predicts token "
        "anchor + k), loss-masked, weighted mean; optional weight exp(-(k-1)/loss_decay_gamma) "
        "(default None: uniform); anchors sampled per sequence among loss-masked positions "
        "<= T - block_size (T: the padded length), at most num_anchors (512); each block sees "
        "context < its anchor",
        _SPECFORGE,
    ),
)


def dflash_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """The 0-based target layer ids an engine uses for a DFlash drafter whose config names none
    (SGLang `build_target_layer_ids`, `DFLASH_FACTS`): [L//2] for one draft layer, else
    num_draft_layers ids spread evenly over 1..L-3, rounded. Qwen3-8B (L = 36, 5 layers):
    [1, 9, 17, 25, 33]. Raises ConventionError for L < 4 or fewer than one draft layer."""
    if num_draft_layers < 1:
        raise ConventionError(f"a DFlash drafter needs at least one layer, got {num_draft_layers}")
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    if num_target_layers < 4:
        raise ConventionError(
            f"DFlash's default target layers need at least 4 target layers, got {num_target_layers}"
        )
    span = num_target_layers - 4
    return [int(round(1 + i * span / (num_draft_layers - 1))) for i in range(num_draft_layers)]


def dflash_aux_layers(target_layer_ids: list[int] | tuple[int, ...]) -> tuple[int, ...]:
    """Specdraft indices (what a capture store records) of DFlash target layer ids: id + 1."""
    return tuple(i + 1 for i in target_layer_ids)
