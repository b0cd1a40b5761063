"""Aux-layer indices and engine ids: how a list of specdraft indices is written in an engine's
ids and read back, by the rules of `rules.ENGINE_RULES` (one row per engine, target class and
SGLang version range); ConventionError, with a one-line reason, when an engine cannot.

Aux layers are named by *specdraft index* (= transformers ``hidden_states`` index): 0 = the
embedding output, k in 1..L-1 = output of decoder layer k (1-based), L = output of the last
decoder layer *before* the final norm.
"""

from __future__ import annotations

import dataclasses
import re

from specdraft.conventions.rules import ENGINE_RULES, EngineRule
from specdraft.errors import SpecdraftError

ENGINES = ("sglang", "vllm", "speculators")
# The engines' rule classes (`specdraft.targets.config.target_class_of` maps a transformers class to one):
# llama: Llama/Mistral/Phi-3; qwen: Qwen2/Qwen3/Qwen2.5-VL's text model; deepseek: DeepSeek-V2/V3
# and Kimi-K2.5's wrapper; llava: Llava and Mistral3 wrappers over a Llama-family text model; the
# rest one class each.
_CLASS_NAMES = {
    "llama": "Llama",
    "qwen": "Qwen2/Qwen3",
    "deepseek": "DeepSeek",
    "qwen3_moe": "Qwen3-MoE",
    "gpt_oss": "GPT-OSS",
    "gemma2": "Gemma 2",
    "gemma3": "Gemma 3",
    "llama4": "Llama 4",
    "qwen2_vl": "Qwen2-VL",
    "qwen3_vl": "Qwen3-VL",
    "llava": "Llava/Mistral3",
    "qwen3_5": "Qwen3.5",
    "gemma4": "Gemma 4",
}
TARGET_CLASSES = tuple(_CLASS_NAMES)
AUX_KEY = "eagle_aux_hidden_state_layer_ids"
# Aux states an engine's fc takes (fc input = 3 x target hidden). SGLang >= 0.5.12 sizes fc from
# len(eagle_config ids) (read in its llama_eagle3.py); 3 stays the contract both engines accept.
NUM_AUX_FIXED = {"sglang": 3, "vllm": 3}


class ConventionError(SpecdraftError, ValueError):
    """An engine cannot express a list of aux layers, or its reading cannot be pinned down."""


ENGINE_NAMES = {"sglang": "SGLang", "vllm": "vLLM", "speculators": "speculators"}


def class_label(target_class: str) -> str:
    """A target class of `TARGET_CLASSES` in user terms, e.g. "DeepSeek" for "deepseek"."""
    return _CLASS_NAMES[target_class]


def unknown_class_text(architecture: str | None, source: str) -> str:
    """Why engines' aux ids cannot be judged for a target whose class no `ENGINE_RULES` row covers
    (e.g. OLMo 2), naming its class and where it was read."""
    return (
        f"no engine rule is known for the target class {architecture or '(none named)'} "
        f"({source}): specdraft has read how the engines number aux layers on "
        f"{', '.join(_CLASS_NAMES.values())} targets only"
    )


def parse_version(version: str) -> tuple[int, ...]:
    match = re.match(r"v?(\d+)\.(\d+)(?:\.(\d+))?", str(version))
    if match is None:
        raise ConventionError(f"cannot parse SGLang version {version!r}; write e.g. '0.5.13'")
    return tuple(int(part or 0) for part in match.groups())


def version_label(rule: EngineRule) -> str:
    name = ENGINE_NAMES[rule.engine]
    fmt = lambda v: ".".join(map(str, v))  # noqa: E731
    if rule.since and rule.until:
        return f"{name} >= {fmt(rule.since)}, < {fmt(rule.until)}"
    if rule.until:
        return f"{name} < {fmt(rule.until)}"
    return f"{name} >= {fmt(rule.since)}" if rule.since else name


def rules_for(engine: str, target_class: str, sglang_version: str | None) -> list[EngineRule]:
    """The `ENGINE_RULES` rows of `engine` on `target_class` (those of `sglang_version` alone when
    given); ConventionError for an unknown engine or class, or a version no row covers."""
    if engine not in ENGINES:
        raise ConventionError(f"unknown engine {engine!r}; expected one of {ENGINES}")
    if target_class not in TARGET_CLASSES:
        raise ConventionError(f"unknown target class {target_class!r}; expected {TARGET_CLASSES}")
    rules = [r for r in ENGINE_RULES if r.engine == engine and r.target_class == target_class]
    if engine == "sglang" and sglang_version is not None:
        v = parse_version(sglang_version)
        read = ", ".join(version_label(r) for r in rules)
        rules = [
            r
            for r in rules
            if (r.since is None or v >= r.since) and (r.until is None or v < r.until)
        ]
        if not rules:
            raise ConventionError(
                f"SGLang {sglang_version}'s {_CLASS_NAMES[target_class]} model file was "
                f"not read (rules: {read}); serve a version the table covers"
            )
    return rules


