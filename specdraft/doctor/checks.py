"""The doctor's checks: one function per verification rule, each named for what it verifies.

A check takes the `Evidence` and returns a `Result` (verdict, evidence, fix); run.py names it
after the function. A check that lacks an input raises `Unavailable`, which becomes a skip with
the reason (a skip is never a pass). `CASES` maps every field case id (shared/cases) to the
checks that catch it; `specdraft export` covers S1, S3, FC-01 and FC-03 as well.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from specdraft.checkpoint import UNIMPLEMENTED_FLAGS
from specdraft.conventions import AUX_KEY, ConventionError, lint_sglang_ids, to_engine_ids, validate_vocab_map
from specdraft.doctor.evidence import (
    ENGINE_LAYER_PREFIXES,
    ENGINE_NAMES,
    Broken,
    Evidence,
    Unavailable,
    Unreadable,
    describe,
)
from specdraft.doctor.offline import DEFAULT_TTT_STEPS, offline_run, run_on, training_accuracy
from specdraft.draft import rope_from_hf_config
from specdraft.serve.engine_args import ALGORITHM_FLAG, EAGLE3_ALGORITHM, SOURCES, EngineArgs

if TYPE_CHECKING:  # imported when the check runs (httpx, bench)
    from specdraft.doctor.online import OnlineRun

VERDICTS = ("pass", "fail", "skip")
NUM_AUX = 3  # fc input = 3 x target hidden in SGLang and vLLM
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
# A draft step is worth running while it adds at least this many expected tokens.
MIN_STEP_GAIN = 0.1
# Online vs offline rounds replayed on the same (server-produced) sequences: fail when online
# p_1 is more than ONLINE_P1_GAP below offline, or online tau under ONLINE_TAU_RATIO x offline
# tau. The replay reproduces a server that computes alike (vLLM-CPU fp32: within 0.01); the
# margins leave room for a bf16 server's rounding.
ONLINE_P1_GAP, ONLINE_TAU_RATIO = 0.1, 0.85
# ... and when online p_1 is more than ONLINE_P1_EXCESS above offline: the server runs another
# (better) drafter than this checkpoint.
ONLINE_P1_EXCESS = 0.3
# The checks that test each likely cause of an acceptance gap.
GAP_CAUSES = {"target": ("target_matches_training",), "keys": ("keys_match_engine",),
              "layers": ("engine_captures_training_layers",),
              "fc": ("fc_width_matches_aux", "aux_width_on_target", "algorithm_is_eagle3"),
              "vocab map": ("vocab_map_valid", "draft_vocab_size_declared"),
              "template": ("tokenizer_matches_manifest", "chat_template_matches_manifest"),
              "rope": ("rope_matches_training",)}


@dataclass(frozen=True)
class Result:
    """What a check concluded: verdict ("pass" | "fail" | "skip"), evidence, fix."""

    verdict: str
    evidence: str
    fix: str = ""

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict {self.verdict!r}: expected one of {VERDICTS}")
        if self.verdict == "skip" and not self.evidence:
            raise ValueError("a skip must say why")


def ok(evidence: str) -> Result:
    """A pass with its evidence."""
    return Result("pass", evidence)


def fail(evidence: str, fix: str) -> Result:
    """A failure with its evidence and the fix."""
    return Result("fail", evidence, fix)


def _names(names: list[str], limit: int = 8) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" ... (+{len(names) - limit})" if len(names) > limit else "")


def _engine(engine: str) -> str:
    return ENGINE_NAMES[engine]


# ------------------------------------------------------------------------------ target identity

# What the manifest records about the target, in the order the evidence shows it.
TARGET_FIELDS = ("architecture", "num_layers", "hidden_size", "vocab_size", "config_hash")


def target_matches_training(ev: Evidence) -> Result:
    """--target is the model the drafter was trained for: architecture, layer count, hidden size,
    vocabulary and config hash as the manifest records them."""
    trained = dict(ev.need_manifest().target or {})
    given_dir = ev.need_target_dir()
    if not any(trained.get(k) is not None for k in TARGET_FIELDS):
        raise Unavailable("the manifest records no target", "train with specdraft train, which records it")
    facts = ev.facts  # from --target
    given = {"architecture": facts.architecture, "num_layers": facts.num_layers,
             "hidden_size": facts.hidden_size, "vocab_size": facts.vocab_size,
             "config_hash": ev.target_config_hash}
    differ = [k for k in TARGET_FIELDS if trained.get(k) is not None and trained[k] != given[k]]
    recorded = trained.get("name_or_path") or "(path not recorded)"
    text = f"target {recorded} ({_target_text(trained)})"
    if not differ:
        return ok(f"trained for {text}; --target {given_dir} is the same model")
    why = f"{', '.join(differ)} differ"
    if differ == ["config_hash"]:
        why += (" (same sizes, other config: another model of this shape, an edited config.json, "
                "or a transformers release that writes the config differently)")
    return fail(f"this drafter was trained for {text}, not --target {given_dir} ({_target_text(given)}): {why}",
                f"pass the target it was trained for (--target {recorded}), or retrain the drafter "
                f"on {given_dir}")


def _target_text(record: dict) -> str:
    parts = [str(record.get("architecture"))] if record.get("architecture") else []
    for key, label in (("num_layers", "layers"), ("hidden_size", "hidden"), ("vocab_size", "vocab")):
        if record.get(key) is not None:
            parts.append(f"{record[key]} {label}" if key == "num_layers" else f"{label} {record[key]}")
    if record.get("config_hash"):
        parts.append(f"config {str(record['config_hash'])[:12]}")
    return ", ".join(parts) or "nothing recorded"


# ------------------------------------------------------------------------------ checkpoint audit

def keys_match_engine(ev: Evidence) -> Result:
    """Every tensor name is one the engine loads, and every parameter is filled (S1, FC-01)."""
    try:
        key_maps = {engine: ev.key_map(engine) for engine in ev.engines}
    except Broken as e:  # missing inputs skip; faulty files fail
        return fail(e.reason, e.fix)
    problems, passes = [], []
    for engine, keys in key_maps.items():
        if not (keys.unmatched or keys.missing):
            passes.append(f"{_engine(engine)} loads all {len(keys.mapping)} tensors")
            continue
        parts = ([f"skip {len(keys.unmatched)} tensors [{_names(keys.unmatched)}]"] if keys.unmatched else []) \
            + ([f"leave {len(keys.missing)} parameters at their initial values [{_names(keys.missing)}]"]
               if keys.missing else [])
        text = f"{_engine(engine)} would {' and '.join(parts)}"
        stray = [p for p in ("layers.0.", "midlayer.") if any(k.startswith(p) for k in keys.unmatched)]
        if stray:
            text += f"; the decoder layer is stored as {stray[0]}* but {_engine(engine)} reads " \
                    f"{' or '.join(p + '*' for p in ENGINE_LAYER_PREFIXES[engine])}: rename {stray[0]} -> midlayer."
        problems.append(text)
    if problems:
        return fail("; ".join(problems), f"specdraft export {ev.path} OUT --engine {ev.engines[0]} "
                    "(writes the engine's names, proven bit-identical)")
    return ok("; ".join(passes))


def shapes_and_dtypes(ev: Evidence) -> Result:
    """Tensor shapes match the config; weights share one float dtype; d2t int64, t2d bool."""
    keys = ev.key_map("vllm")  # accepts either layer prefix: shapes only
    problems = [f"wrong shape: {m}" for m in keys.misshaped]
    floats = {str(t.dtype).removeprefix("torch.") for t in ev.tensors.values() if t.is_floating_point()}
    if len(floats) > 1:
        problems.append(f"weights mix dtypes {sorted(floats)}")
    if floats - {"bfloat16", "float16", "float32"}:
        problems.append(f"weights in {sorted(floats)}: engines expect bf16, fp16 or fp32")
    for name, dtype in (("d2t", torch.int64), ("t2d", torch.bool)):
        if name in ev.tensors and ev.tensors[name].dtype != dtype:
            problems.append(f"{name} is {ev.tensors[name].dtype}, expected {dtype}")
    if problems:
        return fail("; ".join(problems), "re-export the drafter from its training output")
    return ok(f"{len(ev.tensors)} tensors of the configured shapes, weights in {', '.join(sorted(floats))}")


def values_finite(ev: Evidence) -> Result:
    """No NaN or Inf in any weight."""
    bad = [name for name, t in ev.tensors.items() if t.is_floating_point() and not torch.isfinite(t).all()]
    if bad:
        return fail(f"NaN or Inf in {_names(bad)}", "retrain from the last finite checkpoint")
    return ok("every weight is finite")


def vocab_map_valid(ev: Evidence) -> Result:
    """d2t maps the draft vocabulary into the target's, as offsets, consistent with t2d (FC-02)."""
    draft_vocab = ev.tensors["lm_head.weight"].shape[0] if "lm_head.weight" in ev.tensors else None
    if draft_vocab is None:
        raise Unavailable("no lm_head.weight, so the draft vocabulary size is unknown",
                          "see keys_match_engine")
    vocab = ev.facts.vocab_size
    problems = validate_vocab_map(ev.tensors.get("d2t"), ev.tensors.get("t2d"), vocab, draft_vocab)
    if problems:
        return fail("; ".join(problems), "rebuild the map with conventions.build_vocab_map and re-export")
    if "d2t" not in ev.tensors:
        return ok(f"no d2t, and the draft vocabulary is the target's ({vocab})")
    t2d = "consistent with t2d" if "t2d" in ev.tensors else "no t2d (engines do not read it)"
    return ok(f"d2t maps {draft_vocab} draft ids to increasing target ids in [0, {vocab}); {t2d}")


