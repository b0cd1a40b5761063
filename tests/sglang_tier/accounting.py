"""The account SGLang's draft `load_weights` does not give: which of the drafter's parameters it
left unwritten, which file tensors it used for nothing, and whether each written parameter equals
the file (SGLang skips an unknown name without a word; only a wrong shape raises).

What SGLang should write is computed from the file alone, by the layout its llama_eagle3.py
load_weights implements: `q/k/v_proj` stacked into `qkv_proj`, `gate/up_proj` into `gate_up_proj`
(rows in that order, tensor-parallel size 1), every other name under `model.` (`lm_head` as is),
the decoder layer under the names specdraft's `DRAFT_LOADING` says the version loads.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdraft.conventions.engines import DRAFT_LOADING, draft_loading

# file name part -> (SGLang's stacked parameter, shard index)
STACKED = {
    ".q_proj.": (".qkv_proj.", 0),
    ".k_proj.": (".qkv_proj.", 1),
    ".v_proj.": (".qkv_proj.", 2),
    ".gate_proj.": (".gate_up_proj.", 0),
    ".up_proj.": (".gate_up_proj.", 1),
}
# Tensors SGLang reads into no parameter by design (llama_eagle3.py load_weights): d2t becomes
# hot_token_id (checked apart), t2d is skipped.
BY_DESIGN = ("d2t", "t2d")
LAYER_PREFIXES = sorted(
    {p for row in DRAFT_LOADING if row.engine == "sglang" for p in row.layer_prefixes}
)


@dataclass
class Account:
    """unused: file tensors that name no parameter of the model (skipped silently). incomplete:
    parameters some of whose file parts are missing. differ: parameters whose loaded value is not
    the file's (cast to the parameter's dtype)."""

    unused: list[str]
    incomplete: list[str]
    differ: list[str]


def layer_module(model) -> str:
    """The name SGLang's drafter gives its decoder layer: "midlayer" or "layers.0"."""
    return "midlayer" if hasattr(model.model, "midlayer") else "layers.0"


def parameter_of(name: str, loads: tuple[str, ...], layer: str) -> tuple[str, int] | None:
    """(SGLang parameter, shard) that file tensor `name` fills; None when its decoder-layer prefix
    is not one the version loads (`loads`)."""
    prefix = next((p for p in LAYER_PREFIXES if name.startswith(p)), None)
    if prefix is not None:
        if prefix not in loads:
            return None
        name = f"{layer}.{name[len(prefix) :]}"
    shard = 0
    for part, (stacked, index) in STACKED.items():
        if part in name:
            name, shard = name.replace(part, stacked), index
            break
    return (name if name.startswith("lm_head.") else f"model.{name}"), shard


def account(model, tensors: dict[str, torch.Tensor], version: str) -> Account:
    """What SGLang `version`'s drafter `model` made of the file's `tensors` (after loading)."""
    (row,) = draft_loading("sglang", version)
    params = dict(model.named_parameters())
    parts: dict[str, dict[int, torch.Tensor]] = {}
    unused = []
    for name, tensor in tensors.items():
        if name in BY_DESIGN:
            continue
        target = parameter_of(name, row.layer_prefixes, layer_module(model))
        if target is None or target[0] not in params:
            unused.append(name)
            continue
        parts.setdefault(target[0], {})[target[1]] = tensor
    incomplete, differ = [], []
    for name, shards in parts.items():
        param = params[name]
        full = torch.cat([shards[i] for i in sorted(shards)]) if len(shards) > 1 else shards[0]
        if tuple(full.shape) != tuple(param.shape):
            incomplete.append(name)
        elif not torch.equal(param.detach(), full.to(param.dtype)):
            differ.append(name)
    return Account(sorted(unused), sorted(incomplete), sorted(differ))
