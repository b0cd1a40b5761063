"""Checks of the checkpoint's own files: the target it was trained for, the tensor names each
engine loads, shapes and dtypes, finite weights, the vocabulary map (S1, FC-01, FC-02)."""

from __future__ import annotations

from pathlib import Path

import torch

from specdraft.checkpoint import (
    CheckpointError,
    all_finite,
    describe_layout,
    detect_layout,
    draft_tensors,
    has_manifest,
    usable_vocab,
)
from specdraft.checkpoint.config_read import config_from_files
from specdraft.conventions.engines import DraftLoading, loading_label
from specdraft.data.vocab import validate_vocab_map
from specdraft.doctor.evidence import Evidence
from specdraft.doctor.file_evidence import Broken, Unavailable
from specdraft.doctor.keys import KeyMap
from specdraft.doctor.verdict import Result, engine_name, fail, names_text, ok

# What the manifest records about the target, in the order the evidence shows it.
TARGET_FIELDS = ("architecture", "num_layers", "hidden_size", "vocab_size", "config_hash")


def target_matches_training(ev: Evidence) -> Result:
    """--target is the model the drafter was trained for: architecture, layer count, hidden size,
    vocabulary and config hash as the manifest records them."""
    trained = dict(ev.need_manifest().target or {})
    given_dir = ev.need_target_dir()
    if not any(trained.get(k) is not None for k in TARGET_FIELDS):
        raise Unavailable(
            "the manifest records no target", "train with specdraft train, which records it"
        )
    facts = ev.facts  # from --target
    given = {
        "architecture": facts.architecture,
        "num_layers": facts.num_layers,
        "hidden_size": facts.hidden_size,
        "vocab_size": facts.vocab_size,
        "config_hash": ev.target_config_hash,
    }
    differ = [k for k in TARGET_FIELDS if trained.get(k) is not None and trained[k] != given[k]]
    recorded = trained.get("name_or_path") or "(path not recorded)"
    text = f"target {recorded} ({_target_text(trained)})"
    if not differ:
        return ok(f"trained for {text}; --target {given_dir} is the same model")
    why = f"{', '.join(differ)} differ"
    if differ == ["config_hash"]:
        why += (
            " (same sizes, other config: another model of this shape, an edited config.json, "
            "or a transformers release that writes the config differently)"
        )
    return fail(
        f"this drafter was trained for {text}, not --target {given_dir} ({_target_text(given)}): {why}",
        f"pass the target it was trained for (--target {recorded}), or retrain the drafter "
        f"on {given_dir}",
    )


def verifier_is_target(ev: Evidence) -> Result:
    """A speculators drafter's verifier, the target `vllm serve DRAFTER` loads
    (`conventions.engines.SPECULATORS_VERIFIER_READ`), is --target: its name_or_path resolves
    to the --target directory and its architectures hold the class vLLM loads it as. vLLM
    started on the target with --speculative-config reads no verifier (a pass)."""
    from specdraft.targets.config import ENGINE_ARCHITECTURES

    if ev.layout != "speculators" or "vllm" not in ev.engines:
        return ok(
            "no verifier is read (not a speculators drafter served by vLLM): launch_names_these_models "
            "compares the command line's target with --target"
        )
    given_dir = ev.need_target_dir()
    try:
        args = ev.engine_args
    except Unavailable:
        args = None  # algorithm_is_eagle3 names what is wrong with the command line
    if (
        args is not None
        and args.engine == "vllm"
        and args.speculators_config is None
        and args.draft_model
    ):
        return ok(
            f"vLLM is started on {args.target_model} with --speculative-config: it reads no verifier "
            "(launch_names_these_models compares that target with --target)"
        )
    verifier = (ev.config.get("speculators_config") or {}).get("verifier") or {}
    name, architectures = verifier.get("name_or_path"), verifier.get("architectures") or []
    served = ENGINE_ARCHITECTURES.get(ev.facts.architecture, ev.facts.architecture)
    problems = []
    if not name:
        problems.append("verifier.name_or_path is null: `vllm serve DRAFTER` has no target to load")
    elif not (Path(name).is_dir() and Path(name).resolve() == given_dir.resolve()):
        where = "" if Path(name).is_dir() else " (a hub name or a path not on this machine)"
        problems.append(
            f"`vllm serve {ev.path}` loads verifier {name!r}{where} as the target, not --target {given_dir}"
        )
    if architectures and served and served not in architectures:
        problems.append(f"verifier architectures {architectures}, the target's {served}")
    if problems:
        return fail(
            "; ".join(problems),
            f"record this target as the verifier: specdraft export {ev.path} OUT --engine "
            f"speculators --target {given_dir} (or convert --layout speculators --target {given_dir}); or "
            "start vLLM on the target (specdraft export --engine vllm prints the command)",
        )
    return ok(
        f"verifier {name!r} {architectures} is --target {given_dir}: `vllm serve DRAFTER` loads it as the target"
    )