# ------------------------------------------------------------------------------ config lint

def fc_width_matches_aux(ev: Evidence) -> Result:
    """fc.in_features == 3 x target hidden size, as SGLang and vLLM feed it (S2, FC-06)."""
    if "fc.weight" not in ev.tensors:
        raise Unavailable("no fc.weight in the file", "see keys_match_engine")
    out_width, in_width = ev.tensors["fc.weight"].shape
    hidden = ev.facts.hidden_size
    declared = ev.config.get("target_hidden_size") or ev.layer_config.get("target_hidden_size")
    problems = []
    if in_width != NUM_AUX * hidden:
        problems.append(f"fc.weight {list(ev.tensors['fc.weight'].shape)} takes {in_width} inputs, "
                        f"but the engines feed {NUM_AUX} aux states x target hidden {hidden} = "
                        f"{NUM_AUX * hidden}")
    if declared is None and out_width != hidden:
        problems.append(f"no target_hidden_size in the config: SGLang sizes fc as 3 x hidden_size "
                        f"{out_width}, not 3 x {hidden}")
    elif declared is not None and declared != hidden:
        problems.append(f"config target_hidden_size {declared} != the target's hidden size {hidden}")
    if problems:
        return fail("; ".join(problems), f"train the drafter on {NUM_AUX} aux layers of this target "
                    "(fc input 3 x H) and export it with specdraft export")
    return ok(f"fc takes {in_width} = {NUM_AUX} x {hidden} (target hidden)")


