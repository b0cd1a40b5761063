"""The check of the drafter's rope as the engines build it: theta, scaling and max positions
against training and the target (FC-09)."""

from __future__ import annotations

from specdraft.doctor.evidence import Evidence
from specdraft.doctor.file_evidence import Unavailable, describe
from specdraft.doctor.verdict import Result, fail, ok
from specdraft.draft_config import rope_from_hf_config

ROPE_KEYS = ("rope_theta", "rope_scaling", "max_position_embeddings")
# The rope_theta a loader that ignores rope_parameters (transformers 4's LlamaConfig default,
# SGLang's and vLLM's llama_eagle3 config) builds: a config that means it needs no top-level key.
LEGACY_DEFAULT_THETA = 10000.0


def rope_matches_training(ev: Evidence) -> Result:
    """The rope theta / scaling and max positions the engines build the drafter with (its own
    config.json) are the ones it was trained with, and the target is the one it was trained
    against (FC-09). A drafter's own rope is its own choice (SpecForge's drafters keep 10000 and
    2048 positions under a Llama-3 target): only a shorter reach than the target's is named."""
    layer = ev.layer_config
    theta, scaling = rope_from_hf_config(layer.get)
    served = {
        "rope_theta": theta,
        "rope_scaling": scaling,
        "max_position_embeddings": layer.get("max_position_embeddings"),
    }
    unread = _rope_engines_misread(layer, theta, scaling)
    if unread is not None:
        return unread
    if ev.manifest is None and ev.inputs.target is None:
        raise Unavailable("nothing to compare with", "pass --target DIR or keep the manifest")
    problems = _rope_not_as_trained(ev, served)
    if problems:
        return fail(
            "; ".join(problems),
            "write the trained values into config.json, or re-export it from the "
            "training run (specdraft export RUN/draft OUT --engine ENGINE writes them)",
        )
    moved = _target_rope_moved(ev)
    if moved:
        return fail(
            "; ".join(moved),
            "serve the target the drafter was trained on, or train a drafter for "
            "this target (re-exporting cannot change the target's rope)",
        )
    record = (
        "as trained"
        if ev.manifest is not None
        else "as its config.json declares (no manifest: its only record)"
    )
    return ok(
        f"rope_theta {theta}, rope_scaling {describe(scaling)}, max positions "
        f"{served['max_position_embeddings']}: {record}"
        + _legacy_note(layer)
        + _reach(ev, served["max_position_embeddings"])
    )


def _rope_engines_misread(layer: dict, theta, scaling) -> Result | None:
    """A fail when the engines cannot build the rope the config means: rope only under
    rope_parameters (transformers 5) other than the default older loaders build anyway
    (LEGACY_DEFAULT_THETA, no scaling), or a partial rotary factor; None otherwise."""
    legacy_default = theta == LEGACY_DEFAULT_THETA and scaling is None
    if "rope_parameters" in layer and "rope_theta" not in layer and not legacy_default:
        return fail(
            "rope only under rope_parameters (transformers 5): older loaders ignore it and use "
            "rope_theta 10000",
            f"write rope_theta {theta} and rope_scaling {describe(scaling)} at the "
            "top level of config.json (specdraft export writes them)",
        )
    if layer.get("partial_rotary_factor", 1.0) != 1.0:
        return fail(
            f"partial_rotary_factor {layer['partial_rotary_factor']}: the drafter's rope is applied to "
            "part of each head, which specdraft's drafter does not implement",
            "remove partial_rotary_factor if the drafter was trained with full rotary",
        )
    return None


def _legacy_note(layer: dict) -> str:
    """The evidence's note on a rope given only under rope_parameters that passes (the default)."""
    if "rope_parameters" in layer and "rope_theta" not in layer:
        return (
            f"; given under rope_parameters only, which older loaders ignore, building rope_theta "
            f"{LEGACY_DEFAULT_THETA} without scaling: the same rope"
        )
    return ""


def _rope_not_as_trained(ev: Evidence, served: dict) -> list[str]:
    """How the served rope (config.json) differs from what the manifest records of training;
    [] without a manifest."""
    if ev.manifest is None:
        return []
    trained = {k: ev.manifest.draft[k] for k in ROPE_KEYS if k in ev.manifest.draft}
    return [
        f"{k} {describe(served[k])} (config.json, what the engines use) vs {describe(v)} (training)"
        for k, v in trained.items()
        if v != served[k]
    ]


def _target_rope_moved(ev: Evidence) -> list[str]:
    """How the --target's rope / max positions differ from what the manifest recorded of the
    target at training (another target than trained); [] without both."""
    recorded = (ev.manifest.target or {}) if ev.manifest is not None else {}
    if ev.inputs.target is None or not recorded:
        return []
    f = ev.facts
    now = {
        "rope_theta": f.rope_theta,
        "rope_scaling": f.rope_scaling,
        "max_position_embeddings": f.max_position_embeddings,
    }
    return [
        f"the target's {k} {describe(now[k])} (target {ev.inputs.target}) vs {describe(recorded[k])} "
        "(the target at training)"
        for k in ROPE_KEYS
        if k in recorded and now[k] != recorded[k]
    ]


def _reach(ev: Evidence, positions) -> str:
    """The evidence's note when the drafter reaches fewer positions than the target serves."""
    try:
        target = ev.facts.max_position_embeddings
    except Unavailable:
        return ""
    if isinstance(positions, int) and isinstance(target, int) and positions < target:
        return (
            f"; the drafter's own {positions} positions are fewer than the target's {target}: keep prompt + "
            f"output within {positions} (specdraft's engine and server refuse longer requests)"
        )
    return ""