def _index_problem(rule: EngineRule, index: int, num_layers: int, engine_id: int) -> str | None:
    where = f"{_CLASS_NAMES[rule.target_class]}-class targets in {version_label(rule)}"
    if rule.refuse is not None:
        return rule.refuse
    if not 0 <= index <= num_layers:
        return f"id {engine_id} names index {index}, outside 0..{num_layers}"
    if index < rule.lowest:
        return f"id {engine_id} (embeddings) is not capturable on {where}"
    if index > num_layers - rule.top:
        return (
            f"index {index} (last layer's output, before the final norm) is not capturable "
            f"on {where}: its capture loop ends before the final norm"
        )
    return None


def _check_capturable(rule: EngineRule, layers: list[int], ids: list[int], num_layers: int):
    for index, engine_id in zip(layers, ids):
        if (problem := _index_problem(rule, index, num_layers, engine_id)) is not None:
            raise ConventionError(problem)


def _plus1(rule: EngineRule, first: int, last: int, first_plus1: int, num_layers: int) -> bool:
    """Whether `rule` adds 1 to a list whose first / largest entries are `first` / `last`."""
    if rule.offset == "plus1_unless_last_is_L":
        return last != num_layers
    return rule.offset == "plus1" or (rule.offset == "plus1_if_first_is_1" and first == first_plus1)


def _encode(rule: EngineRule, layers: list[int], num_layers: int) -> list[int]:
    plus1 = _plus1(rule, layers[0], max(layers), 2, num_layers)
    if rule.offset == "plus1_if_first_is_1" and layers[0] == 1:
        raise ConventionError(
            f"index 1 cannot be the first aux layer on DeepSeek-class targets "
            f"in {version_label(rule)}: first id 1 reads as index 2, 0 as 0"
        )
    ids = [i - 1 if plus1 else i for i in layers]
    _check_capturable(rule, layers, ids, num_layers)
    return ids


def _decode(rule: EngineRule, ids: list[int], num_layers: int) -> list[int]:
    plus1 = _plus1(rule, ids[0], max(ids), 1, num_layers)
    layers = [i + 1 if plus1 else i for i in ids]
    _check_capturable(rule, layers, ids, num_layers)
    if len(set(layers)) != len(layers):
        raise ConventionError(f"ids {ids} name a layer twice; the engine captures it once")
    return sorted(layers)  # engines append aux states in layer order, whatever the list order


def _check_ids(values, engine: str, num_layers: int, what: str) -> list[int]:
    if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 1:
        raise ConventionError(f"num_layers must be a positive int, got {num_layers!r}")
    values = list(values)
    if not values or not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise ConventionError(f"{what} must be a non-empty list of ints, got {values!r}")
    count = NUM_AUX_FIXED.get(engine)
    if count is not None and len(values) != count:
        raise ConventionError(
            f"SGLang and vLLM both read exactly {count} aux states (fc input = {count} x target "
            f"hidden size): a drafter trained on {len(values)} serves on neither; got "
            f"{len(values)} {what}: {values}"
        )
    return values


def _resolve(engine, target_class, sglang_version, convert, what: str) -> list[int]:
    results, errors = [], []
    for rule in rules_for(engine, target_class, sglang_version):
        try:
            results.append((rule, convert(rule)))
        except ConventionError as err:
            errors.append((rule, str(err)))
    if errors and results:  # with the version unknown, every version's rule must accept the list
        can = _merged_label([rule for rule, _ in results])
        raise ConventionError(
            f"{_refusals_text(errors)}; pass --sglang-version if you serve {can}, which can"
        )
    if errors:
        raise ConventionError(_every_version_refusal(engine, target_class, convert) or errors[0][1])
    if len({tuple(out) for _, out in results}) > 1:
        readings = ", ".join(f"{version_label(r)}: {out}" for r, out in results)
        raise ConventionError(
            f"{what} are read differently by SGLang version on "
            f"{_CLASS_NAMES[target_class]}-class targets ({readings}); "
            "pass --sglang-version"
        )
    return list(results[0][1])


def _refusals_text(refusals: list[tuple[EngineRule, str]]) -> str:
    """The (rule, message) refusals in one text: messages alike but for their rule's version range
    said once, over the ranges merged (`_merged_label`), so each bound printed is where the rule
    changes."""
    groups: dict[str, list[EngineRule]] = {}
    for rule, message in refusals:
        bounded = rule.since is not None or rule.until is not None
        key = message.replace(version_label(rule), "\0") if bounded else message
        groups.setdefault(key, []).append(rule)
    return "; ".join(key.replace("\0", _merged_label(rules)) for key, rules in groups.items())


def _merged_label(rules: list[EngineRule]) -> str:
    """The version ranges of `rules` as one label when they are contiguous ("SGLang >= 0.5.13"
    for [0.5.13, 0.5.14) and [0.5.14, -)), else each range's, joined by "or"."""
    rules = sorted(rules, key=lambda r: r.since or ())
    if all(a.until is not None and a.until == b.since for a, b in zip(rules, rules[1:])):
        return version_label(dataclasses.replace(rules[0], until=rules[-1].until))
    return " or ".join(version_label(r) for r in rules)