def aux_ids_read_alike(ev: Evidence) -> Result:
    """The config's aux ids mean the same layers to every engine that may read it (FC-03)."""
    problems = []
    nested = (ev.config.get("eagle_config") or {}).get(AUX_KEY)
    if nested and "sglang" in ev.engines and ev.facts.target_class != "llama" \
            and ev.inputs.sglang_version is None:
        problems += lint_sglang_ids(nested)
    try:
        reading = ev.reading
        problems += reading.problems() if len(ev.engines) > 1 else []
    except Unreadable as e:
        problems.append(e.reason)
    if problems:
        return fail("; ".join(problems), "re-export with specdraft export (top-level ids in vLLM's "
                    "convention, eagle_config ids in SGLang's) or pass --sglang-version")
    read = ", ".join(f"{_engine(e)} reads {reading.captured(e)}" for e in ev.engines)
    return ok(f"{read} (specdraft indices)")


def engine_captures_training_layers(ev: Evidence) -> Result:
    """The layers the engine captures under this config are the training layers (S3, FC-03)."""
    trained = list(ev.need_manifest().aux_layers)
    try:
        reading = ev.reading
    except Unreadable as e:
        return fail(f"{e.reason}; trained on {trained}", _express(ev, trained))
    wrong = []
    for engine in ev.engines:
        captured = reading.captured(engine)
        if captured != trained:
            order = " (same layers, other order: engines concatenate in layer order)" \
                if sorted(captured) == sorted(trained) else ""
            wrong.append(f"{_engine(engine)} captures {captured} ({_ids_source(ev, engine)}){order}")
    if wrong:
        return fail(f"trained on {trained} (specdraft indices); " + "; ".join(wrong),
                    _express(ev, trained))
    return ok(f"trained on {trained}; " + ", ".join(
        f"{_engine(e)} captures {reading.captured(e)}" for e in ev.engines))


def _ids_source(ev: Evidence, engine: str) -> str:
    nested = (ev.config.get("eagle_config") or {}).get(AUX_KEY)
    top = ev.config.get(AUX_KEY)
    if engine == "sglang":
        return f"eagle_config ids {nested}" if nested else "no eagle_config ids: SGLang's default"
    if top or nested:
        return f"top-level ids {top}" if top else f"eagle_config ids {nested}, read as-is"
    return "no ids: vLLM's default"


def _express(ev: Evidence, layers: list[int]) -> str:
    """For each engine, the ids that express `layers`, or why it cannot."""
    facts, parts = ev.facts, []
    if facts.target_class is None:
        return "engines read ids by target class, which is unknown: pass --target DIR to get them"
    for engine, key in (("vllm", "top-level"), ("sglang", "eagle_config")):
        try:
            ids = to_engine_ids(layers, engine, facts.num_layers, facts.target_class,
                                ev.inputs.sglang_version)
            parts.append(f"{_engine(engine)}: {key} {AUX_KEY} {ids}")
        except ConventionError as e:
            parts.append(f"{_engine(engine)}: cannot ({e})")
    return "; ".join(parts) + "; specdraft export --engine ENGINE writes them"


