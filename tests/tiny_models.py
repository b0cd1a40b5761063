"""Tiny seeded transformers targets for tests, built from configs (nothing is downloaded).

Architectures: "llama", "qwen2", "qwen3", "mistral", "deepseek_v2", "deepseek_v3" (MLA + MoE, at
least one MoE layer), "llava" (LlavaForConditionalGeneration: tiny CLIP vision tower + tiny Llama).

    cfg = tiny_config("qwen3", num_layers=5)
    model = tiny_model("deepseek_v3", seed=1)            # eval mode, float32
    path = save_tiny_model("llama", tmp_path / "t")      # save_pretrained directory
"""

from __future__ import annotations

from pathlib import Path

import torch
import transformers
from transformers import PretrainedConfig, PreTrainedModel

ARCHITECTURES = ("llama", "qwen2", "qwen3", "mistral", "deepseek_v2", "deepseek_v3", "llava")

# arch -> (config class, model class), both public transformers names
_CLASSES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
    "mistral": ("MistralConfig", "MistralForCausalLM"),
    "deepseek_v2": ("DeepseekV2Config", "DeepseekV2ForCausalLM"),
    "deepseek_v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM"),
    "llava": ("LlavaConfig", "LlavaForConditionalGeneration"),
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
    return dict(
        num_hidden_layers=num_layers,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        vocab_size=vocab_size,
        num_attention_heads=4,
        num_key_value_heads=4,
        q_lora_rank=16,
        kv_lora_rank=16,
        qk_rope_head_dim=max(2, head_dim // 2),
        qk_nope_head_dim=head_dim,
        v_head_dim=head_dim,
        n_routed_experts=4,
        num_experts_per_tok=2,
        n_group=2,
        topk_group=1,
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
        raise ValueError(f"unknown tiny arch {arch!r}; known: {', '.join(ARCHITECTURES)}")
    if arch in ("deepseek_v2", "deepseek_v3"):
        kwargs = _mla_moe_kwargs(num_layers, hidden_size, vocab_size, head_dim)
    else:
        kwargs = _dense_kwargs(num_layers, hidden_size, vocab_size, head_dim)
    kwargs.update(overrides)
    if arch == "llava":
        return _llava_config(transformers.LlamaConfig(**kwargs))
    return getattr(transformers, _CLASSES[arch][0])(**kwargs)


def _llava_config(text_config: PretrainedConfig) -> PretrainedConfig:
    vision_config = transformers.CLIPVisionConfig(
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=16,
        patch_size=8,
        projection_dim=16,
    )
    return transformers.LlavaConfig(
        vision_config=vision_config,
        text_config=text_config,
        image_token_index=text_config.vocab_size - 1,  # last id: keep it out of test prompts
        image_seq_length=4,  # (16 / 8) ** 2 patches
        vision_feature_layer=-1,
    )


def tiny_model(arch: str, seed: int = 0, **kw) -> PreTrainedModel:
    """A randomly initialised tiny model (float32, eval mode, CPU); same seed -> same weights.

    `kw` goes to `tiny_config`. The global torch RNG is left untouched.
    """
    config = tiny_config(arch, **kw)
    model_class = getattr(transformers, _CLASSES[arch][1])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_class(config)
    return model.to(torch.float32).eval()


def save_tiny_model(arch: str, path: str | Path, seed: int = 0, **kw) -> Path:
    """`save_pretrained` a tiny model (config + safetensors, no tokenizer) into `path`.

    Returns `path`. `kw` goes to `tiny_config`.
    """
    path = Path(path)
    tiny_model(arch, seed=seed, **kw).save_pretrained(path)
    return path
