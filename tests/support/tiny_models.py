"""Tiny seeded transformers targets for tests, built from configs (nothing is downloaded).

Architectures: "llama", "qwen2", "qwen3", "mistral", "deepseek_v2", "deepseek_v3" (MLA + MoE, at
least one MoE layer), "llava" (LlavaForConditionalGeneration: tiny CLIP vision tower + tiny Llama);
`MORE_ARCHITECTURES` (issue #22): "qwen3_moe", "gpt_oss" (sinks, sliding + full layers),
"gemma2" / "gemma3" (scaled embeddings, (1 + w) norms, sliding layers; gemma2 soft-caps logits),
"llama4" (text: chunked attention, MoE), "phi3", and the multimodal wrappers "qwen2_vl",
"qwen3_vl" / "qwen3_vl_moe" (interleaved M-RoPE, DeepStack from a 1-layer vision tower),
"mistral3", "kimi_k25" (a DeepSeek-V3 text model inside Kimi-K2.5's wrapper), "llama4_mm"
(Llama4ForConditionalGeneration), each with a tiny vision tower; `NEWER_ARCHITECTURES` (issue #34,
transformers 5.25): "qwen3_5" (Qwen3.5's hybrid attention: Gated DeltaNet layers, every fourth
full attention with a partial rotary) and "gemma4" (Gemma 4 text: sliding and full layers, the
per-layer input embeddings), text decoders both.

    cfg = tiny_config("qwen3", num_layers=5)
    model = tiny_model("deepseek_v3", seed=1)            # eval mode, float32
    path = save_tiny_model("llama", tmp_path / "t")      # save_pretrained directory
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import torch
import transformers
from transformers import PretrainedConfig, PreTrainedModel

ARCHITECTURES = ("llama", "qwen2", "qwen3", "mistral", "deepseek_v2", "deepseek_v3", "llava")
MORE_ARCHITECTURES = (
    "qwen3_moe",
    "gpt_oss",
    "gemma2",
    "gemma3",
    "llama4",
    "phi3",
    "qwen2_vl",
    "qwen3_vl",
    "qwen3_vl_moe",
    "mistral3",
    "kimi_k25",
    "llama4_mm",
)
NEWER_ARCHITECTURES = ("qwen3_5", "gemma4")

# arch -> (config class, model class), both public transformers names
_CLASSES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
    "mistral": ("MistralConfig", "MistralForCausalLM"),
    "deepseek_v2": ("DeepseekV2Config", "DeepseekV2ForCausalLM"),
    "deepseek_v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM"),
    "llava": ("LlavaConfig", "LlavaForConditionalGeneration"),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM"),
    "gpt_oss": ("GptOssConfig", "GptOssForCausalLM"),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM"),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM"),
    "llama4": ("Llama4TextConfig", "Llama4ForCausalLM"),
    "phi3": ("Phi3Config", "Phi3ForCausalLM"),
    "qwen2_vl": ("Qwen2VLConfig", "Qwen2VLForConditionalGeneration"),
    "qwen3_vl": ("Qwen3VLConfig", "Qwen3VLForConditionalGeneration"),
    "qwen3_vl_moe": ("Qwen3VLMoeConfig", "Qwen3VLMoeForConditionalGeneration"),
    "mistral3": ("Mistral3Config", "Mistral3ForConditionalGeneration"),
    "kimi_k25": ("Kimi_K25Config", "Kimi_K25ForConditionalGeneration"),
    "llama4_mm": ("Llama4Config", "Llama4ForConditionalGeneration"),
    "qwen3_5": ("Qwen3_5TextConfig", "Qwen3_5ForCausalLM"),
    "gemma4": ("Gemma4TextConfig", "Gemma4ForCausalLM"),
}
# GPT-OSS's own rope (transformers' GptOssConfig default, as its config.json writes it); the tiny
# "gpt_oss" keeps the default rope unless given `rope_parameters=GPT_OSS_ROPE`.
GPT_OSS_ROPE = {
    "rope_type": "yarn",
    "rope_theta": 150000.0,
    "factor": 32.0,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "truncate": False,
    "original_max_position_embeddings": 4096,
}
# Per-arch text-config fields on top of the dense ones: MoE sizes, window / chunk sizes that a
# short test sequence crosses (so the per-layer masks matter), soft-capping.
_EXTRA = {
    "qwen3_moe": {
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 16,
        "decoder_sparse_step": 1,
    },
    "gpt_oss": {
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "sliding_window": 4,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
    },
    "gemma2": {"sliding_window": 4, "query_pre_attn_scalar": 8},
    "gemma3": {"sliding_window": 4, "query_pre_attn_scalar": 8, "sliding_window_pattern": 2},
    "llama4": {
        "num_local_experts": 2,
        "num_experts_per_tok": 1,
        "intermediate_size_mlp": 64,
        "attention_chunk_size": 4,
        "interleave_moe_layer_step": 2,
    },
    "mistral3": {"sliding_window": None},
    "llama4_mm": {
        "num_local_experts": 2,
        "num_experts_per_tok": 1,
        "intermediate_size_mlp": 64,
        "attention_chunk_size": 4,
        "interleave_moe_layer_step": 2,
    },
    "phi3": {"pad_token_id": None, "bos_token_id": None, "eos_token_id": None},
    "qwen2_vl": {"bos_token_id": None, "eos_token_id": None},
    "qwen3_5": {  # 2 key / 4 value heads of 8 in the DeltaNet layers
        "linear_key_head_dim": 8,
        "linear_value_head_dim": 8,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
    },
    "gemma4": {
        "hidden_size_per_layer_input": 8,
        "vocab_size_per_layer_input": 128,
        "sliding_window": 4,
    },
    "qwen3_vl_moe": {
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 16,
        "decoder_sparse_step": 1,
    },
}


def _dense_kwargs(num_layers: int, hidden_size: int, vocab_size: int, head_dim: int) -> dict:
    if hidden_size % head_dim:
        raise ValueError(f"hidden_size {hidden_size} is not a multiple of head_dim {head_dim}")
    num_heads = hidden_size // head_dim
    return dict(
        num_hidden_layers=num_layers,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        vocab_size=vocab_size,
        num_attention_heads=num_heads,
        num_key_value_heads=max(1, num_heads // 2),
        head_dim=head_dim,
        max_position_embeddings=256,
        tie_word_embeddings=False,
    )


def _mla_moe_kwargs(num_layers: int, hidden_size: int, vocab_size: int, head_dim: int) -> dict:
    # MLA: head_dim sets the no-rope query/key part and the value head; rope part is half of it.
    # MoE: 4 routed experts in 2 groups, 2 per token, 1 shared; layer 1 dense, the rest MoE.
    mla = dict(q_lora_rank=16, kv_lora_rank=16, qk_nope_head_dim=head_dim, v_head_dim=head_dim)
    moe = dict(n_routed_experts=4, num_experts_per_tok=2, n_group=2, topk_group=1)
    return dict(
        num_hidden_layers=num_layers,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        vocab_size=vocab_size,
        num_attention_heads=4,
        num_key_value_heads=4,
        qk_rope_head_dim=max(2, head_dim // 2),
        **mla,
        **moe,
        n_shared_experts=1,
        moe_intermediate_size=hidden_size // 2,
        first_k_dense_replace=1,
        max_position_embeddings=256,
        tie_word_embeddings=False,
    )


def tiny_config(
    arch: str,
    num_layers: int = 4,
    hidden_size: int = 32,
    vocab_size: int = 128,
    head_dim: int = 8,
    **overrides,
) -> PretrainedConfig:
    """A tiny transformers config for `arch` (one of ARCHITECTURES).

    `overrides` replace the text-model fields (for "llava" they go to its Llama text config).
    Dense archs: heads = hidden_size // head_dim, KV heads = half of them.
    DeepSeek (MLA, 4 heads): qk_nope_head_dim = v_head_dim = head_dim, qk_rope_head_dim = half.
    Raises ValueError for an unknown arch.
    """
    if arch not in _CLASSES:
        raise ValueError(
            f"unknown tiny arch {arch!r}; known: "
            f"{', '.join(ARCHITECTURES + MORE_ARCHITECTURES + NEWER_ARCHITECTURES)}"
        )
    if arch in ("deepseek_v2", "deepseek_v3", "kimi_k25"):
        kwargs = _mla_moe_kwargs(num_layers, hidden_size, vocab_size, head_dim)
    else:
        kwargs = _dense_kwargs(num_layers, hidden_size, vocab_size, head_dim)
    kwargs.update(_EXTRA.get(arch, {}))
    if arch in ("llama4", "llama4_mm"):
        kwargs["no_rope_layers"] = [int((i + 1) % 4 != 0) for i in range(num_layers)]
    if arch == "gemma4":  # every third layer full, the last one too (Gemma 4 forces it)
        full = [(i + 1) % 3 == 0 or i == num_layers - 1 for i in range(num_layers)]
        kwargs["layer_types"] = ["full_attention" if f else "sliding_attention" for f in full]
    kwargs.update(overrides)
    if arch in _WRAPPERS:
        return _WRAPPERS[arch](kwargs)
    return getattr(transformers, _CLASSES[arch][0])(**kwargs)


def _qwen2_vl_config(text: dict) -> PretrainedConfig:
    vision = {
        "depth": 1,
        "embed_dim": 16,
        "hidden_size": text["hidden_size"],
        "num_heads": 2,
        "mlp_ratio": 2,
        "patch_size": 2,
        "spatial_merge_size": 1,
        "temporal_patch_size": 1,
    }
    text = dict(
        text,
        model_type="qwen2_vl_text",
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [1, 1, 2]},
    )
    return transformers.Qwen2VLConfig(
        text_config=text,
        vision_config=vision,
        image_token_id=text["vocab_size"] - 1,
        video_token_id=text["vocab_size"] - 2,
        vision_start_token_id=text["vocab_size"] - 3,
    )


_VISION_TOWER = dict(hidden_size=16, intermediate_size=32, num_attention_heads=2)  # the tiny width
_IMAGES = dict(image_size=16, patch_size=8)  # 16 x 16 images: 2 x 2 patches of 8


def _media_token_ids(text: dict) -> dict[str, int]:
    """The image, video and vision start / end token ids: the text vocabulary's last four."""
    v = text["vocab_size"]
    return dict(
        image_token_id=v - 1,
        video_token_id=v - 2,
        vision_start_token_id=v - 3,
        vision_end_token_id=v - 4,
    )