def _given_engine_args(ev: Evidence) -> EngineArgs | Result:
    """The parsed --engine-args of a check that needs them, or a fail when they cannot be read
    (the user's command line is at fault); raises Unavailable (a skip) when none were given."""
    try:
        args = ev.engine_args
    except Unavailable as e:
        return fail(e.reason, e.fix)
    if args is None:
        raise Unavailable("no --engine-args", "pass the engine's command line (--engine-args \"...\")")
    return args


def algorithm_is_eagle3(ev: Evidence) -> Result:
    """The engine runs the EAGLE-3 algorithm, which the drafter's architecture needs (FC-06)."""
    args = _given_engine_args(ev)
    if isinstance(args, Result):
        return args
    want, flag = EAGLE3_ALGORITHM[args.engine], ALGORITHM_FLAG[args.engine]
    if args.algorithm is None:
        what = ("SGLang runs without speculation" if args.engine == "sglang" else
                "vLLM guesses the method from the draft path's name ('eagle-' -> eagle, 'eagle3' -> "
                "eagle3, else another method)")
        return fail(f"no {flag}: {what} ({SOURCES[args.engine]})", f"set {flag} {want}")
    if not args.uses_eagle3:
        return fail(f"{flag} {args.algorithm!r} with an EAGLE-3 drafter: plain EAGLE feeds one H-wide "
                    "hidden state and captures no aux layers, so fc is skipped (widths match) or "
                    "the draft is garbage: accept length ~1.0, no warning", f"set {flag} {want}")
    return ok(f"{flag} {args.algorithm} (EAGLE-3, aux capture)")


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
        raise Unavailable(f"no speculative settings in --engine-args: {_engine(args.engine)} picks "
                          "them itself", "pass them explicitly to have them checked")
    shape = "a chain (num_draft_tokens = steps + 1)" if spec.is_chain else \
        f"a tree of at most {spec.max_draft_tokens} nodes"
    return ok(f"steps {spec.num_steps}, topk {spec.topk}, draft tokens {spec.num_draft_tokens}: {shape}")


def norm_before_residual_false(ev: Evidence) -> Result:
    """norm_before_residual is false (what specdraft trains) and no untrained variant flag is set."""
    layer, config = ev.layer_config, ev.config
    flagged = [k for k in UNIMPLEMENTED_FLAGS if k != "norm_before_residual"
               and (config.get(k) or layer.get(k))]
    value = config.get("norm_before_residual", layer.get("norm_before_residual"))
    problems = [f"sets {flagged}: the engine computes a variant specdraft did not train"] if flagged else []
    if value is True:
        problems.append("norm_before_residual: true, but the drafter was trained with false")
    elif value is None and ev.layout == "speculators":
        problems.append("speculators config without norm_before_residual: vLLM then assumes true "
                        "(transformers_utils/configs/speculators/algos.py)")
    if problems:
        return fail("; ".join(problems), "write norm_before_residual: false (specdraft export does)")
    return ok(f"norm_before_residual {'false' if value is False else 'absent (false for official configs)'}")


def draft_vocab_size_declared(ev: Evidence) -> Result:
    """draft_vocab_size is declared when the head is smaller than the vocabulary (FC-02)."""
    if "lm_head.weight" not in ev.tensors:
        raise Unavailable("no lm_head.weight in the file", "see keys_match_engine")
    rows, vocab = ev.tensors["lm_head.weight"].shape[0], ev.facts.vocab_size
    declared = ev.config.get("draft_vocab_size", ev.layer_config.get("draft_vocab_size"))
    config_vocab = ev.layer_config.get("vocab_size")
    problems = []
    if config_vocab is not None and config_vocab != vocab:
        problems.append(f"vocab_size {config_vocab} != the target's {vocab}")
    if declared is None and rows != vocab:
        problems.append(f"no draft_vocab_size, but lm_head has {rows} rows < vocabulary {vocab}: "
                        "SGLang then loads the target's full head instead (llama_eagle3.py)")
    elif declared is not None and declared != rows:
        problems.append(f"draft_vocab_size {declared} != lm_head rows {rows}")
    if problems:
        return fail("; ".join(problems), f"write draft_vocab_size: {rows} (specdraft export does)")
    return ok(f"draft_vocab_size {declared if declared is not None else '(absent)'}, lm_head {rows} rows, "
              f"vocabulary {vocab}")


def lm_head_untied(ev: Evidence) -> Result:
    """tie_word_embeddings is not true (SGLang would replace the trained lm_head)."""
    value = ev.config.get("tie_word_embeddings", ev.layer_config.get("tie_word_embeddings"))
    if value is True:
        return fail("tie_word_embeddings: true: SGLang uses the embedding as the head and drops the "
                    "trained lm_head (llama_eagle3.py)", "write tie_word_embeddings: false")
    return ok("tie_word_embeddings false" if value is False else
              "tie_word_embeddings absent (LlamaConfig default false)")


