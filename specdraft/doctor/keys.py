"""How each engine reads a draft checkpoint's weight names, and the drafter as it loads it.

Both engines load `fc`, `norm`, `lm_head`, `embed_tokens` (if present), `d2t` and the decoder
layer under the prefixes `conventions.DRAFT_LOADING` records per engine and version (SGLang
< 0.5.12 reads only `midlayer.*`; SGLang >= 0.5.12 and vLLM read `midlayer.*` or `layers.0.*`);
`t2d` is optional (SGLang skips it; vLLM treats a missing `d2t` as the identity), and any name
an engine has no parameter for is skipped without a word.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from specdraft.checkpoint import LAYER_PREFIX, build_draft
from specdraft.draft import Eagle3Draft
from specdraft.draft_config import DraftConfig, rope_from_hf_config

ENGINE_NAMES = {"sglang": "SGLang", "vllm": "vLLM", None: "specdraft"}
# Names every engine treats as optional (see module doc).
ENGINE_OPTIONAL = ("d2t", "t2d", "embed_tokens.weight")


@dataclass
class KeyMap:
    """How an engine maps a weights file onto the drafter's parameters (official names).

    mapping: file name -> parameter name, for names it loads with the right shape.
    unmatched: file names it skips; missing: parameters it leaves at their initial values;
    misshaped: "name (file shape vs expected)".
    """

    mapping: dict[str, str]
    unmatched: list[str]
    missing: list[str]
    misshaped: list[str]


def file_layout(tensors: dict[str, torch.Tensor]) -> str:
    """ "speculators" when the file names its decoder layer `layers.0.*`, else "sglang" (official)."""
    return "speculators" if any(k.startswith("layers.0.") for k in tensors) else "sglang"


def draft_as_loaded(
    cfg: DraftConfig,
    tensors: dict[str, torch.Tensor],
    engine: str | None,
    keys: KeyMap | None,
    layer_config: dict[str, Any],
    weights: Path,
) -> tuple[Eagle3Draft, str]:
    """The drafter as `engine` loads `tensors` through `keys` (unloaded parameters keep a seeded
    initialisation, as in the engine; rope as the engine reads `layer_config`), or as specdraft
    loads them (engine None: `checkpoint.build_draft`, the loader's own; CheckpointError naming `weights`).
    Returns the model (float32, not yet given a target embedding) and how it was loaded, in words."""
    if engine is None:
        return build_draft(
            cfg, tensors, file_layout(tensors), weights
        ).float(), "as specdraft loads it"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = Eagle3Draft(served_rope_config(cfg, layer_config))
    params = model.state_dict()
    with torch.no_grad():
        for name, param in keys.mapping.items():
            params[param].copy_(tensors[name])
    how = f"as {ENGINE_NAMES[engine]} loads it" + (
        f" ({len(keys.missing)} parameters left at their initial values)" if keys.missing else ""
    )
    return model, how


def served_rope_config(cfg: DraftConfig, layer_config: dict[str, Any]) -> DraftConfig:
    """`cfg` with the rope theta / scaling an engine reads from config.json (FC-09)."""
    theta, scaling = rope_from_hf_config(layer_config.get)
    if "rope_theta" not in layer_config and "rope_parameters" not in layer_config:
        theta = 10000.0  # what loaders fall back to
    try:
        return dataclasses.replace(cfg, rope_theta=theta, rope_scaling=scaling)
    except ValueError:  # a rope type specdraft does not implement: keep the trained one
        return cfg


def key_map(
    tensors: dict[str, torch.Tensor],
    expected: dict[str, tuple],
    engine: str | None,
    owns_embedding: bool,
    layer_prefixes: tuple[str, ...] = (),
) -> KeyMap:
    """Map file names onto official parameter names the way `engine` loads them.

    expected: official name -> shape (`midlayer.*`). engine None: specdraft's strict reading
    in the file's own layout (every name must match). Engines: the decoder layer under
    `layer_prefixes` (the engine's `conventions.DRAFT_LOADING` row); see the module doc.
    """
    if engine is None:
        prefixes, optional = (LAYER_PREFIX[file_layout(tensors)],), ()
    else:
        prefixes, optional = layer_prefixes, ENGINE_OPTIONAL
    accepted = dict(expected)
    if engine is not None and not owns_embedding:
        accepted["embed_tokens.weight"] = (
            None  # engines load it when present (any width check is theirs)
        )
    mapping, unmatched, misshaped, bad_params = {}, [], [], set()
    for name, tensor in tensors.items():
        param = _official_name(name, prefixes)
        if param not in accepted:
            unmatched.append(name)
        elif accepted[param] is not None and tuple(tensor.shape) != accepted[param]:
            misshaped.append(f"{name} {tuple(tensor.shape)} (expected {accepted[param]})")
            bad_params.add(param)
        else:
            mapping[name] = param
    optional = set(optional) - ({"embed_tokens.weight"} if owns_embedding else set())
    missing = [
        _display(p, prefixes)
        for p in expected
        if p not in optional and p not in bad_params and p not in mapping.values()
    ]
    return KeyMap(mapping, sorted(unmatched), sorted(missing), misshaped)


def _official_name(name: str, prefixes: tuple[str, ...]) -> str:
    for prefix in prefixes:
        if name.startswith(prefix):
            return "midlayer." + name[len(prefix) :]
    return "" if name.startswith(("midlayer.", "layers.0.")) else name


def _display(param: str, prefixes: tuple[str, ...]) -> str:
    """A parameter under the first prefix the reader accepts (how the file should name it)."""
    return prefixes[0] + param[len("midlayer.") :] if param.startswith("midlayer.") else param
