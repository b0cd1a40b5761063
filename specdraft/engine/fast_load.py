"""A transformers Llama / Qwen2 / Qwen3 / Mistral checkpoint directory as a `FastTarget`, strictly:
its config (`fast_config.ModelArgs`) and its tensors, through the one table of the checkpoint
layout (`HF_TO_FAST_GLOBAL`, `HF_TO_FAST_LAYER`); every unmatched key and unfilled parameter is
named in one error.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from torch import Tensor

from specdraft.engine.errors import EngineError, EngineFileMissing
from specdraft.engine.fast_config import ModelArgs
from specdraft.engine.fast_model import FastTarget, FusedLinear

# transformers name -> FastTarget name: the one table of the checkpoint layout. Under a layer, the
# name comes with a part: q/k/v fill parts 0/1/2 of the fused wqkv, gate/up parts 0/1 of w13 (rows
# stacked in part order, see `FusedLinear`); 0 for a parameter that is not fused.
HF_TO_FAST_GLOBAL = {
    "model.embed_tokens.weight": "tok_embeddings.weight",
    "model.norm.weight": "norm.weight",
    "lm_head.weight": "output.weight",
}
HF_TO_FAST_LAYER = {  # under model.layers.N. -> layers.N.
    "input_layernorm.weight": ("attention_norm.weight", 0),
    "self_attn.q_proj.weight": ("attention.wqkv.weight", 0),
    "self_attn.q_proj.bias": ("attention.wqkv.bias", 0),
    "self_attn.k_proj.weight": ("attention.wqkv.weight", 1),
    "self_attn.k_proj.bias": ("attention.wqkv.bias", 1),
    "self_attn.v_proj.weight": ("attention.wqkv.weight", 2),
    "self_attn.v_proj.bias": ("attention.wqkv.bias", 2),
    "self_attn.o_proj.weight": ("attention.wo.weight", 0),
    "self_attn.o_proj.bias": ("attention.wo.bias", 0),
    "self_attn.q_norm.weight": ("attention.q_norm.weight", 0),
    "self_attn.k_norm.weight": ("attention.k_norm.weight", 0),
    "post_attention_layernorm.weight": ("ffn_norm.weight", 0),
    "mlp.gate_proj.weight": ("feed_forward.w13.weight", 0),
    "mlp.up_proj.weight": ("feed_forward.w13.weight", 1),
    "mlp.down_proj.weight": ("feed_forward.w2.weight", 0),
}


_FAST_TO_HF_GLOBAL = {fast: hf for hf, fast in HF_TO_FAST_GLOBAL.items()}
_FAST_TO_HF_LAYER = {fast_part: hf for hf, fast_part in HF_TO_FAST_LAYER.items()}


def hf_name(fast_name: str, part: int = 0) -> str:
    """The transformers checkpoint key of a FastTarget parameter, or of one part of a fused one
    (via the tables above)."""
    if fast_name in _FAST_TO_HF_GLOBAL:
        return _FAST_TO_HF_GLOBAL[fast_name]
    index, suffix = re.fullmatch(r"layers\.(\d+)\.(.+)", fast_name).groups()
    return f"model.layers.{index}.{_FAST_TO_HF_LAYER[suffix, part]}"


def checkpoint_destinations(model: FastTarget) -> dict[str, Tensor]:
    """Every transformers key the model loads -> the tensor it fills: a parameter, or the rows
    (a view) of one part of a fused one. A tied head appears once, as the embedding."""
    destinations = {}
    for name, param in model.named_parameters():
        module = model.get_submodule(name.rsplit(".", 1)[0])
        parts = param.split(module.parts) if isinstance(module, FusedLinear) else (param,)
        destinations.update((hf_name(name, part), rows) for part, rows in enumerate(parts))
    return destinations


def load_fast_target(
    model_dir: str | Path, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"
) -> FastTarget:
    """Load a transformers Llama/Qwen2/Qwen3/Mistral directory (config.json + safetensors,
    single or sharded with model.safetensors.index.json) strictly, in `dtype` on `device`.

    Parameters are frozen (an inference target). Call `setup_cache` before `forward`.
    Raises FileNotFoundError for a missing config or checkpoint file; ValueError for an
    unsupported config (see `ModelArgs.from_hf_config`), for checkpoint tensors that match no
    parameter and parameters no tensor fills (one error naming every key and its file), for a
    shape mismatch, or for a stored lm_head.weight that differs from a tied embedding;
    DamagedFile (a ValueError) for a truncated safetensors file (`checkpoint.open_safetensors`).
    """
    model_dir = Path(model_dir)
    config_path = model_dir / "config.json"
    if not config_path.is_file():
        raise EngineFileMissing(
            f"{config_path}: not found (expected a transformers model directory)"
        )
    args = ModelArgs.from_hf_config(json.loads(config_path.read_text()))
    with torch.device("meta"):
        model = FastTarget(args).to(dtype)
    model = model.to_empty(device=device)
    model.tie_weights()  # to_empty may give the tied pair separate tensors
    _load_checkpoint(model, model_dir)
    return model.requires_grad_(False).eval()


def _checkpoint_files(model_dir: Path) -> list[Path]:
    from specdraft.targets.config import target_weight_files

    files = target_weight_files(model_dir)
    for file in files:
        if not file.is_file():
            raise EngineFileMissing(
                f"{file}: not found (specdraft loads model.safetensors or the shards "
                f"named by model.safetensors.index.json)"
            )
    return files


@torch.no_grad()
def _load_checkpoint(model: FastTarget, model_dir: Path) -> None:
    from specdraft.checkpoint import open_safetensors
    from specdraft.targets.config import TARGET_WEIGHTS_FIX

    expected = checkpoint_destinations(model)
    filled, unmatched, stored_head = set(), [], None
    for file in _checkpoint_files(model_dir):
        with open_safetensors(file, TARGET_WEIGHTS_FIX) as f:
            for key in f.keys():
                if key == "lm_head.weight" and key not in expected:
                    stored_head = (f.get_tensor(key), file.name)
                elif key not in expected:
                    unmatched.append(f"{key} ({file.name})")
                else:
                    _copy_tensor(expected[key], f.get_tensor(key), key, file)
                    filled.add(key)
    missing = sorted(set(expected) - filled)
    if unmatched or missing:
        raise EngineError(
            f"strict load of {model_dir}: checkpoint tensors that match no parameter: "
            f"{', '.join(unmatched) or 'none'}; parameters no tensor fills: "
            f"{', '.join(missing) or 'none'}"
        )
    if stored_head is not None and not torch.equal(
        stored_head[0].to(model.output.weight), model.output.weight
    ):
        raise EngineError(
            f"{model_dir / stored_head[1]}: lm_head.weight differs from "
            f"model.embed_tokens.weight but config.json says tie_word_embeddings: true"
        )


def _copy_tensor(param: Tensor, tensor: Tensor, key: str, file: Path) -> None:
    if tensor.shape != param.shape:
        raise EngineError(
            f"{file}: {key} has shape {list(tensor.shape)}, the config implies {list(param.shape)}"
        )
    param.copy_(tensor)