def rope_matches_training(ev: Evidence) -> Result:
    """rope theta / scaling, partial rotary and max positions equal training's and the target's (FC-09)."""
    layer = ev.layer_config
    theta, scaling = rope_from_hf_config(layer.get)
    served = {"rope_theta": theta, "rope_scaling": scaling,
              "max_position_embeddings": layer.get("max_position_embeddings")}
    problems = []
    if "rope_theta" not in layer:
        problems.append("no rope_theta key (only rope_parameters): older loaders fall back to 10000")
    if layer.get("partial_rotary_factor", 1.0) != 1.0:
        problems.append(f"partial_rotary_factor {layer['partial_rotary_factor']}: the drafter was "
                        "trained with full rotary")
    only_target = not problems  # so far none about the drafter's config itself
    for name, reference in _rope_references(ev):
        for key, value in served.items():
            if key in reference and reference[key] != value:
                problems.append(f"{key} {describe(value)} (config) vs {describe(reference[key])} ({name})")
                only_target = only_target and name != "training"
    if problems and only_target and ev.manifest is not None:  # the config is as trained: the target differs
        return fail("; ".join(problems), "serve the target the drafter was trained on, or train a drafter for "
                    "this target (re-exporting cannot change the target's rope)")
    if problems:
        return fail("; ".join(problems), "re-export with specdraft export (writes the trained rope "
                    "and max positions explicitly)")
    return ok(f"rope_theta {theta}, rope_scaling {describe(scaling)}, max positions "
              f"{served['max_position_embeddings']}: as trained" +
              (" and as the target" if ev.inputs.target is not None else ""))


def _rope_references(ev: Evidence) -> list[tuple[str, dict]]:
    """(name, {key: value}) of what the config must match; only keys the source knows."""
    keys = ("rope_theta", "rope_scaling", "max_position_embeddings")
    refs = []
    if ev.manifest is not None:  # the DraftConfig the trainer used: every key is known
        refs.append(("training", {k: ev.manifest.draft[k] for k in keys if k in ev.manifest.draft}))
    if ev.inputs.target is not None:
        f = ev.facts
        known = {"rope_theta": f.rope_theta, "rope_scaling": f.rope_scaling,
                 "max_position_embeddings": f.max_position_embeddings}
        refs.append((f"target {ev.inputs.target}", {k: v for k, v in known.items()
                                                     if v is not None or k == "rope_scaling"}))
    if not refs:
        raise Unavailable("nothing to compare with", "pass --target DIR or keep the manifest")
    return refs


def tokenizer_matches_manifest(ev: Evidence) -> Result:
    """The serving tokenizer has the training tokenizer's vocabulary and special ids (FC-08)."""
    from specdraft.data import tokenizer_fingerprint

    trained = ev.need_manifest().tokenizer
    if not trained:
        raise Unavailable("the manifest records no tokenizer", "train through specdraft capture")
    served = tokenizer_fingerprint(ev.tokenizer)
    differ = [f"{k} {describe(served.get(k))} (serving) vs {describe(v)} (training)"
              for k, v in trained.items() if served.get(k) != v]
    if differ:
        return fail("; ".join(differ), "serve the tokenizer the drafter was trained with")
    return ok(f"vocabulary hash, special ids and length ({served['length']}) as trained")


def chat_template_matches_manifest(ev: Evidence) -> Result:
    """Serving renders chats token for token as training did: template hash, kwargs (FC-08)."""
    from specdraft.data import render_parity, template_hash

    trained = ev.need_manifest().chat_template
    if not trained or not trained.get("chat", True):
        raise Unavailable("trained without a chat template (plain text)", "")
    tokenizer = ev.tokenizer
    served_hash = template_hash(tokenizer)
    if served_hash != trained.get("hash"):
        return fail(f"chat template hash {str(served_hash)[:12]} (serving) vs "
                    f"{str(trained.get('hash'))[:12]} (training)", "serve the training template")
    kwargs_trained, kwargs_served = trained.get("kwargs") or {}, _served_kwargs(ev)
    chats = ev.chats if ev.inputs.samples is not None else []
    if chats:
        diffs = render_parity(tokenizer, chats, kwargs_trained, kwargs_served)
        if diffs:
            return fail(f"kwargs {kwargs_trained} (training) vs {kwargs_served} (serving): "
                        + "; ".join(diffs[:3]), f"serve with chat template kwargs {kwargs_trained}")
        return ok(f"same template; {len(chats)} chats render identically")
    if kwargs_trained != kwargs_served:
        raise Unavailable(f"template kwargs differ: {kwargs_trained} (training) vs {kwargs_served} "
                          "(serving); no sample chats to render both ways", "pass --samples chats.jsonl")
    return ok(f"same template hash and kwargs {kwargs_trained}")


def _served_kwargs(ev: Evidence) -> dict:
    if ev.inputs.template_kwargs is not None:
        return dict(ev.inputs.template_kwargs)
    try:
        args = ev.engine_args
    except Unavailable:
        args = None
    return dict(args.template_kwargs or {}) if args is not None else {}