def _qwen3_vl_config(text: dict, moe: bool = False) -> PretrainedConfig:
    # DeepStack merges the vision tower's layer-0 features into decoder layer 1's output at image
    # tokens (none in a text-only prompt); interleaved M-RoPE over head_dim 8: sections t, h, w = 2, 1, 1.
    vision = {
        "depth": 1,
        "hidden_size": 16,
        "intermediate_size": 32,
        "num_heads": 2,
        "patch_size": 2,
        "spatial_merge_size": 1,
        "temporal_patch_size": 1,
        "out_hidden_size": text["hidden_size"],
        "num_position_embeddings": 16,
        "deepstack_visual_indexes": [0],
    }
    model_type = "qwen3_vl_moe" if moe else "qwen3_vl"
    text = dict(
        text,
        model_type=f"{model_type}_text",
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 10000.0,
            "mrope_section": [2, 1, 1],
            "mrope_interleaved": True,
        },
    )
    config_class = transformers.Qwen3VLMoeConfig if moe else transformers.Qwen3VLConfig
    return config_class(text_config=text, vision_config=vision, **_media_token_ids(text))


def _mistral3_config(text: dict) -> PretrainedConfig:
    vision = transformers.PixtralVisionConfig(
        **_VISION_TOWER, **_IMAGES, num_hidden_layers=1, head_dim=8
    )
    return transformers.Mistral3Config(
        vision_config=vision,
        text_config=transformers.MistralConfig(**text),
        image_token_index=text["vocab_size"] - 1,
        spatial_merge_size=1,
    )


