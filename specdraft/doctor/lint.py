"""Checks of the config as each engine reads it: fc width, aux ids and the layers they capture,
the EAGLE-3 variant flags, draft vocabulary size, head tying, the embedding and head each engine
runs (S2, S3, FC-02, FC-03, FC-06). The launch command's checks are `launch.py`, rope's
`rope.py`."""

from __future__ import annotations

import json

from specdraft.checkpoint import FLAGS_FIX, CheckpointError, unimplemented_flags
from specdraft.checkpoint.config_read import LEGACY_FC_NORM_FLAG, norm_flags_of_config
from specdraft.conventions import AUX_KEY, ConventionError, lint_sglang_ids, to_engine_ids
from specdraft.conventions.config_reads import sglang_head
from specdraft.conventions.engines import flag_refusal, sglang_embedding
from specdraft.doctor.evidence import Evidence, Unreadable
from specdraft.doctor.file_evidence import Unavailable
from specdraft.doctor.verdict import NUM_AUX, Result, engine_name, fail, ok
from specdraft.draft_config import method_label


def fc_width_matches_aux(ev: Evidence) -> Result:
    """fc.in_features == 3 x target hidden size, as SGLang and vLLM feed it (S2, FC-06)."""
    if "fc.weight" not in ev.tensors:
        raise Unavailable("no fc.weight in the file", "see keys_match_engine")
    out_width, in_width = ev.tensors["fc.weight"].shape
    hidden, _, source = ev.target_sizes()  # without the target: the width its config declares
    declared = ev.config.get("target_hidden_size") or ev.layer_config.get("target_hidden_size")
    problems = []
    if in_width != NUM_AUX * hidden:
        problems.append(
            f"fc.weight {list(ev.tensors['fc.weight'].shape)} takes {in_width} inputs, "
            f"but the engines feed {NUM_AUX} aux states x target hidden {hidden} = "
            f"{NUM_AUX * hidden}"
        )
    if declared is None and out_width != hidden:
        problems.append(
            f"no target_hidden_size in the config: SGLang sizes fc as 3 x hidden_size "
            f"{out_width}, not 3 x {hidden}"
        )
    elif declared is not None and declared != hidden:
        problems.append(
            f"config target_hidden_size {declared} != the target's hidden size {hidden}"
        )
    if problems and source != "target":
        return fail(
            "; ".join(problems),
            "fc.weight does not fit the drafter's own config: re-export the drafter "
            "from its training run",
        )
    if problems:
        return fail(
            "; ".join(problems),
            f"train the drafter on {NUM_AUX} aux layers of this target "
            "(fc input 3 x H) and export it with specdraft export",
        )
    return ok(
        f"fc takes {in_width} = {NUM_AUX} x {hidden} (target hidden"
        + ("" if source == "target" else ", as the drafter's config declares it")
        + ")"
    )


def aux_ids_read_alike(ev: Evidence) -> Result:
    """The config's aux ids mean the same layers to every engine that may read it (FC-03)."""
    problems = []
    nested = (ev.config.get("eagle_config") or {}).get(AUX_KEY)
    if nested and "sglang" in ev.engines and ev.inputs.sglang_version is None:
        problems += lint_sglang_ids(nested, ev.known_class.target_class)
    try:
        reading = ev.reading  # one engine: does it read another engine's ids in its own convention?
        problems += reading.problems() if len(ev.engines) > 1 else reading.misread(ev.engines[0])
    except Unreadable as e:
        problems.append(e.reason)
    if problems:
        return fail(
            "; ".join(problems),
            "re-export with specdraft export (top-level ids in vLLM's "
            "convention, eagle_config ids in SGLang's) or pass --sglang-version",
        )
    read = ", ".join(f"{engine_name(e)} reads {reading.captured(e)}" for e in ev.engines)
    return ok(f"{read} (specdraft indices)")