# ------------------------------------------------------------------------------ capture parity

def aux_width_on_target(ev: Evidence) -> Result:
    """On a real target forward, the engine's aux states are as wide as fc's input (S2)."""
    if "fc.weight" not in ev.tensors:
        raise Unavailable("no fc.weight in the checkpoint: nothing to compare the aux width with",
                          "see keys_match_engine")
    target, fc_in = ev.target, ev.tensors["fc.weight"].shape[1]
    ids = torch.tensor([ev.samples[0].input_ids[:16]]) if ev.inputs.samples is not None \
        else torch.arange(1, 9).remainder(target.vocab_size)[None]
    problems, passes = [], []
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
            problems.append(f"{_engine(engine)} supplies {supplied} = width {width}, but fc takes "
                            f"{fc_in} = {NUM_AUX} x {target.hidden_size}" + (
                                "; the engine applies fc only when widths differ, so it skips fc "
                                "silently" if width == ev.draft_config.hidden_size else ""))
            continue
        draft, _ = ev.engine_draft(engine)
        draft(ids[:, 1:], out.aux_hidden[:, :-1].float(), torch.arange(ids.shape[1] - 1), first_step=True)
        passes.append(f"{_engine(engine)} supplies {supplied} = width {width} = fc input")
    if problems:
        return fail("; ".join(problems), "serve with EAGLE-3 aux capture (--speculative-algorithm "
                    "EAGLE3 / method eagle3, eagle_config.use_aux_hidden_state true)")
    return ok("; ".join(passes) + f" (target forward on {ids.shape[1]} tokens)")


# ------------------------------------------------------------------------------ acceptance

def offline_acceptance_matches_training(ev: Evidence) -> Result:
    """The drafter alone on samples (teacher-forced, own states fed back) accepts per position
    about as often as training said; a large gap names the likely causes (S6, S1-S3, FC-09).
    Under MIN_SCORED scored positions it skips (too little evidence); a later position scored
    under MIN_SCORED times is shown, not judged."""
    training = training_accuracy(ev.manifest)
    steps = len(training[0]) if training else _ttt_steps(ev)
    try:
        run = offline_run(ev, ev.engine, steps)
    except ValueError as e:  # the drafter refuses the aux states it is given (S2)
        return fail(f"the drafter refuses what the engine feeds it: {e}", "see aux_width_on_target")
    offline = run.metrics.accuracy()
    if int(run.metrics.total[0]) == 0:
        raise Unavailable("no supervised position in the samples (empty loss mask, or labels "
                          "outside the draft vocabulary)", "give samples with assistant turns")
    scored = [int(n) for n in run.metrics.total]
    where = (f"{run.num_samples} samples ({scored[0]} positions scored), aux layers {run.aux_layers} "
             f"({run.fed_from}), drafter {run.loaded_as}")
    if training is None:
        raise Unavailable(f"the manifest has no training metrics; offline accuracy per position "
                          f"{_rates(offline)} ({where})", "train with specdraft train")
    if scored[0] < MIN_SCORED:
        raise Unavailable(f"too little evidence for a verdict: {scored[0]} supervised positions scored over "
                          f"{run.num_samples} samples, at least {MIN_SCORED} needed (the rate's noise would "
                          f"match the gap it is checked for); offline accuracy per position {_rates(offline)}",
                          "pass more samples (more or longer --samples records, e.g. the capture store; "
                          "--max-samples caps how many are used)")
    rows = ", ".join(f"{k + 1}: {t:.2f} / {o:.2f}" for k, (t, o) in enumerate(zip(training[0], offline)))
    text = f"per position {training[1]} / offline: {rows}; {where}"
    thin = [k + 1 for k in range(len(offline)) if scored[k] < MIN_SCORED]
    if thin:
        text += f"; positions {thin} not judged (under {MIN_SCORED} positions scored)"
    gaps = [k + 1 for k, (t, o) in enumerate(zip(training[0], offline))
            if scored[k] >= MIN_SCORED and (t - o >= MIN_GAP or (t >= 0.1 and o < COLLAPSE_RATIO * t))]
    if gaps:
        fix = _likely_causes(ev)
        if not any(f.verdict == "fail" for f in ev.findings):
            fix += ("; or samples unlike the training data (e.g. human text where the drafter "
                    "learned the target's own regenerated outputs): pass the capture store or "
                    "the target's outputs as --samples")
        return fail(f"offline far below training at positions {gaps}: {text}", fix)
    return ok(text)


def _ttt_steps(ev: Evidence) -> int:
    config = ((ev.manifest.training or {}).get("config") or {}) if ev.manifest else {}
    return int(config.get("ttt_steps") or DEFAULT_TTT_STEPS)


def _rates(values: list[float]) -> str:
    return "[" + ", ".join(f"{v:.2f}" for v in values) + "]"


