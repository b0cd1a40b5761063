"""A Llama-family target's shape, read from its transformers config (`ModelArgs.from_hf_config`).

Which configs the fast path (`fast_model.FastTarget`) runs: Llama / Qwen2 / Qwen3 / Mistral,
SiLU MLPs without bias, default / linear / llama3 RoPE, full rotary; anything else is refused
with an `EngineError` naming what differs (`load.load_engine_target` then runs the target on
the transformers path).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import Tensor

from specdraft.draft_rope import rope_inv_freq as draft_rope_inv_freq
from specdraft.engine.errors import EngineError

# model_type -> transformers architecture; anything else is refused (DeepSeek, MoE, VLMs ...).
SUPPORTED_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "mistral": "MistralForCausalLM",
}
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


@dataclass(frozen=True)
class ModelArgs:
    """Shape of a Llama-family target, read from its transformers config by `from_hf_config`.

    Sizes are counts. `qkv_bias` / `o_bias`: biases on q,k,v / o projections (Qwen2: qkv only;
    Llama/Qwen3 `attention_bias`: all four). `qk_norm`: per-head RMSNorm on q and k before
    RoPE (Qwen3). `sliding_window`: tokens a query may see in sliding layers, or None.
    """

    model_type: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: bool = False
    sliding_window: int | None = None
    rope_theta: float = 10000.0
    rope_type: str = "default"
    rope_factor: float = 1.0
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_original_max_positions: int = 8192

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise EngineError(
                f"ModelArgs: num_heads {self.num_heads} is not a multiple of "
                f"num_kv_heads {self.num_kv_heads}"
            )
        if self.rope_type not in SUPPORTED_ROPE_TYPES:
            raise EngineError(
                f"ModelArgs.rope_type {self.rope_type!r} is not implemented; specdraft's "
                f"engine supports {', '.join(SUPPORTED_ROPE_TYPES)}"
            )

    @classmethod
    def from_hf_config(cls, config: dict[str, Any]) -> ModelArgs:
        """Build from a transformers `config.json` dict (transformers 4 or 5 layout).

        Raises ValueError for an architecture other than Llama/Qwen2/Qwen3/Mistral, a rope type
        other than default/linear/llama3, partial rotary, a non-SiLU MLP, MLP biases, or a
        missing key (named).
        """
        model_type = _check_architecture(config)
        try:
            return cls._from_supported_config(config, model_type)
        except KeyError as missing:
            raise EngineError(f"{model_type} config: missing key {missing}") from None

    @classmethod
    def _from_supported_config(cls, config: dict[str, Any], model_type: str) -> ModelArgs:
        if config.get("hidden_act", "silu") != "silu" or config.get("mlp_bias", False):
            raise EngineError(
                f"{model_type} config: hidden_act {config.get('hidden_act')!r} / mlp_bias "
                f"{config.get('mlp_bias')} not implemented (SiLU, no MLP bias only)"
            )
        hidden, heads = config["hidden_size"], config["num_attention_heads"]
        attention_bias = bool(config.get("attention_bias") or False) and model_type != "mistral"
        return cls(
            model_type=model_type,
            hidden_size=hidden,
            num_layers=config["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=config.get("num_key_value_heads") or heads,
            head_dim=config.get("head_dim") or hidden // heads,
            intermediate_size=config["intermediate_size"],
            vocab_size=config["vocab_size"],
            rms_norm_eps=config.get("rms_norm_eps", 1e-6),
            max_position_embeddings=config.get("max_position_embeddings", 2048),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            qkv_bias=attention_bias or model_type == "qwen2",
            o_bias=attention_bias,
            qk_norm=model_type == "qwen3",
            sliding_window=_sliding_window(config, model_type),
            **_rope_fields(config),
        )


def _check_architecture(config: dict[str, Any]) -> str:
    model_type = config.get("model_type")
    architectures = config.get("architectures") or [SUPPORTED_ARCHITECTURES.get(model_type)]
    if model_type not in SUPPORTED_ARCHITECTURES or architectures != [
        SUPPORTED_ARCHITECTURES[model_type]
    ]:
        arch = (config.get("architectures") or [model_type])[0]
        raise EngineError(
            f"specdraft's engine serves Llama/Qwen2/Qwen3/Mistral targets; {arch} targets "
            f"are captured and trained with specdraft and served by SGLang/vLLM"
        )
    return model_type


def _sliding_window(config: dict[str, Any], model_type: str) -> int | None:
    """Window of the sliding-attention layers, or None when every layer attends fully."""
    if model_type == "mistral" or "sliding_attention" in (config.get("layer_types") or []):
        return config.get("sliding_window")
    if model_type in ("qwen2", "qwen3") and config.get("use_sliding_window"):
        if (
            config.get("max_window_layers", config["num_hidden_layers"])
            < config["num_hidden_layers"]
        ):
            return config.get("sliding_window")
    return None


def _rope_fields(config: dict[str, Any]) -> dict[str, Any]:
    """rope_* fields from transformers 5 `rope_parameters` or the older rope_theta/rope_scaling."""
    params = config.get("rope_parameters") or config.get("rope_scaling") or {}
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise EngineError(
            f"rope type {rope_type!r} is not implemented; specdraft's engine supports "
            f"{', '.join(SUPPORTED_ROPE_TYPES)}"
        )
    if params.get("partial_rotary_factor", config.get("partial_rotary_factor", 1.0)) != 1.0:
        raise EngineError("partial_rotary_factor != 1 is not implemented by specdraft's engine")
    fields = {
        "rope_theta": float(params.get("rope_theta", config.get("rope_theta", 10000.0))),
        "rope_type": rope_type,
    }
    if rope_type in ("linear", "llama3"):
        fields["rope_factor"] = float(params["factor"])
    if rope_type == "llama3":
        fields["rope_low_freq_factor"] = float(params["low_freq_factor"])
        fields["rope_high_freq_factor"] = float(params["high_freq_factor"])
        fields["rope_original_max_positions"] = int(
            params.get(
                "original_max_position_embeddings", config.get("max_position_embeddings", 8192)
            )
        )
    return fields


def check_cache_length(max_seq_len: int, max_position_embeddings: int) -> None:
    """EngineError naming both when a target's cache of max_seq_len slots would hold positions
    past its max_position_embeddings (`setup_cache` of either target)."""
    if max_seq_len > max_position_embeddings:
        raise EngineError(
            f"max_seq_len {max_seq_len} exceeds the target's max_position_embeddings "
            f"{max_position_embeddings}"
        )


def rope_inv_freq(args: ModelArgs) -> Tensor:
    """Inverse RoPE frequencies, float32 [head_dim/2] (the drafter's formula, `draft.rope_inv_freq`)."""
    scaling = None
    if args.rope_type == "linear":
        scaling = {"rope_type": "linear", "factor": args.rope_factor}
    elif args.rope_type == "llama3":
        scaling = {
            "rope_type": "llama3",
            "factor": args.rope_factor,
            "low_freq_factor": args.rope_low_freq_factor,
            "high_freq_factor": args.rope_high_freq_factor,
            "original_max_position_embeddings": args.rope_original_max_positions,
        }
    return draft_rope_inv_freq(args.head_dim, args.rope_theta, scaling).float()
