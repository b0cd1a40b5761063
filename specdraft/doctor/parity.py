"""Checks that serving feeds the drafter what training did: the tokenizer, the chat template's
rendering (FC-08), and the width of the aux states a real target forward supplies (S2)."""

from __future__ import annotations

import torch

from specdraft.doctor.evidence import Evidence, Unreadable
from specdraft.doctor.file_evidence import Unavailable, describe
from specdraft.doctor.verdict import NUM_AUX, Result, engine_name, fail, ok


def tokenizer_matches_manifest(ev: Evidence) -> Result:
    """The serving tokenizer has the training tokenizer's vocabulary and special ids (FC-08)."""
    from specdraft.data.render import tokenizer_fingerprint

    trained = ev.need_manifest().tokenizer
    if not trained:
        raise Unavailable("the manifest records no tokenizer", "train through specdraft capture")
    served = tokenizer_fingerprint(ev.tokenizer)
    differ = [
        f"{k} {describe(served.get(k))} (serving) vs {describe(v)} (training)"
        for k, v in trained.items()
        if served.get(k) != v
    ]
    if differ:
        return fail("; ".join(differ), "serve the tokenizer the drafter was trained with")
    return ok(f"vocabulary hash, special ids and length ({served['length']}) as trained")


def chat_template_matches_manifest(ev: Evidence) -> Result:
    """Serving renders chats token for token as training did: template hash, kwargs (FC-08)."""
    from specdraft.data.render import render_parity, template_hash

    trained = ev.need_manifest().chat_template
    if not trained or not trained.get("chat", True):
        raise Unavailable("trained without a chat template (plain text)", "")
    tokenizer = ev.tokenizer
    served_hash = template_hash(tokenizer)
    if served_hash != trained.get("hash"):
        return fail(
            f"chat template hash {str(served_hash)[:12]} (serving) vs "
            f"{str(trained.get('hash'))[:12]} (training)",
            "serve the training template",
        )
    kwargs_trained, kwargs_served = trained.get("kwargs") or {}, _served_kwargs(ev)
    chats = ev.chats if ev.inputs.samples is not None else []
    if chats:
        diffs = render_parity(tokenizer, chats, kwargs_trained, kwargs_served)
        if diffs:
            return fail(
                f"kwargs {kwargs_trained} (training) vs {kwargs_served} (serving): "
                + "; ".join(diffs[:3]),
                f"serve with chat template kwargs {kwargs_trained}",
            )
        return ok(f"same template; {len(chats)} chats render identically")
    if kwargs_trained != kwargs_served:
        raise Unavailable(
            f"template kwargs differ: {kwargs_trained} (training) vs {kwargs_served} "
            "(serving); no sample chats to render both ways",
            "pass --samples chats.jsonl",
        )
    return ok(f"same template hash and kwargs {kwargs_trained}")


def _served_kwargs(ev: Evidence) -> dict:
    if ev.inputs.template_kwargs is not None:
        return dict(ev.inputs.template_kwargs)
    try:
        args = ev.engine_args
    except Unavailable:
        args = None
    return dict(args.template_kwargs or {}) if args is not None else {}


def aux_width_on_target(ev: Evidence) -> Result:
    """On a real target forward, the engine's aux states are as wide as fc's input (S2); a
    mismatch's fix names its cause (`_width_fix`)."""
    if "fc.weight" not in ev.tensors:
        raise Unavailable(
            "no fc.weight in the checkpoint: nothing to compare the aux width with",
            "see keys_match_engine",
        )
    target, fc_in = ev.target, ev.tensors["fc.weight"].shape[1]
    ids = (
        torch.tensor([ev.samples[0].input_ids[:16]])
        if ev.inputs.samples is not None
        else torch.arange(1, 9).remainder(target.vocab_size)[None]
    )
    problems, fixes, passes = [], [], []
    for engine in ev.engines:
        on, why = ev.aux_capture(engine)
        try:
            layers = ev.reading.captured(engine) if on else []
        except Unreadable as e:
            return fail(e.reason, e.fix)
        out = target.forward(ids, aux_layers=layers, return_logits=False)
        width = out.aux_hidden.shape[-1] if on else out.last_hidden.shape[-1]
        supplied = f"{len(layers)} states of layers {layers}" if on else f"one hidden state ({why})"
        if width != fc_in:
            problems.append(
                f"{engine_name(engine)} supplies {supplied} = width {width}, but fc takes "
                f"{fc_in} = {NUM_AUX} x {fc_in // NUM_AUX}"
                + (
                    "; the engine applies fc only when widths differ, so it skips fc silently"
                    if width == ev.draft_config.hidden_size
                    else ""
                )
            )
            fixes.append(_width_fix(ev, engine, layers if on else None, fc_in, target.hidden_size))
            continue
        draft, _ = ev.engine_draft(engine)
        draft(
            ids[:, 1:],
            out.aux_hidden[:, :-1].float(),
            torch.arange(ids.shape[1] - 1),
            first_step=True,
        )
        passes.append(f"{engine_name(engine)} supplies {supplied} = width {width} = fc input")
    if problems:
        return fail("; ".join(problems), "; ".join(dict.fromkeys(fixes)))
    return ok("; ".join(passes) + f" (target forward on {ids.shape[1]} tokens)")


def _width_fix(ev: Evidence, engine: str, layers: list[int] | None, fc_in: int, hidden: int):
    """The fix of an aux width other than fc's input, by its cause: a drafter built for another
    hidden size, no aux capture (layers None), or another count of layers than the 3 fc fuses
    (e.g. the engine's default ids, which collapse on a short target)."""
    if fc_in != NUM_AUX * hidden:
        return (
            f"the drafter was built for a target of hidden size {fc_in // NUM_AUX}, not this "
            f"target's {hidden}: serve it with the target it was trained on, or train a drafter "
            "on this one"
        )
    if layers is None:
        return (
            "serve with EAGLE-3 aux capture (--speculative-algorithm EAGLE3 / method eagle3, "
            "eagle_config.use_aux_hidden_state true)"
        )
    return (
        f"{engine_name(engine)} captures {len(layers)} layers ({ev.ids_source(engine)}), not the "
        f"{NUM_AUX} fc fuses: write the trained layers' ids (specdraft export writes each engine's)"
    )
