"""How often a block drafter's drafts are accepted (the seeds' method, `block_replay`): the
drafter alone on samples against what training recorded, and a live server's counters against the
drafter alone replaying the server's rounds on the sequences it produced.

Training records two rates per block position k, both against the target's greedy tokens at T = 0
(`train.dflash_loss`): its sampled blocks', the share whose first k drafts are all right
(`block_acceptance`, tau = `block_tau`), and, on the validation split, the rounds a whole-block
engine runs walked over the text (`replayed_acceptance`, tau = `replayed_tau`): what the engine
measures, lower than the blocks' (a round starts after a rejected draft). The offline check counts
both on the samples, shows them side by side and fails by the EAGLE-3 check's rule
(`acceptance.far_below`: MIN_GAP lower, or under COLLAPSE_RATIO x a training rate of 0.1 or more,
at any position, over at least MIN_SCORED blocks or rounds) when either is far below training's.
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
from specdraft.doctor.offline import training_accuracy
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
    """The drafter alone on the samples (`block_replay.run_blocks`, fed the layers the engine
    captures) accepts per block position about as often as training recorded (module doc): its
    blocks at every anchor against training's sampled blocks (`block_acceptance`), and the rounds
    an engine runs over the samples against training's validation rounds (`replayed_acceptance`;
    shown, not judged, for samples that are the training data: the training split records no
    rounds, or under MIN_SCORED rounds). A position far below training's fails, naming the likely
    causes. Samples that are the training data are compared with the training split's record.
    Under MIN_SCORED blocks it skips (too little evidence)."""
    trained_on = trained_on_samples(ev)
    training = training_rates(ev, trained_on, "block_acceptance")
    try:
        run = run_blocks(ev)
    except ValueError as e:  # the drafter refuses the states it is fed (their width)
        return fail(
            f"the drafter refuses what the engine feeds it: {e}", f"see {BLOCK_GAPS.refused}"
        )
    m = run.metrics
    blocks, rounds = int(m.blocks), int(m.rounds)
    where = (
        f"{run.num_samples} samples, target layers {run.aux_layers} ({run.fed_from}), drafter "
        f"{run.loaded_as}"
    )
    _refuse_thin_evidence(ev, blocks, m.block_acceptance(), training, where)
    walked = (
        None
        if trained_on
        else training_accuracy(ev.manifest, ("validation",), "replayed_acceptance")
    )
    text = replay_text(m, training, walked, where, trained_on)
    gaps = far_positions(training, m.block_acceptance(), blocks)
    round_gaps = far_positions(walked, m.replayed_acceptance(), rounds)
    if not gaps and not round_gaps:
        return ok(text)
    fix = likely_causes(ev, BLOCK_GAPS.checks, BLOCK_GAPS.otherwise)
    if not trained_on and not any(f.verdict == "fail" for f in ev.findings):
        fix += "; or samples unlike the training data: pass the capture store as --samples"
    below = [
        f"{what} positions {where_}"
        for what, where_ in (("blocks'", gaps), ("rounds'", round_gaps))
        if where_
    ]
    return fail(
        f"the drafter alone accepts far less than at training ({', '.join(below)}): {text}", fix
    )


def replay_text(m, training, walked, where: str, trained_on: bool) -> str:
    """`block_acceptance_offline`'s evidence: the blocks and the walked rounds of the replay's
    metrics `m`, each beside training's record (`side_by_side`), then where they came from."""
    blocks, rounds, steps = int(m.blocks), int(m.rounds), len(m.round_accepted)
    text = (
        f"blocks at every anchor training could draw (p_k: the share whose first k drafts are the "
        f"target's tokens), {blocks} blocks: {side_by_side(training, m.block_acceptance(), blocks)}; "
        f"an engine's rounds at T = 0 walked over the samples' text ({steps} drafts a round, "
        f"each round's anchor the token after the last accepted one: what the engine measures "
        f"on the target's greedy outputs), {rounds} rounds: "
        f"{side_by_side(walked, m.replayed_acceptance(), rounds)}; {where}"
    )
    if trained_on:
        text += "; the samples are the drafter's training data: an optimistic check"
    return text


def side_by_side(training: tuple[list[float], str] | None, alone: list[float], n: int) -> str:
    """ "p_k training (validation split) / drafter alone: 1: 0.60 / 0.58, ...; tau 2.90 / 2.80"
    of rates over n blocks or rounds; without a record, or under MIN_SCORED, the drafter alone's
    rates and why they are not judged."""
    tau_alone = 1 + sum(alone)
    if training is None:
        rows = ", ".join(f"{k + 1}: {o:.2f}" for k, o in enumerate(alone))
        return f"p_k drafter alone {rows}; tau {tau_alone:.2f} (not judged: no training record)"
    rows = ", ".join(
        f"{k + 1}: {t:.2f} / {o:.2f}" for k, (t, o) in enumerate(zip(training[0], alone))
    )
    text = f"p_k {training[1]} / drafter alone: {rows}; tau {1 + sum(training[0]):.2f} / {tau_alone:.2f}"
    return text if n >= MIN_SCORED else f"{text} (not judged: under {MIN_SCORED})"


def far_positions(
    training: tuple[list[float], str] | None, alone: list[float], n: int
) -> list[int]:
    """The block positions (1-based) whose rate alone is far below training's (`far_below`),
    none without a record or under MIN_SCORED blocks / rounds `n`."""
    if training is None or n < MIN_SCORED:
        return []
    return [k + 1 for k, (t, o) in enumerate(zip(training[0], alone)) if far_below(t, o)]


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
            "the manifest records no per-position block acceptance (block_acceptance: trained "
            "before specdraft recorded it, or not by specdraft; an older record's "
            "replayed_acceptance counted blocks, not an engine's rounds); the drafter alone: p_k "
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