def _target_text(record: dict) -> str:
    parts = [str(record.get("architecture"))] if record.get("architecture") else []
    for key, label in (
        ("num_layers", "layers"),
        ("hidden_size", "hidden"),
        ("vocab_size", "vocab"),
    ):
        if record.get(key) is not None:
            parts.append(
                f"{record[key]} {label}" if key == "num_layers" else f"{label} {record[key]}"
            )
    if record.get("config_hash"):
        parts.append(f"config {str(record['config_hash'])[:12]}")
    return ", ".join(parts) or "nothing recorded"


def specdraft_loads(ev: Evidence) -> Result:
    """specdraft's own loader reads the files, by the very rule `checkpoint.load_draft` applies
    (`detect_layout`: a draft architecture specdraft implements; with a manifest,
    `config_from_files`: config.json's norm flags those trained; `draft_tensors`: every name a
    parameter, every parameter filled, the shapes), so doctor and the loader never disagree."""
    try:
        layout = detect_layout(ev.path)
        if ev.manifest is not None:  # config.json against training's, as the loader reads both
            config_from_files(ev.path, layout, ev.config, ev.manifest, None)
        tensors, file = ev.tensors, ev.weights_file
        draft_tensors(ev.shape_config, tensors, layout, file)
    except Broken as e:
        return fail(e.reason, e.fix)
    except CheckpointError as e:  # the loader's own line, word for word
        return fail(
            str(e),
            "specdraft inspect/convert/export refuse it alike: repair what it names, or re-export "
            "the drafter from its source",
        )
    derived = (
        "; t2d derived from d2t (the file has none)"
        if "t2d" not in tensors and "d2t" in tensors
        else ""
    )
    described = describe_layout(layout, has_manifest(ev.path))  # as inspect and tune name it
    return ok(f"specdraft loads all {len(tensors)} tensors of {file.name} ({described}){derived}")


def keys_match_engine(ev: Evidence) -> Result:
    """Every tensor name is one the engine loads, and every parameter is filled (S1, FC-01), as
    each engine release reads them (`conventions.DRAFT_LOADING`; SGLang's reading changed in
    0.5.12); a draft architecture an engine does not register fails for it, names unread."""
    try:
        readings = {
            engine: [(row, ev.key_map(engine, row)) for row in ev.loading(engine)]
            for engine in ev.engines
        }
    except Broken as e:  # missing inputs skip; faulty files fail
        return fail(e.reason, e.fix)
    problems, passes, fixes, failing = [], [], [], []
    for engine, rows in readings.items():
        texts = [(row, _engine_reading(ev, row, keys)) for row, keys in rows]
        if len({text for _, text in texts}) == 1:  # every release reads it alike: one line
            texts = [(None, texts[0][1])]
        for row, (good, text) in texts:
            named = f"{loading_label(row)}" if row is not None else engine_name(engine)
            (passes if good else problems).append(f"{named} {text}")
            failing += [] if good else [engine]
        if any(good for _, (good, _) in texts) and not all(good for _, (good, _) in texts):
            fixes.append(
                "or serve with " + " / ".join(loading_label(r) for r, (good, _) in texts if good)
            )
    if problems:
        return fail(
            "; ".join(problems + passes),
            "; ".join(
                [
                    f"{export_command(ev, failing[0])} (writes the engine's names, proven "
                    "bit-identical)"
                ]
                + fixes
            ),
        )
    return ok("; ".join(passes))


def _engine_reading(ev: Evidence, row: DraftLoading, keys: KeyMap) -> tuple[bool, str]:
    """(loads everything, what the release of `row` does with the files), in words."""
    unserved = _unserved_architecture(ev, row)
    if unserved:
        return False, f"would not load this drafter: {unserved}"
    if not (keys.unmatched or keys.missing):
        return True, f"loads all {len(keys.mapping)} tensors"
    parts = (
        [f"skip {len(keys.unmatched)} tensors [{names_text(keys.unmatched)}]"]
        if keys.unmatched
        else []
    ) + (
        [
            f"leave {len(keys.missing)} parameters at their initial values [{names_text(keys.missing)}]"
        ]
        if keys.missing
        else []
    )
    text = f"would {' and '.join(parts)}"
    stray = [p for p in ("layers.0.", "midlayer.") if any(k.startswith(p) for k in keys.unmatched)]
    if stray:
        text += (
            f"; the decoder layer is stored as {stray[0]}* but it reads "
            f"{' or '.join(p + '*' for p in row.layer_prefixes)}: rename {stray[0]} -> midlayer."
        )
    return False, text