def _likely_causes(ev: Evidence) -> str:
    failed = {f.check for f in ev.findings if f.verdict == "fail"}
    named = [f"{cause} ({', '.join(c for c in checks if c in failed)} failed)"
             for cause, checks in GAP_CAUSES.items() if failed & set(checks)]
    causes = ", ".join(named) if named else ("none of the static checks failed: look at decoder-layer "
                                             "keys, aux layers, fc, vocab map, chat template, rope")
    return f"likely causes: {causes}"


def draft_depth_pays_off(ev: Evidence) -> Result:
    """Each configured chain step adds at least MIN_STEP_GAIN expected tokens a round, the
    drafter replaying the chain's rounds on the samples (S5; bench measures)."""
    args = ev.engine_args
    try:
        spec = args.spec_config() if args is not None else None
    except ValueError:
        raise Unavailable("the speculative settings are invalid", "see speculative_settings_valid") from None
    if spec is None or not spec.is_chain:
        raise Unavailable("needs a chain setting in --engine-args" if spec is None else
                          "tree settings: measure them with specdraft bench", "")
    # P(draft k accepted) a round, the drafter replaying the chain's rounds on the samples (a
    # per-position product of alphas would overstate it: rounds crowd where drafts fail)
    replayed = run_on(ev, ev.engine, spec.num_steps, ev.samples, replay=True).metrics
    reach = replayed.replayed_acceptance() or [0.0] * spec.num_steps
    useful = next((k for k, r in enumerate(reach) if r < MIN_STEP_GAIN), len(reach))

    def tau(n: int) -> float:
        return 1 + sum(reach[:n])

    text = (f"P(draft k accepted) a round, offline {_rates(reach[:8])}{' ...' if len(reach) > 8 else ''}; "
            f"expected accept length {tau(spec.num_steps):.2f} with {spec.num_steps} steps")
    if useful < spec.num_steps:
        fix = (f"use {useful} steps (expected accept length {tau(useful):.2f})" if useful else
               "use no speculation: the first draft is accepted with p < "
               f"{MIN_STEP_GAIN}") + "; confirm with specdraft bench against no speculation"
        return fail(f"steps past {useful} add < {MIN_STEP_GAIN} expected tokens each: {text}", fix)
    return ok(text)


def online_acceptance(ev: Evidence) -> Result:
    """Acceptance measured on a live server (--server; specdraft, vLLM or SGLang counters around
    the sample prompts at T = 0) agrees with offline acceptance on the sequences the server
    produced: fails when online p_1 < offline p_1 - ONLINE_P1_GAP or online tau <
    ONLINE_TAU_RATIO x offline tau (S6), naming the likely causes; when online p_1 > offline p_1
    + ONLINE_P1_EXCESS (another drafter is served); an unreachable server fails. Outputs that
    came back as text only (no token ids) are re-tokenized, which need not give the ids the
    server ran: the evidence says how many, and a failure names that first."""
    from specdraft.doctor.online import (
        MAX_TOKENS,
        ServerError,
        connect,
        offline_on_served,
        run_online,
    )

    url = ev.inputs.server
    if url is None:
        raise Unavailable("no --server", "pass a live server URL")
    try:
        server = connect(url, wait_s=ev.inputs.server_wait_s)  # an unreachable server fails even without samples
        online = run_online(server, ev.samples, _text_to_ids(ev))
    except ServerError as e:
        return fail(f"server unreachable or failing: {e}", f"start the server at {url} or fix --server")
    kind = online.server.kind
    counts = online.counts
    sent = f"{online.num_prompts} prompts x {MAX_TOKENS} tokens at T = 0 to {url} ({kind})"
    if counts is None:
        if kind == "openai":
            raise Unavailable(f"{url} exposes no speculative counters (not specdraft, vLLM or SGLang "
                              "/metrics / meta_info)", "measure acceptance on the server by hand")
        return fail(f"{sent}: the server verified no drafts (speculation is off on it)",
                    "serve with the drafter (EAGLE-3 speculative settings)")
    online_p = counts.acceptance_per_position
    steps = (len(online_p) if online_p else
             round(counts.num_draft_tokens / counts.num_drafts) if counts.num_draft_tokens else
             (ev.engine_args.spec_config().num_steps if ev.engine_args is not None
              and ev.engine_args.spec_config() is not None else _ttt_steps(ev)))
    engine = ev.engine or (kind if kind in ENGINE_NAMES else None)
    try:
        offline = offline_on_served(ev, engine, steps, online)
    except ValueError as e:
        return fail(f"the drafter refuses what the engine feeds it: {e}", "see aux_width_on_target")
    offline_p = offline.metrics.replayed_acceptance() or [0.0] * steps
    tau_on, tau_off = counts.accept_length, offline.metrics.replayed_tau() or 1.0
    on_row = (f"online p_k {_rates(online_p)}, tau {tau_on:.2f}" if online_p else
              f"online tau {tau_on:.2f} ({counts.source}; no per-position counts)")
    off_row = f"offline p_k {_rates(offline_p)}, tau {tau_off:.2f}"
    where = (f"{sent}; offline: the drafter alone replaying {int(offline.metrics.rounds)} rounds of {steps} "
             f"drafts on the {offline.num_samples} sequences it produced, aux layers {offline.aux_layers} ({offline.fed_from}), drafter {offline.loaded_as}")
    gaps = []
    if online_p and online_p[0] < offline_p[0] - ONLINE_P1_GAP:
        gaps.append(f"online p_1 {online_p[0]:.2f} < offline p_1 {offline_p[0]:.2f} - {ONLINE_P1_GAP}")
    if tau_on < ONLINE_TAU_RATIO * tau_off:
        gaps.append(f"online tau {tau_on:.2f} < {ONLINE_TAU_RATIO} x offline tau {tau_off:.2f}")
    text = f"{on_row}; {off_row}; {where}{_retokenized(online)}"
    first = (f"first make {url} return token ids (specdraft serve and vLLM >= 0.10.2 do on "
             "return_token_ids, SGLang as output_ids): offline replayed re-tokenized text; then "
             if online.num_retokenized else "")
    if online_p and online_p[0] > offline_p[0] + ONLINE_P1_EXCESS:
        return fail(f"the server accepts far more than this checkpoint offline (online p_1 "
                    f"{online_p[0]:.2f} > offline p_1 {offline_p[0]:.2f} + {ONLINE_P1_EXCESS}): {text}",
                    first + "the server runs another drafter: doctor the checkpoint it serves, or serve this one")
    if gaps:
        return fail(f"the server accepts far less than this checkpoint offline ({'; '.join(gaps)}): {text}",
                    first + "the server is not running this drafter as doctored: check it serves this "
                    "checkpoint (not another or a stale copy), its loader's keys, the aux layers it "
                    "captures, fc, the vocab map (d2t), the chat template; " + _likely_causes(ev))
    return ok(text)


