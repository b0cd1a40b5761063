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
    """Serving renders chats token for token as training did: template hash, kwargs (FC-08); a
    drafter trained on plain text is served plain (no --chat-template)."""
    from specdraft.data.render import render_parity, template_hash

    trained = ev.need_manifest().chat_template
    if not trained:
        raise Unavailable("the manifest records no chat template", "train through specdraft")
    if not trained.get("chat", True):
        return _plain_text_served(ev.served_template())
    tokenizer, same = ev.tokenizer, "same template"
    if template_hash(tokenizer) != trained.get("hash"):
        other = _other_template(ev, tokenizer, trained)
        if other is not None:
            return other
        same = "the training template file as SGLang reads it"
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
        return ok(f"{same}; {len(chats)} chats render identically")
    if kwargs_trained != kwargs_served:
        raise Unavailable(
            f"template kwargs differ: {kwargs_trained} (training) vs {kwargs_served} "
            "(serving); no sample chats to render both ways",
            "pass --samples chats.jsonl",
        )
    return ok(f"same template hash and kwargs {kwargs_trained}")


def _plain_text_served(served: tuple[str, str] | None) -> Result:
    """The verdict for a drafter trained on plain text (--no-chat): a pass served without a
    chat template file, a fail served with one."""
    if served is None:
        return ok("trained on plain text (--no-chat) and served without --chat-template")
    return fail(
        f"trained on plain text (--no-chat), served with chat template {served[0]}: its "
        "chats reach the drafter rendered as it never saw them",
        f"train on chats rendered with it (--chat-template {served[0]}), or serve without it",
    )


def _other_template(ev: Evidence, tokenizer, trained: dict) -> Result | None:
    """The verdict when serving's template hash is not training's: a fail naming both hashes,
    unless serving is SGLang reading the very file training rendered with (SGLang strips its
    outer newlines and unescapes `\\n`: `data.template`) and the sample chats render alike
    both ways (None: go on to the kwargs); without sample chats, a skip."""
    from specdraft.data.render import render_parity, template_hash
    from specdraft.data.template import read_chat_template, template_fingerprint

    served, hash_trained = ev.served_template(), str(trained.get("hash"))[:12]
    evidence = (
        f"chat template hash {(template_hash(tokenizer) or 'none')[:12]} (serving: "
        f"{_served_text(served, tokenizer)}) vs {hash_trained} (training)"
    )
    fix = "serve the training template (the --chat-template FILE given to capture / train)"
    if served is None or served[1] != "sglang":
        return fail(evidence, fix)
    as_written = read_chat_template(served[0])
    if template_fingerprint(as_written) != trained.get("hash"):
        return fail(evidence, fix)
    chats = ev.chats if ev.inputs.samples is not None else []
    if not chats:
        raise Unavailable(
            f"{evidence}; {served[0]} as written is the training template: no sample chats to "
            "render it as SGLang reads it and as written",
            "pass --samples chats.jsonl",
        )
    kwargs = trained.get("kwargs") or {}
    diffs = render_parity(
        tokenizer,
        chats,
        {**kwargs, "chat_template": as_written},
        {**kwargs, "chat_template": tokenizer.chat_template},
    )
    if diffs:
        return fail(
            f"{evidence}: {served[0]} as SGLang reads it renders otherwise: "
            + "; ".join(diffs[:3]),
            f"drop {served[0]}'s outer newlines (and write no \\n outside its strings), then "
            "capture and train with it again",
        )
    return None


def _served_text(served: tuple[str, str] | None, tokenizer) -> str:
    """Where the served template comes from, for evidence: the file (and SGLang's reading of
    it), or the target tokenizer's own template."""
    if served is None:
        own = getattr(tokenizer, "chat_template", None)
        return "the target tokenizer's own template" if own else "the target's tokenizer has none"
    return served[0] + (" as SGLang reads it" if served[1] == "sglang" else "")


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