def export_command(ev: Evidence, engine: str) -> str:
    """`specdraft export` of this drafter for `engine` as it runs when printed: with doctor's
    --target (export reads a drafter without a manifest by the target's layer count; "--target
    DIR" when doctor had none) and its --sglang-version (SGLang's reading of the ids depends on
    it on DeepSeek-class targets)."""
    command = f"specdraft export {ev.path} OUT --engine {engine}"
    if ev.inputs.target is not None:
        command += f" --target {ev.inputs.target}"
    elif not has_manifest(ev.path):
        command += " --target DIR (the target's directory)"
    if engine == "sglang" and ev.inputs.sglang_version:
        command += f" --sglang-version {ev.inputs.sglang_version}"
    return command


def _unserved_architecture(ev: Evidence, row: DraftLoading) -> str | None:
    """Why the release of `row` would not build this drafter at all (None when it would): a
    config architecture it does not register, or (vLLM) a speculators layer model_type it has no
    draft class for."""
    if ev.layout == "speculators":
        model_type = ev.layer_config.get("model_type", "llama")
        if not row.speculators_model_types or model_type in row.speculators_model_types:
            return None
        return (
            f"its transformer_layer_config model_type {model_type!r} is none it serves a speculators "
            f"drafter for ({', '.join(row.speculators_model_types)}; {row.source})"
        )
    architectures = ev.config.get("architectures") or []
    if set(architectures) & set(row.architectures):
        return None
    return f"architectures {architectures} is no EAGLE-3 draft architecture it registers ({row.source})"


def shapes_and_dtypes(ev: Evidence) -> Result:
    """Tensor shapes match the config; weights share one float dtype; d2t int64, t2d bool."""
    keys = ev.key_map("vllm")  # accepts either layer prefix: shapes only
    problems = [f"wrong shape: {m}" for m in keys.misshaped]
    floats = {
        str(t.dtype).removeprefix("torch.") for t in ev.tensors.values() if t.is_floating_point()
    }
    if len(floats) > 1:
        problems.append(f"weights mix dtypes {sorted(floats)}")
    if floats - {"bfloat16", "float16", "float32"}:
        problems.append(f"weights in {sorted(floats)}: engines expect bf16, fp16 or fp32")
    for name, dtype in (("d2t", torch.int64), ("t2d", torch.bool)):
        if name in ev.tensors and ev.tensors[name].dtype != dtype:
            problems.append(f"{name} is {ev.tensors[name].dtype}, expected {dtype}")
    if problems:
        return fail("; ".join(problems), "re-export the drafter from its training output")
    return ok(
        f"{len(ev.tensors)} tensors of the configured shapes, weights in {', '.join(sorted(floats))}"
    )


def values_finite(ev: Evidence) -> Result:
    """No NaN or Inf in any weight."""
    bad = [name for name, t in ev.tensors.items() if not all_finite(t)]
    if bad:
        return fail(f"NaN or Inf in {names_text(bad)}", "retrain from the last finite checkpoint")
    return ok("every weight is finite")


def vocab_map_valid(ev: Evidence) -> Result:
    """d2t maps the draft vocabulary into the target's, as offsets, consistent with t2d (FC-02)."""
    draft_vocab = ev.tensors["lm_head.weight"].shape[0] if "lm_head.weight" in ev.tensors else None
    if draft_vocab is None:
        raise Unavailable(
            "no lm_head.weight, so the draft vocabulary size is unknown", "see keys_match_engine"
        )
    _, vocab, _ = ev.target_sizes()  # without the target: the vocabulary its config declares
    try:  # the tokenizer's length (the manifest's; without one the target's): ids past it are padding
        usable = usable_vocab(ev.manifest, _tokenizer_length(ev))
    except Unavailable:  # a damaged manifest is the manifest check's finding
        usable = None
    problems = validate_vocab_map(
        ev.tensors.get("d2t"), ev.tensors.get("t2d"), vocab, draft_vocab, usable
    )
    if problems:
        return fail(
            "; ".join(problems), "rebuild the map with data.vocab.build_vocab_map and re-export"
        )
    if "d2t" not in ev.tensors:
        return ok(f"no d2t, and the draft vocabulary is the target's ({vocab})")
    t2d = "consistent with t2d" if "t2d" in ev.tensors else "no t2d (engines do not read it)"
    bound = f"{usable}, the tokenizer's length" if usable is not None and usable < vocab else vocab
    return ok(f"d2t maps {draft_vocab} draft ids to increasing target ids in [0, {bound}); {t2d}")


def _tokenizer_length(ev: Evidence) -> int | None:
    """len() of the target's tokenizer (None: no target, or no tokenizer in it)."""
    try:
        return len(ev.tokenizer)
    except Unavailable:
        return None