def _kimi_config(text: dict) -> PretrainedConfig:
    from transformers.models.kimi_k25 import Kimi_K25Config, Kimi_K25VisionConfig

    grid = dict(pos_emb_height=4, pos_emb_width=4, pos_emb_time=1)  # 4 x 4 patches, one frame
    vision = Kimi_K25VisionConfig(**_VISION_TOWER, num_hidden_layers=1, patch_size=2, **grid)
    return Kimi_K25Config(
        text_config=transformers.DeepseekV3Config(**text),
        vision_config=vision,
        projection_hidden_size=16,
        **_media_token_ids(text),
        tie_word_embeddings=False,
    )


def _llava_config(text_config: PretrainedConfig | dict) -> PretrainedConfig:
    if isinstance(text_config, dict):
        text_config = transformers.LlamaConfig(**text_config)
    vision_config = transformers.CLIPVisionConfig(
        **_VISION_TOWER, **_IMAGES, num_hidden_layers=2, projection_dim=16
    )
    return transformers.LlavaConfig(
        vision_config=vision_config,
        text_config=text_config,
        image_token_index=text_config.vocab_size - 1,  # last id: keep it out of test prompts
        image_seq_length=4,  # (16 / 8) ** 2 patches
        vision_feature_layer=-1,
    )


