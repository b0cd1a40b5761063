"""Each layout's config.json as specdraft writes it: the official/SGLang one (`official_config`)
and the speculators one (`speculators_config`), with the aux ids in each engine's convention
and the norm flags where every engine reads them. Read back by `config_read`."""

from __future__ import annotations

from typing import Any

import torch

from specdraft.checkpoint.layouts import OFFICIAL_ARCHITECTURES
from specdraft.conventions import AUX_KEY, to_engine_ids
from specdraft.draft_config import NORM_FLAGS, DraftConfig


def official_config(
    cfg: DraftConfig,
    dtype: torch.dtype,
    target_class: str = "llama",
    sglang_version: str | None = None,
) -> dict[str, Any]:
    """config.json of the official/SGLang layout.

    Aux ids: nested `eagle_config` key in SGLang's convention (the rule of the target's class and
    SGLang version) when SGLang can express the layers whatever the version, top-level key in
    vLLM's convention (vLLM reads the top-level key first, SGLang only the nested one, so one file
    serves both; both name cfg.aux_layers), left out when vLLM cannot capture them on the class
    (a file for SGLang alone); neither key when no engine can at `sglang_version` (the manifest
    then records the layers: `save_draft` refuses such a file without one). rope_theta/rope_scaling,
    target_hidden_size and draft_vocab_size are written explicitly.
    """
    top, sglang = (
        vllm_ids_or_none(cfg, target_class),
        sglang_ids_or_none(cfg, target_class, sglang_version),
    )
    config = base_llama_config(cfg, dtype)
    config.update(
        architectures=list(OFFICIAL_ARCHITECTURES),
        draft_vocab_size=cfg.draft_vocab_size,
        target_hidden_size=cfg.target_hidden_size,
        **norm_flags_config(cfg),
    )
    if (
        top is not None
    ):  # else a file for SGLang alone: vLLM would read the nested ids as-is, wrongly
        config[AUX_KEY] = top
    if sglang is not None:
        config["eagle_config"] = {
            "eagle_aux_hidden_state_layer_ids": sglang,
            "use_aux_hidden_state": True,
        }
    return config


def speculators_config(
    cfg: DraftConfig,
    dtype: torch.dtype,
    verifier: str | None,
    verifier_architectures: list[str],
    num_speculative_tokens: int = 3,
    target_class: str = "llama",
) -> dict[str, Any]:
    """config.json of the speculators layout (read by vLLM).

    `verifier_architectures`: the target config's `architectures` (speculators' verifier record).
    `norm_before_residual` is written explicitly: vLLM assumes true when a speculators config
    omits it (vllm `transformers_utils/configs/speculators/algos.py`).
    """
    return {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "speculators_version": "0.3.0",
        "transformer_layer_config": base_llama_config(cfg, dtype),
        "draft_vocab_size": cfg.draft_vocab_size,
        "target_hidden_size": cfg.target_hidden_size,
        **norm_flags_config(cfg),
        "eagle_aux_hidden_state_layer_ids": vllm_ids(cfg, target_class),
        "speculators_config": {
            "algorithm": "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": [
                {"proposal_type": "greedy", "speculative_tokens": num_speculative_tokens}
            ],
            "verifier": {"name_or_path": verifier, "architectures": list(verifier_architectures)},
        },
    }


def norm_flags_config(cfg: DraftConfig) -> dict[str, bool]:
    """The norm flags as both config files write them, top-level (where SGLang, vLLM and
    speculators all read them): norm_before_residual always (vLLM assumes true when a speculators
    config omits it), the EAGLE-3.1 flags when set (every engine's default is false)."""
    flags = {"norm_before_residual": cfg.norm_before_residual}
    return flags | {name: True for name in NORM_FLAGS[1:] if getattr(cfg, name)}


def base_llama_config(cfg: DraftConfig, dtype: torch.dtype) -> dict[str, Any]:
    """The Llama-shaped part shared by both config files (one decoder layer)."""
    return {
        "model_type": "llama",
        "hidden_act": "silu",
        "num_hidden_layers": 1,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "vocab_size": cfg.vocab_size,
        "rms_norm_eps": cfg.rms_norm_eps,
        "max_position_embeddings": cfg.max_position_embeddings,
        "rope_theta": cfg.rope_theta,
        "rope_scaling": cfg.rope_scaling,
        "tie_word_embeddings": False,
        "torch_dtype": str(dtype).removeprefix("torch."),
    }


def vllm_ids(cfg: DraftConfig, target_class: str = "llama") -> list[int]:
    """The aux layers in vLLM's (as-is) convention."""
    return to_engine_ids(list(cfg.aux_layers), "vllm", cfg.target_num_layers, target_class)


def vllm_ids_or_none(cfg: DraftConfig, target_class: str = "llama") -> list[int] | None:
    """`vllm_ids`, or None when vLLM cannot capture the layers on the target's class (e.g. the
    embeddings on DeepSeek-class targets)."""
    try:
        return vllm_ids(cfg, target_class)
    except ValueError:
        return None


def sglang_ids_or_none(
    cfg: DraftConfig, target_class: str = "llama", sglang_version: str | None = None
) -> list[int] | None:
    """The aux layers in SGLang's convention for the target's class (every SGLang version when
    `sglang_version` is None), or None when SGLang cannot express them."""
    try:
        return to_engine_ids(
            list(cfg.aux_layers), "sglang", cfg.target_num_layers, target_class, sglang_version
        )
    except ValueError:
        return None
