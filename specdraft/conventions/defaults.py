"""The default aux layers: specdraft's for an L-layer target, and what each engine captures
when a config names no ids (the same specdraft indices [2, L//2, L-3], read from their sources)."""

from __future__ import annotations

from specdraft.conventions.ids import ENGINES, ConventionError


def default_aux_layers(num_layers: int) -> list[int]:
    """specdraft's default aux layers for an L-layer target: [2, L//2, L-3] when distinct.

    For 5 <= L < 7 the trio [2, clamp(L//2, 3, L-2), L-1] (L = 5: [2, 3, 4]), which every
    engine, class and version can express. For L = 4, [1, 2, 3] (the only trio without the
    embeddings or index L); SGLang >= 0.5.13 cannot write it on DeepSeek-class targets.
    Raises ConventionError for L < 4 (no three distinct decoder-layer outputs).
    """
    if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 4:
        raise ConventionError(f"3 aux layers need at least 4 decoder layers, got {num_layers!r}")
    if num_layers >= 7:
        return [2, num_layers // 2, num_layers - 3]
    if num_layers == 4:
        return [1, 2, 3]
    return [2, min(max(num_layers // 2, 3), num_layers - 2), num_layers - 1]


def engine_default_ids(engine: str, num_layers: int) -> list[int]:
    """Ids (in ``engine``'s explicit convention) that mean the engine's no-ids default.

    SGLang [1, L//2-1, L-4], vLLM/speculators [2, L//2, L-3]: both capture specdraft
    [2, L//2, L-3] (sglang models/llama.py, vllm get_eagle3_aux_hidden_state_layers).
    They collapse for L < 7; see ``default_layers_captured``.
    """
    if engine not in ENGINES:
        raise ConventionError(f"unknown engine {engine!r}; expected one of {ENGINES}")
    shift = 1 if engine == "sglang" else 0
    return [2 - shift, num_layers // 2 - shift, num_layers - 3 - shift]


def default_layers_captured(num_layers: int) -> list[int]:
    """Specdraft indices an engine captures with no ids: the distinct valid ones of the default."""
    return sorted({i for i in (2, num_layers // 2, num_layers - 3) if 0 <= i < num_layers})


# What each engine captures when a draft config names no aux ids, read from its source: the same
# specdraft indices [2, L//2, L-3] for every engine (DESIGN.md section 2, "Defaults").
ENGINE_DEFAULT_SOURCES = {
    "sglang": "sglang srt/models/llama.py set_eagle3_layers_to_capture (stored source, the 0.5.23 "
    "line; deepseek_v2.py and the Qwen models alike): layer_ids None -> layers_to_capture "
    "[2, L//2, L-3] without the +1 explicit ids get, so index i = the input of layer i",
    "vllm": "vllm model_executor/models/llama.py get_eagle3_aux_hidden_state_layers (stored source, "
    "the 0.32 line; the Qwen models alike): (2, L//2, L-3), read as-is",
}


def engines_default_layers(num_layers: int) -> list[int]:
    """The layers every engine captures from a config without aux ids, as specdraft indices:
    [2, L//2, L-3] (`ENGINE_DEFAULT_SOURCES`). Raises ConventionError for L < 7, where the
    default names fewer than 3 distinct layers (no drafter of 3 aux states is served by it)."""
    layers = default_layers_captured(num_layers)
    if len(layers) != 3:
        raise ConventionError(
            f"the engines' default aux layers [2, L//2, L-3] collapse to {layers} on a "
            f"{num_layers}-layer target; write the ids the drafter was trained on"
        )
    return layers
