"""What each engine loads of a drafter, computes with it and returns: the drafter flags it
implements (`FLAG_RULES`), how it fills the drafter's embedding and head (`EMBEDDING_SOURCES`),
the draft architectures and layer names it loads (`DRAFT_LOADING`), and where its server returns
reasoning (`REASONING_RESPONSE_FIELDS`); each with the engine file and version it was read from.
How engines number aux layers is `specdraft.conventions.rules`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from specdraft.conventions.ids import ENGINE_NAMES, ConventionError, parse_version, version_label


@dataclass(frozen=True)
class FlagRule:
    """Whether one engine computes one drafter config flag as specdraft's drafter does
    (`draft.py`'s module docstring says what each flag computes). since: the first SGLang release
    that implements it (older ones build the drafter without it and run), None: every one read."""

    flag: str
    engine: str
    implemented: bool
    source: str
    evidence: str
    since: tuple[int, ...] | None = None


_SG = "sglang 0.5.23 srt/models/llama_eagle3.py"
_VL = "vllm 0.32.0 model_executor/models/llama_eagle3.py"
_SP = (
    "vllm 0.32.0 transformers_utils/configs/speculators/algos.py update_eagle3 (the top-level key is "
    "copied) + speculators 0.9.0 models/eagle3/core.py"
)
# Fields: flag, engine, implemented, source, evidence. Re-check the rows when bumping an engine.
FLAG_RULES: tuple[FlagRule, ...] = (
    FlagRule(
        "norm_before_residual",
        "sglang",
        False,
        _SG,
        "no such flag: the input layer's residual is always h before hidden_norm",
    ),
    FlagRule(
        "norm_before_residual",
        "vllm",
        True,
        _VL,
        "_norm_before_residual: residual = hidden_norm(h)",
    ),
    FlagRule(
        "norm_before_residual",
        "speculators",
        True,
        _SP + ", models/eagle3/model_definitions.py",
        "vLLM assumes true when a speculators config omits it; speculators' model: residual = hidden_norm(h)",
    ),
    FlagRule(
        "norm_before_fc",
        "sglang",
        True,
        _SG,
        "eagle_config key, else top-level; input_norm [n·H_target]; absent from 0.5.16 and older "
        "(run on 0.5.10, 0.5.12: tests/sglang_tier)",
        (0, 5, 17),
    ),
    FlagRule(
        "norm_before_fc",
        "vllm",
        True,
        _VL,
        "eagle_config key, else top-level; input_norm before fc",
    ),
    FlagRule("norm_before_fc", "speculators", True, _SP, "top-level; input_norm"),
    FlagRule(
        "fc_norm",
        "sglang",
        True,
        _SG,
        "top-level fc_norm or legacy use_aux_norm; fc_norm.{i} (legacy aux_norm_low/mid/high); "
        "absent from 0.5.11 and older (run on 0.5.10: tests/sglang_tier)",
        (0, 5, 12),
    ),
    FlagRule(
        "fc_norm",
        "vllm",
        True,
        _VL,
        "top-level fc_norm only (use_aux_norm is not read); fc_norm.{i}",
    ),
    FlagRule(
        "fc_norm",
        "speculators",
        True,
        _SP,
        "top-level; speculators' Eagle3SpeculatorConfig refuses it together with norm_before_fc",
    ),
    FlagRule("use_aux_norm", "sglang", True, _SG, "SGLang's legacy name of fc_norm", (0, 5, 12)),
    FlagRule(
        "use_aux_norm",
        "vllm",
        False,
        _VL,
        "only fc_norm is read: the legacy key leaves the fc norms out",
    ),
    FlagRule(
        "use_aux_norm", "speculators", False, _SP, "only fc_norm is copied into vLLM's config"
    ),
    FlagRule(
        "norm_output",
        "sglang",
        True,
        _SG,
        "the normed output is the next step's hidden state; absent from 0.5.11 and older (run on "
        "0.5.10: tests/sglang_tier)",
        (0, 5, 12),
    ),
    FlagRule("norm_output", "vllm", True, _VL, "aux_output = the post-norm hidden states"),
    FlagRule(
        "norm_output", "speculators", True, _SP, "the post-norm state is fed to the next TTT step"
    ),
)
# A sliding-window draft layer, which specdraft's drafter does not implement (it attends over the
# whole context): vLLM 0.32 (model_executor/models/llama.py, layer_types[0] of the draft config)
# and speculators 0.9.0 (models/eagle3/core.py, layer_types) apply config.sliding_window to a layer
# whose layer_types entry is "sliding_attention" (speculators' trainer writes that, window 2048:
# train/cli.py, train/config/schema.py); SGLang 0.5.23 ignores the config and windows the draft only
# with --speculative-draft-window-size (srt/models/llama_eagle3.py).
SLIDING_LAYER_TYPE = "sliding_attention"
# Where vLLM takes the target of a speculators drafter it is started on (`vllm serve DRAFTER`): the
# speculators_config's verifier.name_or_path becomes the served model and tokenizer (vllm 0.32.0
# transformers_utils/config.py maybe_override_with_speculators). Started on the target with
# --speculative-config (export's launch command), vLLM reads no verifier.
SPECULATORS_VERIFIER_READ = (
    "`vllm serve DRAFTER` serves speculators_config.verifier.name_or_path as the target "
    "(vllm 0.32.0 transformers_utils/config.py maybe_override_with_speculators)"
)
# What vLLM reads from a speculators drafter's config.json when started on it (`vllm serve DRAFTER`,
# no --speculative-config): the method is speculators_model_type, num_speculative_tokens is
# speculators_config.proposal_methods[0].speculative_tokens, the draft model is DRAFTER (vllm 0.32.0
# transformers_utils/config.py maybe_override_with_speculators, transformers_utils/configs/speculators/
# base.py build_vllm_speculative_config); the target is the verifier (SPECULATORS_VERIFIER_READ).
SPECULATORS_LAUNCH_READ = (
    "`vllm serve DRAFTER` takes the method from its speculators_model_type and the draft "
    "length from speculators_config.proposal_methods[0].speculative_tokens (vllm 0.32.0 "
    "transformers_utils/config.py maybe_override_with_speculators)"
)
# Flags the speculators library (0.9.0 models/eagle3/config.py `_check_norm_flags`) refuses together.
SPECULATORS_EXCLUSIVE_FLAGS = ("norm_before_fc", "fc_norm")


def flag_refusal(engine: str, flag: str, sglang_version: str | None = None) -> str | None:
    """Why `engine` would compute another drafter than one that sets `flag`, with the engine file
    and version (`FLAG_RULES`), or None when it implements the flag. sglang_version: the SGLang
    release served (None: the newest read); one older than the rule's `since` builds the drafter
    without the flag, silently, and is refused here."""
    for rule in FLAG_RULES:
        if rule.flag != flag or rule.engine != engine:
            continue
        if not rule.implemented:
            return (
                f"{ENGINE_NAMES[engine]} does not implement {flag} ({rule.source}: {rule.evidence})"
            )
        if rule.since and sglang_version and parse_version(sglang_version) < rule.since:
            return (
                f"SGLang {sglang_version} does not implement {flag}: it reads it from "
                f"{'.'.join(map(str, rule.since))} on ({rule.source}: {rule.evidence})"
            )
    return None


# Where a server with a reasoning parser returns an assistant's reasoning in a chat completion
# (`choices[0].message`), field -> (engine, version, where it is read): neither is OpenAI's. Both
# accept `reasoning_content` on incoming assistant messages (vLLM renames it to `reasoning`).
REASONING_RESPONSE_FIELDS = {
    "reasoning": (
        "vllm",
        "0.32",
        "vllm/entrypoints/openai/engine/protocol.py (ChatMessage.reasoning; "
        "reasoning_content deprecated, vllm-project/vllm#27755)",
    ),
    "reasoning_content": (
        "sglang",
        "0.5.23",
        "python/sglang/srt/entrypoints/openai/protocol.py (ChatMessage.reasoning_content)",
    ),
}


# How each engine fills an EAGLE-3 drafter's input embedding (and head), read from its source.
EMBEDDING_SOURCES = {
    "vllm": "vllm v1/spec_decode/llm_base_proposer.py _maybe_share_embeddings (stored source, the "
    "0.32 line): the target's embed_tokens replaces the drafter's only when the drafter ships "
    "none (has_own_embed_tokens false) or one torch.equal to the target's; a distinct owned "
    "one is kept",
    "sglang": "sglang speculative/eagle_worker_v2.py init_lm_head + models/llama.py set_embed (stored "
    "source, the 0.5.23 line): an EAGLE-3 drafter always gets set_embed(target embedding), "
    "which keeps the drafter's own only when config target_hidden_size != hidden_size; "
    "llama_eagle3.py sets load_lm_head_from_target when draft_vocab_size is absent, and "
    "set_embed_and_head then replaces the trained lm_head too",
}


def sglang_replaces_embedding(layer_config: dict) -> bool:
    """Whether SGLang puts the target's embedding in place of the drafter's (`EMBEDDING_SOURCES`):
    unless the config declares a target_hidden_size other than its hidden_size."""
    declared = layer_config.get("target_hidden_size")
    return declared is None or declared == layer_config.get("hidden_size")


def sglang_embedding(layer_config: dict, own: Any, target: Callable[[], Any]) -> tuple[bool, str]:
    """Whether SGLang runs a drafter with the input embedding it was trained with, and what it runs,
    in user terms: (as_trained, what). The one rule export and doctor judge by (`EMBEDDING_SOURCES`).

    layer_config: the config SGLang reads (hidden_size, target_hidden_size). own: the drafter's
    embed_tokens.weight [vocab, hidden] (None when it ships none). target: returns the target's
    embedding [vocab, hidden] (None when no target is given); called only when SGLang puts it in
    place of `own`. An owned embedding bit-identical to the target's (SpecForge's frozen
    embedding) is as trained; compared in float32 (exact for fp16 / bf16 values).
    """
    if own is None:
        return True, "the target's embedding (the drafter ships none)"
    if not sglang_replaces_embedding(layer_config):
        return True, "its own embedding (config target_hidden_size differs from hidden_size)"
    return sglang_in_place("embed_tokens", own, target)


# SGLang's tensor in place of a drafter's own (`sglang_in_place`), in user terms: the replacement,
# a bit-identical one, why a different one differs, what is named when nothing is compared.
IN_PLACE = {
    "lm_head": (
        "no draft_vocab_size: SGLang loads the target's lm_head in place of the trained one",
        "the target's lm_head, identical to the drafter's trained one",
        "llama_eagle3.py load_lm_head_from_target",
        " (llama_eagle3.py load_lm_head_from_target)",
    ),
    "embed_tokens": (
        "SGLang puts the target's embedding in place of the drafter's own embed_tokens",
        "the target's embedding, identical to the drafter's own embed_tokens",
        "the drafter trained its own",
        "",
    ),
}


def sglang_in_place(tensor: str, own: Any, target: Callable[[], Any]) -> tuple[bool, str]:
    """(as_trained, what) of a drafter whose `tensor` ("lm_head" or "embed_tokens", `IN_PLACE`)
    SGLang replaces with the target's: own, the drafter's weight; target, returns the target's
    (None when no target is given: not as trained, not compared). A replacement bit-identical to
    `own` is as trained; compared in float32 (exact for fp16 / bf16 values)."""
    replaced, identical, differs, named = IN_PLACE[tensor]
    theirs = target()
    if theirs is None:
        return False, f"{replaced}{named}; not compared with the target's (pass --target DIR)"
    if tuple(own.shape) == tuple(theirs.shape) and bool((own.float() == theirs.float()).all()):
        return True, identical
    return False, f"{replaced}, which differs from it ({differs})"


def sglang_replaces_head(layer_config: dict) -> bool:
    """Whether SGLang loads the target's lm_head in place of the drafter's: no draft_vocab_size."""
    return layer_config.get("draft_vocab_size") is None


# ---------------------------------------------------------------------------------------------
# What each engine loads of a drafter's files: the draft architectures it registers and the
# decoder-layer names its load_weights accepts (re-check when bumping an engine).


@dataclass(frozen=True)
class DraftLoading:
    """What one engine release loads of an EAGLE-3 drafter (an SGLang version range, [since, until)).

    architectures: the EAGLE-3 draft architectures it registers (config.json `architectures`;
    a speculators config is served under `speculators_model_types` instead, by the layer
    config's model_type). layer_prefixes: the decoder-layer names load_weights fills (any other
    name is skipped without a word).
    """

    engine: str
    since: tuple[int, ...] | None
    until: tuple[int, ...] | None
    architectures: tuple[str, ...]
    speculators_model_types: tuple[str, ...]
    layer_prefixes: tuple[str, ...]
    source: str
    evidence: str


_SGLANG_ARCHS = ("LlamaForCausalLMEagle3", "Eagle3DeepseekV2ForCausalLM")
_SGLANG_SOURCE = (
    "sglang srt/models/llama_eagle3.py load_weights; EntryClass of srt/models/*.py "
    "(llama_eagle3.py, kimi_k25_eagle3.py)"
)
DRAFT_LOADING: tuple[DraftLoading, ...] = (
    DraftLoading(
        "sglang",
        None,
        (0, 5, 12),
        _SGLANG_ARCHS,
        (),
        ("midlayer.",),
        _SGLANG_SOURCE,
        "read 0.4.10, 0.5.3, 0.5.6, 0.5.9, 0.5.10, 0.5.10.post1, 0.5.11 wheels: one `self.midlayer` "
        "module, so layers.0.* matches no parameter and is skipped silently (case S1); EntryClass "
        "read in 0.5.23 only.",
    ),
    DraftLoading(
        "sglang",
        (0, 5, 12),
        None,
        _SGLANG_ARCHS,
        (),
        ("midlayer.", "layers.0."),
        _SGLANG_SOURCE,
        "read 0.5.12, 0.5.17, 0.5.20, 0.5.23 wheels: the layer is `self.layers` (a ModuleList) and "
        "load_weights renames the legacy `midlayer` to `layers.0` (legacy_name_map), so both names "
        "load; EntryClass read in 0.5.23.",
    ),
    DraftLoading(
        "vllm",
        None,
        None,
        (
            "Eagle3LlamaForCausalLM",
            "LlamaForCausalLMEagle3",
            "LlamaForCausalLM",  # as Eagle3LlamaForCausalLM: PLAIN_DRAFT_ARCHITECTURE_READ
            "Eagle3Qwen2_5vlForCausalLM",
            "Eagle3Qwen3vlForCausalLM",
            "Eagle3Qwen3ForCausalLM",
            "Eagle3MiniMaxM2ForCausalLM",
            "Eagle3DeepseekV2ForCausalLM",
            "Eagle3DeepseekV3ForCausalLM",
            "PEagleDraftModel",
            "PeagleLlamaForCausalLM",
            "PeagleQwen3ForCausalLM",
        ),
        ("llama", "qwen3"),
        ("midlayer.", "layers.0."),
        "vllm 0.32.0 model_executor/models/registry.py _SPECULATIVE_DECODING_MODELS; "
        "llama_eagle3.py load_weights; transformers_utils/configs/speculators/algos.py",
        "read the 0.32.0 wheel: load_weights maps midlayer. -> layers.0. (either loads); a speculators "
        "config is served as Eagle3LlamaForCausalLM / Eagle3Qwen3ForCausalLM by its model_type, any "
        "other model_type is a ValueError.",
    ),
)
# What the engines make of a draft config whose architectures name a plain model (the official EAGLE-3
# trainer writes ["LlamaForCausalLM"], eagle/traineagle3/config.json): vLLM with method eagle3 loads X as
# Eagle3X (transformers_utils/configs/eagle.py EAGLEConfig, read in the stored source of the 0.3x line);
# SGLang builds the class the value names, its plain Llama model (srt/models/llama.py EntryClass,
# 0.5.23), not its EAGLE-3 drafter (llama_eagle3.py LlamaForCausalLMEagle3).
PLAIN_DRAFT_ARCHITECTURE_READ = (
    "vLLM (method eagle3) loads a draft config's LlamaForCausalLM as Eagle3LlamaForCausalLM "
    "(vllm transformers_utils/configs/eagle.py), SGLang 0.5.23 as its plain Llama model "
    "(srt/models/llama.py), not its EAGLE-3 drafter LlamaForCausalLMEagle3"
)
RELEASES_READ = {
    "sglang": "SGLang 0.5.23",
    "vllm": "vLLM 0.32",
}  # the newest release each row was read in


def draft_loading(engine: str, sglang_version: str | None = None) -> list[DraftLoading]:
    """The DRAFT_LOADING rows of `engine` (for SGLang, the one of `sglang_version` when given, else
    every version range). Raises ConventionError for an unknown engine or unparsable version."""
    rows = [r for r in DRAFT_LOADING if r.engine == engine]
    if not rows:
        raise ConventionError(
            f"no draft-loading rule for engine {engine!r}; expected sglang or vllm"
        )
    if engine == "sglang" and sglang_version is not None:
        v = parse_version(sglang_version)
        rows = [
            r
            for r in rows
            if (r.since is None or v >= r.since) and (r.until is None or v < r.until)
        ]
    return rows


def loading_label(row: DraftLoading) -> str:
    """The engine and version range a DRAFT_LOADING row covers, e.g. "SGLang < 0.5.12"."""
    return version_label(row)  # the same fields as an EngineRule


def _newest_rows() -> dict[str, DraftLoading]:
    """Each engine's DRAFT_LOADING row of its newest release read (RELEASES_READ)."""
    return {row.engine: row for row in DRAFT_LOADING}


def engines_serving_architecture(architectures: list[str]) -> list[str]:
    """The engines (newest release read, RELEASES_READ) that register one of `architectures`."""
    return [e for e, row in _newest_rows().items() if set(architectures) & set(row.architectures)]


def engines_serving_speculators() -> list[str]:
    """The engines (newest release read) that load a speculators config (`speculators_model_types`)."""
    return [e for e, row in _newest_rows().items() if row.speculators_model_types]
