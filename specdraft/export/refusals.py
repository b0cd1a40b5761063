"""What export refuses, each with the reason: launch settings SpecConfig rejects, aux layers or
norm flags an engine would read differently from training, a target of other sizes."""

from __future__ import annotations

from specdraft.conventions import ConventionError, to_engine_ids, unknown_class_text
from specdraft.conventions.engines import (
    SPECULATORS_EXCLUSIVE_FLAGS,
    flag_refusal,
)
from specdraft.draft_config import NORM_FLAGS, DraftConfig, method_label
from specdraft.engine.spec_config import SpecConfig, chain_rule_message
from specdraft.errors import SpecdraftError, UnusableInput
from specdraft.export.target_facts import TargetFacts

NUM_AUX = 3  # vLLM, SGLang < 0.5.12 hard-code 3 aux states; >= 0.5.12 sizes fc from config


class ExportError(SpecdraftError, ValueError):
    """An export that the engine would read differently from training; names the reason."""


class ExportOptionError(ExportError, UnusableInput):
    """An export option or combination that cannot work: a launch setting SpecConfig rejects,
    EAGLE-3 settings for a DFlash drafter, a --num-steps its trained block cannot serve. An
    unusable input (the CLI exits 2), whether found before the drafter loads or after."""


def spec_for_export(
    engine: str, num_steps: int = 3, topk: int = 1, num_draft_tokens: int | None = None
) -> SpecConfig:
    """The speculative triple of the launch command (SpecConfig's rule; default a 3-step chain).

    num_draft_tokens None = num_steps + 1 (a chain); a tree needs it given. vLLM and
    speculators drafts are chains here. Raises ExportOptionError naming the rule (a value below 1
    included: none is replaced by a default).
    """
    steps, k = num_steps, topk
    for name, value in (("num_steps", steps), ("topk", k), ("num_draft_tokens", num_draft_tokens)):
        if value is not None and (not isinstance(value, int) or value < 1):
            raise ExportOptionError(f"{name} {value!r}: must be >= 1")
    if engine != "sglang" and k != 1:
        raise ExportOptionError(
            f"--topk {k}: the {engine} launch command drafts a chain "
            "(num_speculative_tokens); use --topk 1"
        )
    if k > 1 and num_draft_tokens is None:
        raise ExportOptionError(
            f"--topk {k} (a tree) needs --num-draft-tokens in 2.."
            f"{SpecConfig(steps, k, 2).max_draft_tokens}"
        )
    if engine != "sglang" and num_draft_tokens not in (
        None,
        steps + 1,
    ):  # vLLM: no num_draft_tokens
        raise ExportOptionError(chain_rule_message(steps, num_draft_tokens, engine="vllm"))
    try:
        return SpecConfig(steps, k, steps + 1 if num_draft_tokens is None else num_draft_tokens)
    except ValueError as e:
        raise ExportOptionError(str(e)) from None


def engine_ids(
    layers: list[int], engine: str, facts: TargetFacts, sglang_version: str | None
) -> tuple[list[int] | None, list[int] | None, list[str]]:
    """(top-level ids, nested eagle_config ids, notes) that make `engine` capture `layers`.

    The key the engine reads is required (ExportError with the reason when it cannot express
    the layers); the other key is written when its engine can express them too.
    """
    if len(layers) != NUM_AUX:
        raise ExportError(
            f"cannot export for {engine}: vLLM and SGLang before 0.5.12 hard-code {NUM_AUX} aux "
            f"states (fc input = {NUM_AUX} x target hidden); this drafter fuses "
            f"{len(layers)} (layers {layers})"
        )
    if facts.target_class is None and facts.architecture is None and facts.source == "manifest":
        raise ExportError(
            "the target class (Llama/Qwen, DeepSeek, ...) is unknown, and engines read "
            "aux ids by class: pass the target (--target DIR)"
        )
    if facts.target_class is None:
        raise ExportError(
            f"cannot export for {engine}: {unknown_class_text(facts.architecture, facts.source)}, "
            "so which ids make it capture the trained layers is not known; serve a target of a "
            "class in the table"
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


def check_norm_flags(engine: str, cfg: DraftConfig, sglang_version: str | None = None) -> None:
    """Raise ExportError when `engine` does not compute one of the norm flags the drafter sets
    (`conventions.FLAG_RULES`: SGLang has no norm_before_residual), or, for the speculators
    layout, sets both flags the speculators library refuses together. The flags an engine
    implements are written unchanged (`checkpoint.config_write.norm_flags_config`)."""
    set_flags = [name for name in NORM_FLAGS if getattr(cfg, name)]
    reasons = [
        reason for name in set_flags if (reason := flag_refusal(engine, name, sglang_version))
    ]
    if reasons:
        raise ExportError(
            f"cannot export this {method_label(cfg)} drafter for {engine}: {'; '.join(reasons)}; "
            "it was trained with it (serve it with vLLM: --engine vllm)"
        )
    if engine == "speculators" and all(name in set_flags for name in SPECULATORS_EXCLUSIVE_FLAGS):
        raise ExportError(
            "cannot export for speculators: the drafter sets both norm_before_fc and fc_norm, which "
            "speculators 0.9.0 refuses together (models/eagle3/config.py _check_norm_flags); "
            "export for vLLM or SGLang (--engine vllm|sglang), which apply both"
        )


def check_target(cfg: DraftConfig, facts: TargetFacts) -> list[str]:
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
