"""The norms each serving engine applies against those the drafter was trained with: the method
(`draft_config.method_label`, EAGLE-3.1 = fc_norm + norm_output) the manifest records, and the
one the engine builds from config.json (`engine_norms`). Whether an engine implements a flag at
all is `lint.variant_flags_implemented`'s; this check says which drafter the engine then runs."""

from __future__ import annotations

from typing import Any

from specdraft.checkpoint import CheckpointError
from specdraft.checkpoint.config_read import LEGACY_FC_NORM_FLAG, norm_flags_of_config
from specdraft.conventions.engines import flag_refusal
from specdraft.doctor.evidence import Evidence
from specdraft.doctor.verdict import Result, engine_name, fail, ok
from specdraft.draft_config import NORM_FLAGS, method_label

NORMS_FIX = (
    "re-export the drafter from its training run (specdraft export RUN/draft OUT --engine "
    "sglang|vllm|speculators writes the trained flags), or serve it on an engine release that "
    "implements them (`specdraft doctor --sglang-version`)"
)


def engine_norms(
    engine: str, config: dict[str, Any], flags: dict[str, bool], sglang_version: str | None
) -> dict[str, bool]:
    """The NORM_FLAGS `engine` applies to a drafter whose config.json is `config` (`flags`: as
    `norm_flags_of_config` reads it): a flag the engine (or that SGLang release) does not implement
    is not applied (`conventions.flag_refusal`), nor is fc_norm given only as SGLang's legacy
    `use_aux_norm` to an engine that does not read that key (vLLM 0.32)."""
    legacy_only = config.get(LEGACY_FC_NORM_FLAG) and not config.get("fc_norm")
    applied = dict(flags)
    if legacy_only and flag_refusal(engine, LEGACY_FC_NORM_FLAG, sglang_version):
        applied["fc_norm"] = False
    return {
        name: on and flag_refusal(engine, name, sglang_version) is None
        for name, on in applied.items()
    }


def norms_as_trained(ev: Evidence) -> Result:
    """Each checked engine applies the norms the drafter was trained with: the norm flags it
    builds from config.json (`engine_norms`) equal the manifest's (a flag dropped from config.json
    and the engine runs another drafter than was trained, silently). Skips without a manifest."""
    trained = {name: bool(ev.need_manifest().draft.get(name)) for name in NORM_FLAGS}
    try:
        flags = norm_flags_of_config(ev.path, ev.config)
    except CheckpointError as e:
        return fail(str(e), "write true or false, one value per flag")
    version = ev.inputs.sglang_version
    problems = []
    for engine in ev.engines:
        applied = engine_norms(engine, ev.config, flags, version)
        if applied != trained:
            problems.append(f"{engine_name(engine)} applies {_difference(trained, applied)}")
    if problems:
        return fail(
            f"trained as {method_label(trained)}, but {'; '.join(problems)}: the engine runs "
            "another drafter than was trained",
            NORMS_FIX,
        )
    engines = " and ".join(engine_name(engine) for engine in ev.engines)
    verb = "build" if len(ev.engines) > 1 else "builds"
    return ok(f"trained as {method_label(trained)}; {engines} {verb} the same from config.json")


def _difference(trained: dict[str, bool], applied: dict[str, bool]) -> str:
    """ "eagle3 (no norm flag), without fc_norm, norm_output": what is applied, the trained flags
    it leaves out and those it adds."""
    dropped = [name for name in NORM_FLAGS if trained[name] and not applied[name]]
    added = [name for name in NORM_FLAGS if applied[name] and not trained[name]]
    return (
        method_label(applied)
        + (f", without {', '.join(dropped)}" if dropped else "")
        + (f", with {', '.join(added)} (not trained)" if added else "")
    )