def _every_version_refusal(engine: str, target_class: str, convert) -> str | None:
    """The refusal of a list that every version's rule of `engine` (two or more) refuses alike,
    naming no version range (one range would suggest that another version takes the list); None
    when some version takes it, the reasons differ, or one rule covers the class."""
    rules = rules_for(engine, target_class, None)
    problems = set()
    for rule in rules:
        try:
            convert(rule)
            return None
        except ConventionError as err:
            alike = " and ".join(version_label(r) for r in rules)
            problems.add(str(err).replace(f" in {version_label(rule)}", f" in {alike} alike"))
    return problems.pop() if len(rules) > 1 and len(problems) == 1 else None


def check_aux_layers(layers, num_layers: int, engine: str = "vllm") -> list[int]:
    """``layers`` as a list after the rules every engine's aux layers obey: ints, strictly
    increasing within 0..num_layers, exactly 3 for sglang/vllm (the drafter train writes is
    served by both). Raises ConventionError with a one-line reason."""
    layers = _check_ids(layers, engine, num_layers, "aux layers")
    increasing = all(a < b for a, b in zip(layers, layers[1:]))
    if not increasing or not 0 <= layers[0] <= layers[-1] <= num_layers:
        raise ConventionError(f"aux layers {layers} must increase strictly within 0..{num_layers}")
    return layers


def to_engine_ids(
    layers,
    engine: str,
    num_layers: int,
    target_class: str = "llama",
    sglang_version: str | None = None,
) -> list[int]:
    """Return the ids ``engine`` must be given to capture specdraft indices ``layers``.

    ``layers`` must be strictly increasing (engines concatenate aux states in layer order);
    exactly 3 for sglang/vllm. With ``sglang_version`` None every SGLang row of the class must
    accept the layers and agree on the ids (e.g. DeepSeek with first index 2 -> first id 1,
    read alike by all versions). Raises ConventionError with a one-line reason otherwise.
    Rules and sources: ``ENGINE_RULES``.
    """
    layers = check_aux_layers(layers, num_layers, engine)
    convert = lambda rule: _encode(rule, layers, num_layers)  # noqa: E731
    return _resolve(engine, target_class, sglang_version, convert, f"aux layers {layers}")


def from_engine_ids(
    ids,
    engine: str,
    num_layers: int,
    target_class: str = "llama",
    sglang_version: str | None = None,
) -> list[int]:
    """Return the specdraft indices ``engine`` captures for explicit ``ids``, in capture order.

    Raises ConventionError when an id matches no capturable layer, two ids name one layer,
    the count is not 3 (sglang/vllm), or the reading depends on an unknown SGLang version.
    """
    ids = _check_ids(ids, engine, num_layers, "aux ids")
    convert = lambda rule: _decode(rule, ids, num_layers)  # noqa: E731
    return _resolve(engine, target_class, sglang_version, convert, f"{engine} aux ids {ids}")


def capture_ids(layers, engine: str, num_layers: int, target_class: str = "llama") -> list[int]:
    """The ids that make ``engine`` capture each specdraft index of ``layers`` (any count: a
    capture through vLLM asks for the aux layers and index L, the last hidden state), by the same
    `ENGINE_RULES` as ``to_engine_ids``. ``layers`` must increase strictly within 0..num_layers.
    Raises ConventionError naming the first index the engine cannot capture on that class."""
    layers = list(layers)
    if (
        not layers
        or any(a >= b for a, b in zip(layers, layers[1:]))
        or not 0 <= layers[0] <= layers[-1] <= num_layers
    ):
        raise ConventionError(f"layers {layers} must increase strictly within 0..{num_layers}")
    convert = lambda rule: _encode(rule, layers, num_layers)  # noqa: E731
    return _resolve(engine, target_class, None, convert, f"layers {layers}")


def misreadings(
    ids, engine: str, num_layers: int, layers, sglang_version: str | None = None
) -> list[str]:
    """Where `engine` reads explicit `ids` as other specdraft indices than `layers`: one label per
    `ENGINE_RULES` row of any target class (of `sglang_version` alone when given), e.g.
    "DeepSeek-class targets in SGLang >= 0.5.14". A row that refuses the class or cannot capture
    the ids misreads nothing (the engine does not serve that file as trained, and says so or
    doctor does). Empty: a file carrying `ids` is read as `layers` whatever the target's class."""
    ids = _check_ids(ids, engine, num_layers, "aux ids")
    found = []
    for target_class in TARGET_CLASSES:
        try:
            rules = rules_for(engine, target_class, sglang_version)
        except ConventionError:  # this version's file of the class was not read: nothing known
            continue
        for rule in (r for r in rules if r.refuse is None):
            try:
                read = _decode(rule, ids, num_layers)
            except ConventionError:
                continue
            if read != sorted(layers):
                found.append(f"{_CLASS_NAMES[target_class]}-class targets in {version_label(rule)}")
    return found
