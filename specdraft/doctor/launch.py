"""Checks of the serving command line (--engine-args) as the engine reads it: the algorithm, the
models it names, the speculative settings (S4, FC-06). Against specdraft's own server, which has
no engine launch line, they skip naming its options."""

from __future__ import annotations

from pathlib import Path

from specdraft.doctor.evidence import Evidence
from specdraft.doctor.file_evidence import Unavailable
from specdraft.doctor.verdict import Result, engine_name, fail, ok
from specdraft.serve.engine_args import ALGORITHM_FLAG, EAGLE3_ALGORITHM, SOURCES, EngineArgs

# How each engine's command line names (target, draft) (engine_args.py), with {} for the path.
_MODEL_FLAGS = {
    "sglang": ("--model-path {}", "--speculative-draft-model-path {}"),
    "vllm": ("vllm serve {}", '--speculative-config \'{{"model": "{}", ...}}\''),
}
ENGINE_ARGS_FIX = (
    'pass the SGLang or vLLM launch command (--engine-args "python -m sglang.launch_server ..." '
    'or "vllm serve ..."); specdraft serve needs none: it runs EAGLE-3 and refuses '
    "settings an engine would rewrite"
)
# The same checks when --server is specdraft's own server, which has no launch line of an engine to check
# (`specdraft serve`: the drafter and settings it was started with).
SPECDRAFT_SERVE_SKIP = "{} is specdraft serve: it has no SGLang or vLLM launch line to check"
SPECDRAFT_SERVE_FIX = (
    "none for specdraft serve: it runs its --draft (EAGLE-3 or DFlash) only, and refuses a --num-steps, "
    "--topk or --num-draft-tokens it cannot run; online_acceptance checks the drafter it serves"
)


def _given_engine_args(ev: Evidence) -> EngineArgs | Result:
    """The parsed --engine-args of a check that needs them, or a fail when they cannot be read
    (the user's command line is at fault); raises Unavailable (a skip) when none were given,
    saying so in specdraft serve's terms when --server is specdraft's own server."""
    from specdraft.doctor.online import served_by_specdraft  # httpx: imported when a check runs

    try:
        args = ev.engine_args
    except Unavailable as e:
        return fail(e.reason, e.fix)
    if args is None and served_by_specdraft(ev):
        raise Unavailable(SPECDRAFT_SERVE_SKIP.format(ev.inputs.server), SPECDRAFT_SERVE_FIX)
    if args is None:
        raise Unavailable("no --engine-args", ENGINE_ARGS_FIX)
    return args


def algorithm_is_eagle3(ev: Evidence) -> Result:
    """The engine runs the EAGLE-3 algorithm, which the drafter's architecture needs (FC-06)."""
    args = _given_engine_args(ev)
    if isinstance(args, Result):
        return args
    want, flag = EAGLE3_ALGORITHM[args.engine], ALGORITHM_FLAG[args.engine]
    if args.algorithm is None:
        what = (
            "SGLang runs without speculation"
            if args.engine == "sglang"
            else "vLLM guesses the method from the draft path's name ('eagle-' -> eagle, 'eagle3' -> "
            "eagle3, else another method)"
        )
        return fail(f"no {flag}: {what} ({SOURCES[args.engine]})", f"set {flag} {want}")
    if not args.uses_eagle3:
        return fail(
            f"{flag} {args.algorithm!r} with an EAGLE-3 drafter: plain EAGLE feeds one H-wide "
            "hidden state and captures no aux layers, so fc is skipped (widths match) or "
            "the draft is garbage: accept length ~1.0, no warning",
            f"set {flag} {want}",
        )
    if args.speculators_config is not None:
        return ok(
            f"speculators_model_type {args.algorithm} in {args.speculators_config}: vLLM started on the "
            "drafter reads the method from it (EAGLE-3, aux capture)"
        )
    return ok(f"{flag} {args.algorithm} (EAGLE-3, aux capture)")


def launch_names_these_models(ev: Evidence) -> Result:
    """The launch command serves --target and drafts with CHECKPOINT: its target (`vllm serve
    MODEL` / --model, SGLang --model-path) and its draft (speculative-config "model", SGLang
    --speculative-draft-model-path) resolve to those directories. A name that is no directory
    here (a hub name, a path on another machine) cannot be compared: a skip that names it.
    `vllm serve DRAFTER` names no target of its own: verifier_is_target checks the one it loads."""
    args = _given_engine_args(ev)
    if isinstance(args, Result):
        return args
    flags = _MODEL_FLAGS[args.engine]
    named = [("draft", args.draft_model, ev.path, flags[1], "CHECKPOINT")]
    if args.speculators_config is None:
        named.insert(0, ("target", args.target_model, ev.inputs.target, flags[0], "--target"))
    same, differ, unknown = [], [], []
    for role, given, expected, flag, ours in named:
        if given is None:
            unknown.append(f"the command names no {role} ({flag.format(role.upper())})")
        elif not Path(given).is_dir():
            unknown.append(
                f"{role} {given!r} is no directory here (a hub name or a path on another machine)"
            )
        elif expected is None:
            unknown.append(f"{role} {given}: no {ours} to compare with")
        elif Path(given).resolve() != Path(expected).resolve():
            differ.append(
                (f"the command's {role} {given} is not {ours} {expected}", flag.format(expected))
            )
        else:
            same.append(f"{role} {given} is {ours}")
    if differ:
        return fail(
            "; ".join(text for text, _ in differ),
            f"launch {engine_name(args.engine)} with {' and '.join(fix for _, fix in differ)}, "
            "or point doctor at the models the engine serves",
        )
    if unknown:
        raise Unavailable(
            "cannot compare " + "; ".join(unknown) + "".join(f"; {s}" for s in same),
            "name local directories in the launch command to compare them",
        )
    return ok("; ".join(same))


def speculative_settings_valid(ev: Evidence) -> Result:
    """steps / topk / draft tokens obey the engine's rule, so it does not rewrite them (S4, FC-06)."""
    args = _given_engine_args(ev)
    if isinstance(args, Result):
        return args
    try:
        spec = args.spec_config()
    except ValueError as e:
        return fail(str(e), "use the corrected values above (specdraft refuses, never adjusts)")
    if spec is None:
        raise Unavailable(
            f"no speculative settings in --engine-args: {engine_name(args.engine)} picks "
            "them itself",
            "pass them explicitly to have them checked",
        )
    shape = (
        "a chain (num_draft_tokens = steps + 1)"
        if spec.is_chain
        else f"a tree of at most {spec.max_draft_tokens} nodes"
    )
    return ok(
        f"steps {spec.num_steps}, topk {spec.topk}, draft tokens {spec.num_draft_tokens}: {shape}"
    )