def _llama4_config(text: dict) -> PretrainedConfig:
    vision = transformers.Llama4VisionConfig(
        **_VISION_TOWER,
        **_IMAGES,
        num_hidden_layers=1,
        vision_output_dim=16,
        projector_input_dim=16,
        projector_output_dim=16,
        pixel_shuffle_ratio=0.5,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )
    v = text["vocab_size"]
    return transformers.Llama4Config(
        text_config=transformers.Llama4TextConfig(**text).to_dict(),
        vision_config=vision.to_dict(),
        image_token_index=v - 1,
        boi_token_index=v - 2,
        eoi_token_index=v - 3,
    )


_WRAPPERS = {
    "llava": _llava_config,
    "qwen2_vl": _qwen2_vl_config,
    "qwen3_vl": _qwen3_vl_config,
    "qwen3_vl_moe": partial(_qwen3_vl_config, moe=True),
    "mistral3": _mistral3_config,
    "kimi_k25": _kimi_config,
    "llama4_mm": _llama4_config,
}


def tiny_model(arch: str, seed: int = 0, **kw) -> PreTrainedModel:
    """A randomly initialised tiny model (float32, eval mode, CPU); same seed -> same weights.

    `kw` goes to `tiny_config`. The global torch RNG is left untouched.
    """
    config = tiny_config(arch, **kw)
    model_class = model_class_of(arch)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_class(config)
    return model.to(torch.float32).eval()


def model_class_of(arch: str) -> type[PreTrainedModel]:
    """The transformers model class `tiny_model(arch)` builds."""
    name = _CLASSES[arch][1]
    if arch == "kimi_k25":
        from transformers.models import kimi_k25

        return getattr(kimi_k25, name)
    return getattr(transformers, name)


def save_tiny_model(arch: str, path: str | Path, seed: int = 0, **kw) -> Path:
    """`save_pretrained` a tiny model (config + safetensors, no tokenizer) into `path`.

    Returns `path`. `kw` goes to `tiny_config`.
    """
    path = Path(path)
    tiny_model(arch, seed=seed, **kw).save_pretrained(path)
    return path