def _retokenized(online: OnlineRun) -> str:
    """Why the rows may differ when outputs came back as text only ("" when all had ids)."""
    if not online.num_retokenized:
        return ""
    return (f"; {online.num_retokenized} of {online.num_prompts} outputs came back as text only and were "
            "re-tokenized with the target's tokenizer, which need not give the ids the server ran (an "
            "output that continues a word gains a word-start piece, SentencePiece 'k' -> '▁k'; BPE "
            "re-merges pieces; decoding drops special tokens such as EOS): offline then replays other "
            "sequences than online ran, and the rows may differ by more than noise (offline lower, typically)")


def _text_to_ids(ev: Evidence):
    """Ids of a text with the target's tokenizer (loaded only when a server returns text only)."""
    def ids(text: str) -> list[int]:
        return list(ev.tokenizer(text, add_special_tokens=False)["input_ids"])
    return ids


CHECKS = (target_matches_training, keys_match_engine, shapes_and_dtypes, values_finite, vocab_map_valid,
          fc_width_matches_aux, aux_ids_read_alike, engine_captures_training_layers,
          algorithm_is_eagle3, speculative_settings_valid, norm_before_residual_false,
          draft_vocab_size_declared, lm_head_untied, rope_matches_training,
          tokenizer_matches_manifest, chat_template_matches_manifest, aux_width_on_target,
          offline_acceptance_matches_training, draft_depth_pays_off, online_acceptance)

# Field case id (shared/cases/README.md) -> the checks that catch it.
CASES = {
    "S1": ["keys_match_engine", "offline_acceptance_matches_training"],
    "S2": ["aux_width_on_target", "fc_width_matches_aux"],
    "S3": ["engine_captures_training_layers", "offline_acceptance_matches_training"],
    "S4": ["speculative_settings_valid"],
    "S5": ["draft_depth_pays_off"],
    "S6": ["offline_acceptance_matches_training", "online_acceptance"],
    "FC-01": ["keys_match_engine", "shapes_and_dtypes"],
    "FC-02": ["vocab_map_valid", "draft_vocab_size_declared", "offline_acceptance_matches_training"],
    "FC-03": ["aux_ids_read_alike", "engine_captures_training_layers"],
    "FC-06": ["algorithm_is_eagle3", "fc_width_matches_aux", "speculative_settings_valid"],
    "FC-08": ["tokenizer_matches_manifest", "chat_template_matches_manifest"],
    "FC-09": ["rope_matches_training", "offline_acceptance_matches_training"],
}
# Cases `specdraft export` also covers (refuses, or writes the engine's names / ids).
EXPORT_CASES = {"S1": "writes midlayer.* for SGLang", "S3": "refuses layers an engine cannot capture",
                "FC-01": "proves every tensor bit-identical", "FC-03": "writes each engine's own ids"}
