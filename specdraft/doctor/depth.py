"""Whether each draft step of the served chain pays off (S5): the chain of --engine-args, else the
one specdraft serve reports on /v1/models (`client.Server.speculative`), replayed offline by the
drafter on the samples."""

from __future__ import annotations

from specdraft.doctor.evidence import Evidence
from specdraft.doctor.file_evidence import Unavailable
from specdraft.doctor.offline import run_on
from specdraft.doctor.verdict import Result, fail, ok, rates_text
from specdraft.engine.spec_config import SpecConfig

# A draft step is worth running while it adds at least this many expected tokens.
MIN_STEP_GAIN = 0.1


def draft_depth_pays_off(ev: Evidence) -> Result:
    """Each configured chain step adds at least MIN_STEP_GAIN expected tokens a round, the
    drafter replaying the chain's rounds on the samples (S5; bench measures). The chain: the
    --engine-args one, else the one specdraft serve reports (--server); without one, a skip."""
    from specdraft.doctor.online import served_by_specdraft  # httpx: imported when a check runs

    args = ev.engine_args
    try:
        spec = args.spec_config() if args is not None else None
    except ValueError:
        raise Unavailable(
            "the speculative settings are invalid", "see speculative_settings_valid"
        ) from None
    if spec is None and served_by_specdraft(ev):
        spec = _served_setting(ev)
    if spec is None or not spec.is_chain:
        raise Unavailable(
            "needs a chain setting in --engine-args"
            if spec is None
            else "tree settings: measure them with specdraft bench",
            "",
        )
    # P(draft k accepted) a round, the drafter replaying the chain's rounds on the samples (a
    # per-position product of alphas would overstate it: rounds crowd where drafts fail)
    replayed = run_on(ev, ev.engine, spec.num_steps, ev.labelled_samples, replay=True).metrics
    reach = replayed.replayed_acceptance() or [0.0] * spec.num_steps
    useful = next((k for k, r in enumerate(reach) if r < MIN_STEP_GAIN), len(reach))

    def tau(n: int) -> float:
        return 1 + sum(reach[:n])

    text = (
        f"P(draft k accepted) a round, offline {rates_text(reach[:8])}{' ...' if len(reach) > 8 else ''}; "
        f"expected accept length {tau(spec.num_steps):.2f} with {spec.num_steps} steps"
    )
    if useful < spec.num_steps:
        fix = (
            f"use {useful} steps (expected accept length {tau(useful):.2f})"
            if useful
            else f"use no speculation: the first draft is accepted with p < {MIN_STEP_GAIN}"
        ) + "; confirm with specdraft bench against no speculation"
        return fail(f"steps past {useful} add < {MIN_STEP_GAIN} expected tokens each: {text}", fix)
    return ok(text)


def _served_setting(ev: Evidence) -> SpecConfig:
    """The speculative setting specdraft serve at --server reports on /v1/models
    (`client.Server.speculative`); Unavailable when it reports none (--no-spec)."""
    from specdraft.doctor.online import served

    reported = served(ev).speculative
    if reported is None:
        raise Unavailable(
            f"{ev.inputs.server} is specdraft serve without speculation (it reports no setting)",
            f"restart specdraft serve with --draft {ev.path}",
        )
    return SpecConfig(**reported)
