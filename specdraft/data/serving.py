"""Whether any engine serves a drafter's aux layers on a target class: the one-line warning capture
and train print before any work (`serving_problem`), from `conventions.ENGINE_RULES`. A part of
conventions split off for its size (as `data.vocab`): it reads the rule table's internals."""

from __future__ import annotations

from specdraft.conventions import (
    ENGINE_NAMES,
    TARGET_CLASSES,
    ConventionError,
    default_aux_layers,
)
from specdraft.conventions.ids import _CLASS_NAMES, _encode
from specdraft.conventions.rules import ENGINE_RULES


def _served(layers: list[int], engine: str, num_layers: int, target_class: str) -> str | None:
    """None when some `engine` version in the table captures `layers`, else its (first) reason."""
    reasons = []
    for rule in (r for r in ENGINE_RULES if r.engine == engine and r.target_class == target_class):
        try:
            _encode(rule, layers, num_layers)
            return None
        except ConventionError as e:
            reasons.append(str(e))
    return reasons[0] if reasons else f"no {ENGINE_NAMES[engine]} rule for this class"


def serving_problem(layers, num_layers: int, target_class: str | None) -> str | None:
    """One line when neither SGLang nor vLLM (at any version in ENGINE_RULES) can capture `layers`
    on `target_class`: each engine's reason and the indices every serving engine captures; None
    when one can (or the class is unknown). What capture and train warn about before any work."""
    if target_class not in TARGET_CLASSES:
        return None
    layers = list(layers)
    reasons = {
        engine: _served(layers, engine, num_layers, target_class) for engine in ("sglang", "vllm")
    }
    if any(reason is None for reason in reasons.values()):
        return None
    why = "; ".join(f"{ENGINE_NAMES[e]}: {r}" for e, r in reasons.items())
    serving = [
        r
        for r in ENGINE_RULES
        if r.target_class == target_class and r.refuse is None and r.engine in ("sglang", "vllm")
    ]
    name = _CLASS_NAMES[target_class]
    if not serving:
        return (
            f"no engine serves an EAGLE-3 drafter on {name}-class targets ({why}); the drafter "
            "trains and runs in specdraft's engine, but exports nowhere"
        )
    lo, hi = max(r.lowest for r in serving), num_layers - max(r.top for r in serving)
    return (
        f"no engine can capture aux layers {layers} on {name}-class targets ({why}); every "
        f"engine that serves this class captures indices {lo}..{hi}, e.g. "
        f"{','.join(map(str, default_aux_layers(num_layers)))}"
    )
