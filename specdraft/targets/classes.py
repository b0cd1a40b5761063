"""A target's class in the engines' rule tables, from its config or from what a manifest or
capture store recorded of it: the tables (`DEFAULT_CLASSES`, `TARGET_CLASSES`, the wrappers') and
`target_class_of` / `recorded_target_class`. Plain tables (no transformers import), so the
checkpoint package reads a manifest's class without loading the target stack."""

from __future__ import annotations

from typing import Any

# Config model_type -> class built when a config names no `architectures` (transformers 5.24's
# auto mappings, 5.25's for Qwen3.5 / Gemma 4 text: a multimodal model_type builds its conditional-generation wrapper).
DEFAULT_CLASSES: dict[str, str] = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "mistral": "MistralForCausalLM",
    "phi3": "Phi3ForCausalLM",
    "gpt_oss": "GptOssForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
    "gemma3_text": "Gemma3ForCausalLM",
    "llama4_text": "Llama4ForCausalLM",
    "deepseek_v2": "DeepseekV2ForCausalLM",
    "deepseek_v3": "DeepseekV3ForCausalLM",
    "llava": "LlavaForConditionalGeneration",
    "qwen2_vl": "Qwen2VLForConditionalGeneration",
    "qwen2_5_vl": "Qwen2_5_VLForConditionalGeneration",
    "qwen3_vl": "Qwen3VLForConditionalGeneration",
    "qwen3_vl_moe": "Qwen3VLMoeForConditionalGeneration",
    "mistral3": "Mistral3ForConditionalGeneration",
    "kimi_k25": "Kimi_K25ForConditionalGeneration",
    "llama4": "Llama4ForConditionalGeneration",
    "qwen3_5_text": "Qwen3_5ForCausalLM",  # transformers 5.25
    "qwen3_5_moe_text": "Qwen3_5MoeForCausalLM",
    "gemma4_text": "Gemma4ForCausalLM",
}


# Text config model_type -> target class, the key of the engines' aux-id rules
# (`conventions.ENGINE_RULES`; one model file per engine). Qwen2/Qwen3 are "qwen": SGLang's
# qwen2.py captures the embeddings in versions where llama.py cannot. Phi-3 is "llama": SGLang
# 0.5.23 llama.py and vLLM 0.32.0 phi3.py both subclass their LlamaForCausalLM.
TARGET_CLASSES: dict[str, str] = {
    "llama": "llama",
    "qwen2": "qwen",
    "qwen3": "qwen",
    "mistral": "llama",
    "phi3": "llama",
    "qwen3_moe": "qwen3_moe",
    "gpt_oss": "gpt_oss",
    "gemma2": "gemma2",
    "gemma3_text": "gemma3",
    "llama4_text": "llama4",
    "qwen2_vl_text": "qwen2_vl",
    "qwen3_vl_text": "qwen3_vl",
    "qwen3_vl_moe_text": "qwen3_vl",
    "deepseek_v2": "deepseek",
    "deepseek_v3": "deepseek",
    "qwen2_5_vl_text": "qwen",
    "qwen3_5_text": "qwen3_5",
    "qwen3_5_moe_text": "qwen3_5",
    "gemma4_text": "gemma4",
}


# Multimodal wrappers the engines load as their own class (sglang 0.5.23 llava.py / mistral.py
# / kimi_k25.py, vllm 0.32.0 llava.py / mistral3.py / kimi_k25.py), whatever their text model_type.
# Kimi-K2.5's published config names KimiK25ForConditionalGeneration (remote code), transformers
# 5.24 Kimi_K25ForConditionalGeneration: both load as the engines' KimiK25ForConditionalGeneration.
_WRAPPER_CLASSES: dict[str, str] = {
    "LlavaForConditionalGeneration": "llava",
    "Mistral3ForConditionalGeneration": "llava",
    "Kimi_K25ForConditionalGeneration": "deepseek",
    "KimiK25ForConditionalGeneration": "deepseek",
}


# transformers class -> the class name the engines load the same checkpoint as, where they differ
# (sglang 0.5.23 kimi_k25.py / vllm 0.32.0 kimi_k25.py: KimiK25ForConditionalGeneration, the
# name Kimi-K2.5's published config.json gives).
ENGINE_ARCHITECTURES: dict[str, str] = {
    "Kimi_K25ForConditionalGeneration": "KimiK25ForConditionalGeneration"
}


# Multimodal config model_type -> its text config's model_type (transformers 5.25's default
# `get_text_config()`), so a recorded wrapper architecture finds its text decoder's class.
WRAPPER_TEXT_MODEL_TYPES: dict[str, str] = {
    "llava": "llama",
    "qwen2_vl": "qwen2_vl_text",
    "qwen2_5_vl": "qwen2_5_vl_text",
    "qwen3_vl": "qwen3_vl_text",
    "qwen3_vl_moe": "qwen3_vl_moe_text",
    "mistral3": "mistral",
    "kimi_k25": "deepseek_v3",
    "llama4": "llama4_text",
}


def target_class_of(architecture: str | None, text_model_type: str) -> str | None:
    """The engines' rule class of a target (`conventions.TARGET_CLASSES`): the wrapper's own
    class for a multimodal wrapper in `_WRAPPER_CLASSES`, else by the text model_type; None
    when neither is known."""
    return _WRAPPER_CLASSES.get(architecture or "") or TARGET_CLASSES.get(text_model_type)


def recorded_target_class(target: dict[str, Any]) -> str | None:
    """The rule class of a target as a manifest or capture store records it (`architecture`,
    `target_class`): from the architecture where it names a class (a wrapper, or a model_type's
    default class, a wrapper's by its text model_type: records written before the "qwen" class
    say "llama" for Qwen2 / Qwen3, and none for Qwen2.5-VL), else the recorded class; None when
    neither."""
    architecture = target.get("architecture") or ""
    model_type = {c: m for m, c in DEFAULT_CLASSES.items()}.get(architecture, "")
    text_model_type = WRAPPER_TEXT_MODEL_TYPES.get(model_type, model_type)
    return target_class_of(architecture, text_model_type) or target.get("target_class")