def engine_captures_training_layers(ev: Evidence) -> Result:
    """The layers the engine captures under this config are the training layers (S3, FC-03): the
    manifest's, else the --aux-layers the user names."""
    given = ev.inputs.aux_layers
    trained = (
        list(given)
        if ev.manifest is None and given is not None
        else list(ev.need_manifest().aux_layers)
    )
    try:
        reading = ev.reading
    except Unreadable as e:
        return fail(f"{e.reason}; trained on {trained}", _express(ev, trained))
    wrong = []
    for engine in ev.engines:
        captured = reading.captured(engine)
        if captured != trained:
            order = (
                " (same layers, other order: engines concatenate in layer order)"
                if sorted(captured) == sorted(trained)
                else ""
            )
            wrong.append(
                f"{engine_name(engine)} captures {captured} ({ev.ids_source(engine)}){order}"
            )
    if wrong:
        return fail(
            f"trained on {trained} (specdraft indices); " + "; ".join(wrong), _express(ev, trained)
        )
    return ok(
        f"trained on {trained}; "
        + ", ".join(f"{engine_name(e)} captures {reading.captured(e)}" for e in ev.engines)
    )


def _express(ev: Evidence, layers: list[int]) -> str:
    """For each engine, the ids that express `layers`, or why it cannot."""
    facts, parts = ev.facts, []
    if facts.target_class is None:
        return "engines read ids by target class, which is unknown: pass --target DIR to get them"
    for engine, key in (("vllm", "top-level"), ("sglang", "eagle_config")):
        try:
            ids = to_engine_ids(
                layers, engine, facts.num_layers, facts.target_class, ev.inputs.sglang_version
            )
            parts.append(f"{engine_name(engine)}: {key} {AUX_KEY} {ids}")
        except ConventionError as e:
            parts.append(f"{engine_name(engine)}: cannot ({e})")
    return "; ".join(parts) + "; specdraft export --engine ENGINE writes them"


def variant_flags_implemented(ev: Evidence) -> Result:
    """The drafter's EAGLE-3 variant flags are ones the checked engines and specdraft implement:
    none that specdraft's drafter does not (`checkpoint.unimplemented_flags`, the rule every
    command refuses to load such a drafter by), a speculators config writes norm_before_residual
    (vLLM assumes true without it), and no norm flag is set that a checked engine does not
    implement (`conventions.flag_refusal`: SGLang has no norm_before_residual)."""
    flagged = unimplemented_flags(ev.config)
    if flagged:
        named = ", ".join(f"{k}: {json.dumps(v)}" for k, v in flagged.items())  # as in the file
        return fail(
            f"sets {named}: the engine computes a variant specdraft's drafter does not implement "
            "(specdraft's commands refuse to load it)",
            f"{' and '.join(flagged)}: {FLAGS_FIX}",
        )
    value = ev.config.get("norm_before_residual", ev.layer_config.get("norm_before_residual"))
    if value is None and ev.layout == "speculators":
        return fail(
            "speculators config without norm_before_residual: vLLM then assumes true "
            "(transformers_utils/configs/speculators/algos.py)",
            "write norm_before_residual: false (specdraft export does)",
        )
    try:
        flags = norm_flags_of_config(ev.path, ev.config)
    except CheckpointError as e:
        return fail(str(e), "write true or false, one value per flag")
    if ev.config.get(LEGACY_FC_NORM_FLAG) and not ev.config.get(
        "fc_norm"
    ):  # fc_norm only by its old name
        flags = {**flags, LEGACY_FC_NORM_FLAG: True}
    refused = [
        reason
        for engine in ev.engines
        for name, on in flags.items()
        if on and (reason := flag_refusal(engine, name, ev.inputs.sglang_version))
    ]
    if refused:
        return fail(
            f"{'; '.join(refused)}: that engine computes another drafter than the one trained",
            "serve it with an engine that implements the flag (vLLM for norm_before_residual); for "
            "use_aux_norm, re-export it (specdraft export writes fc_norm)",
        )
    named = ", ".join(f"{name} true" for name, on in flags.items() if on)
    if named:
        engines = " and ".join(engine_name(engine) for engine in ev.engines)
        return ok(
            f"{named}: implemented by {engines} and specdraft's drafter ({method_label(flags)})"
        )
    residual = "absent: false for official configs" if value is None else json.dumps(value)
    return ok(f"no variant flag set (norm_before_residual {residual}): the plain EAGLE-3 drafter")


