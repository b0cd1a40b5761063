"""How often a block drafter's drafts are accepted (the seeds' method, `block_replay`): the
drafter alone on samples against what training recorded, and a live server's counters against the
drafter alone replaying the server's rounds on the sequences it produced.

Training records, per block position k, the share of its sampled blocks whose first k drafts all
equal the target's greedy tokens (`train.dflash_loss.block_acceptance`: the metrics record's
`replayed_acceptance`, tau = its `replayed_tau`); the offline check counts the same on the samples
and fails by the EAGLE-3 check's rule (`acceptance.far_below`: MIN_GAP lower, or under
COLLAPSE_RATIO x a training rate of 0.1 or more, at any position, over at least MIN_SCORED blocks).
"""

from __future__ import annotations

from specdraft.doctor.acceptance import (
    MIN_GAP,
    MIN_SCORED,
    GapCauses,
    far_below,
    likely_causes,
    served_against_offline,
    trained_on_samples,
    training_rates,
)
from specdraft.doctor.block_replay import replay_served, run_blocks
from specdraft.doctor.evidence import Evidence
from specdraft.doctor.file_evidence import Unavailable
from specdraft.doctor.verdict import Result, fail, ok, rates_text

BLOCK_GAPS = GapCauses(
    {
        "target": ("target_matches_training",),
        "layers": ("target_layers_as_engines_read",),
        "mask token": ("mask_token_matches_training",),
        "template": ("tokenizer_matches_manifest", "chat_template_matches_manifest"),
    },
    "none of the static checks failed (target, target layers, mask token, tokenizer and template "
    "are training's): the drafter's weights compute other drafts than at training (a damaged or "
    "edited file, another run's weights, a bad conversion)",
    "the target layers it captures, the mask token, each draft layer's attention, the chat "
    "template",
    "target_layers_as_engines_read",
)


def block_acceptance_offline(ev: Evidence) -> Result:
    """The drafter alone on the samples (`block_replay.run_blocks`: a block at every anchor training
    could draw, fed the layers the engine captures) accepts per block position about as often as
    training recorded (`replayed_acceptance`, module doc); a position far below training's fails,
    naming the likely causes. Samples that are the training data are compared with the training
    split's record. Under MIN_SCORED blocks it skips (too little evidence)."""
    trained_on = trained_on_samples(ev)
    training = training_rates(ev, trained_on, "replayed_acceptance")
    try:
        run = run_blocks(ev)
    except ValueError as e:  # the drafter refuses the states it is fed (their width)
        return fail(
            f"the drafter refuses what the engine feeds it: {e}", f"see {BLOCK_GAPS.refused}"
        )
    replayed, blocks = run.metrics.replayed_acceptance(), int(run.metrics.rounds)
    where = (
        f"{blocks} blocks on {run.num_samples} samples, target layers {run.aux_layers} "
        f"({run.fed_from}), drafter {run.loaded_as}"
    )
    _refuse_thin_evidence(ev, blocks, replayed, training, where)
    tau_trained = 1 + sum(training[0])
    rows = ", ".join(
        f"{k + 1}: {t:.2f} / {o:.2f}" for k, (t, o) in enumerate(zip(training[0], replayed))
    )
    text = (
        f"p_k {training[1]} / drafter alone: {rows}; tau {tau_trained:.2f} / "
        f"{run.metrics.replayed_tau():.2f}; {where}"
    )
    if trained_on:
        text += "; the samples are the drafter's training data: an optimistic check"
    gaps = [k + 1 for k, (t, o) in enumerate(zip(training[0], replayed)) if far_below(t, o)]
    if not gaps:
        return ok(text)
    fix = likely_causes(ev, BLOCK_GAPS.checks, BLOCK_GAPS.otherwise)
    if not trained_on and not any(f.verdict == "fail" for f in ev.findings):
        fix += "; or samples unlike the training data: pass the capture store as --samples"
    return fail(
        f"the drafter alone accepts far less than at training at positions {gaps}: {text}", fix
    )


def _refuse_thin_evidence(ev, blocks: int, replayed: list[float], training, where: str) -> None:
    """Unavailable when the replay cannot be judged: no block fits in the samples' supervised
    text, no training record to compare with, or under MIN_SCORED blocks."""
    size = ev.need_drafter().cfg.block_size
    if blocks == 0:
        raise Unavailable(
            f"no block of {size} fits in the samples' supervised text (an anchor needs "
            f"{size - 1} supervised tokens after it)",
            "give samples with longer assistant turns (a capture store, or the target's outputs)",
        )
    if training is None:
        raise Unavailable(
            "the manifest records no per-position block acceptance (replayed_acceptance: trained "
            f"before specdraft recorded it, or not by specdraft); the drafter alone: p_k "
            f"{rates_text(replayed)} ({where})",
            "retrain with specdraft train --method dflash",
        )
    if blocks < MIN_SCORED:
        raise Unavailable(
            f"too little evidence for a verdict: {blocks} blocks over the samples, at least "
            f"{MIN_SCORED} needed (a rate's noise would match the {MIN_GAP} gap it is checked "
            f"for); the drafter alone: p_k {rates_text(replayed)}",
            "pass more samples (more or longer --samples records, e.g. the capture store)",
        )


def block_acceptance_online(ev: Evidence) -> Result:
    """A live server's acceptance (--server, its counters around the sample prompts at T = 0)
    agrees with the drafter alone replaying the server's block rounds on the sequences it
    produced (`block_replay.replay_served`), by the EAGLE-3 check's rules
    (`acceptance.online_acceptance`: online p_1 more than ONLINE_P1_GAP below, tau under
    ONLINE_TAU_RATIO x, or p_1 more than ONLINE_P1_EXCESS above: another drafter)."""
    return served_against_offline(ev, replay_served, BLOCK_GAPS)