def draft_vocab_size_declared(ev: Evidence) -> Result:
    """draft_vocab_size is declared when the head is smaller than the vocabulary (FC-02)."""
    if "lm_head.weight" not in ev.tensors:
        raise Unavailable("no lm_head.weight in the file", "see keys_match_engine")
    rows, (_, vocab, _) = ev.tensors["lm_head.weight"].shape[0], ev.target_sizes()
    declared = ev.config.get("draft_vocab_size", ev.layer_config.get("draft_vocab_size"))
    config_vocab = ev.layer_config.get("vocab_size")
    problems = []
    if config_vocab is not None and config_vocab != vocab:
        problems.append(f"vocab_size {config_vocab} != the target's {vocab}")
    if declared is None and rows != vocab:
        problems.append(
            f"no draft_vocab_size, but lm_head has {rows} rows < vocabulary {vocab}: "
            "SGLang then loads the target's full head instead (llama_eagle3.py)"
        )
    elif declared is not None and declared != rows:
        problems.append(f"draft_vocab_size {declared} != lm_head rows {rows}")
    if problems:
        return fail("; ".join(problems), f"write draft_vocab_size: {rows} (specdraft export does)")
    return ok(
        f"draft_vocab_size {declared if declared is not None else '(absent)'}, lm_head {rows} rows, "
        f"vocabulary {vocab}"
    )


def lm_head_untied(ev: Evidence) -> Result:
    """tie_word_embeddings is not true (SGLang would replace the trained lm_head)."""
    value = ev.config.get("tie_word_embeddings", ev.layer_config.get("tie_word_embeddings"))
    if value is True:
        return fail(
            "tie_word_embeddings: true: SGLang uses the embedding as the head and drops the "
            "trained lm_head (llama_eagle3.py)",
            "write tie_word_embeddings: false",
        )
    return ok(
        "tie_word_embeddings false"
        if value is False
        else "tie_word_embeddings absent (LlamaConfig default false)"
    )


def embedding_and_head_as_trained(ev: Evidence) -> Result:
    """Each engine runs the drafter with the embedding and lm_head it was trained with
    (`conventions.EMBEDDING_SOURCES`): SGLang puts the target's embedding in place of an owned
    one of the same width, and the target's lm_head in place of the trained one when the config
    has no draft_vocab_size; vLLM keeps a distinct owned embedding."""
    cfg = ev.shape_config
    declared = {
        **ev.layer_config,
        **{k: ev.config[k] for k in ("target_hidden_size", "draft_vocab_size") if k in ev.config},
    }
    problems, sglang_runs = [], None
    if "sglang" in ev.engines:
        own = ev.tensors.get("embed_tokens.weight") if cfg.owns_embedding else None
        as_trained, sglang_runs = sglang_embedding(declared, own, lambda: _target_embedding(ev))
        if not as_trained:
            problems.append(
                f"{sglang_runs} (set_embed keeps the drafter's only when target_hidden_size != "
                "hidden_size)"
            )
    head_as_trained, sglang_head_runs = sglang_head(
        declared, ev.tensors.get("lm_head.weight"), lambda: _target_head(ev)
    )
    if "sglang" in ev.engines and not head_as_trained:
        problems.append(sglang_head_runs)
    if problems:
        return fail(
            "; ".join(problems),
            "serve it with vLLM (which keeps a distinct owned embedding), or train "
            "it sharing the target's embedding; write draft_vocab_size (specdraft export writes it)",
        )
    own = "its own embedding" if cfg.owns_embedding else "the target's embedding"
    return ok(
        ", ".join(
            f"{engine_name(e)} runs it with {sglang_runs if e == 'sglang' else own} and "
            + (sglang_head_runs if e == "sglang" else "its trained lm_head")
            for e in ev.engines
        )
    )


def _target_head(ev: Evidence):
    """The target's lm_head weight (None: no target to compare with)."""
    try:
        return ev.target.lm_head.weight.detach()
    except Unavailable:
        return None


def _target_embedding(ev: Evidence):
    """The target's embedding weight (None: no target to compare with)."""
    try:
        return ev.target.embed_tokens.weight.detach()
    except Unavailable:
        return None
