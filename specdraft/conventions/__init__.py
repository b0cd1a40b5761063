"""Conventions every stage shares: aux hidden-state layers and dtype names (the draft
vocabulary map: `specdraft.data.vocab`). The package's modules: this one (indices, ids, the
functions that read and write them by the rules), `rules` (how each engine numbers and captures
aux layers: ENGINE_RULES) and `engines` (what each engine loads, computes and returns).

Aux layers are named by *specdraft index* (= transformers ``hidden_states`` index): 0 = the
embedding output, k in 1..L-1 = output of decoder layer k (1-based), L = output of the last
decoder layer *before* the final norm. Engines write other ids; how each one reads them lives
in ``ENGINE_RULES``, one row per (engine, target class, SGLang version range), with the source
it was read from. Re-check the rows when bumping an engine.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from specdraft.conventions.rules import ENGINE_RULES, EngineRule
from specdraft.errors import SpecdraftError

ENGINES = ("sglang", "vllm", "speculators")
# The engines' rule classes (`specdraft.targets.config.target_class_of` maps a transformers class to one):
# llama: Llama/Qwen2/Qwen3/Mistral/Phi-3; deepseek: DeepSeek-V2/V3 and Kimi-K2.5's wrapper;
# llava: Llava and Mistral3 wrappers over a Llama-family text model; the rest one class each.
_CLASS_NAMES = {
    "llama": "Llama",
    "deepseek": "DeepSeek",
    "qwen3_moe": "Qwen3-MoE",
    "gpt_oss": "GPT-OSS",
    "gemma2": "Gemma 2",
    "gemma3": "Gemma 3",
    "llama4": "Llama 4",
    "qwen2_vl": "Qwen2-VL",
    "qwen3_vl": "Qwen3-VL",
    "llava": "Llava/Mistral3",
}
TARGET_CLASSES = tuple(_CLASS_NAMES)
AUX_KEY = "eagle_aux_hidden_state_layer_ids"
# Aux states an engine's fc takes (fc input = 3 x target hidden). SGLang >= 0.5.12 sizes fc from
# len(eagle_config ids) (read in its llama_eagle3.py); 3 stays the contract both engines accept.
NUM_AUX_FIXED = {"sglang": 3, "vllm": 3}


# The one dtype table: the names capture, train, export and the CLI take.
DTYPES = {
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "float32": torch.float32,
    "fp32": torch.float32,
}


def parse_dtype(name: str | torch.dtype) -> torch.dtype:
    """'bf16' / 'bfloat16' / 'fp16' / 'float16' / 'fp32' / 'float32' (or a dtype) -> dtype.
    Raises ValueError naming the choices (`DTYPES`)."""
    if isinstance(name, torch.dtype):
        return name
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}; use one of {', '.join(DTYPES)}")
    return DTYPES[name]


class ConventionError(SpecdraftError, ValueError):
    """An engine cannot express a list of aux layers, or its reading cannot be pinned down."""


# The config keys that hold aux ids -> the engine whose convention they are written in (the
# official EAGLE-3 config nests SGLang's ids; vLLM's are top-level). SGLang reads only
# eagle_config; vLLM reads top-level, else eagle_config as-is (`aux_layers_from_config`), so a
# file with only eagle_config ids is misread by vLLM unless both conventions agree (FC-03).
AUX_ID_KEYS = {"top-level": "vllm", "eagle_config": "sglang"}
ENGINE_NAMES = {"sglang": "SGLang", "vllm": "vLLM", "speculators": "speculators"}


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


def _rules(engine: str, target_class: str, sglang_version: str | None) -> list[EngineRule]:
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
    for rule in _rules(engine, target_class, sglang_version):
        try:
            results.append((rule, convert(rule)))
        except ConventionError as err:
            errors.append(str(err))
    if errors:  # with the version unknown, every version's rule must accept the list
        hint = "; pass --sglang-version if you serve a version that can" if results else ""
        raise ConventionError(
            f"{(not results and _every_version_refusal(engine, target_class, convert)) or errors[0]}"
            f"{hint}"
        )
    if len({tuple(out) for _, out in results}) > 1:
        readings = ", ".join(f"{version_label(r)}: {out}" for r, out in results)
        raise ConventionError(
            f"{what} are read differently by SGLang version on "
            f"{_CLASS_NAMES[target_class]}-class targets ({readings}); "
            "pass --sglang-version"
        )
    return list(results[0][1])


def _every_version_refusal(engine: str, target_class: str, convert) -> str | None:
    """The refusal of a list that every version's rule of `engine` (two or more) refuses alike,
    naming no version range (one range would suggest that another version takes the list); None
    when some version takes it, the reasons differ, or one rule covers the class."""
    rules = _rules(engine, target_class, None)
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


def check_aux_flag(aux_layers, num_layers: int) -> None:
    """`check_aux_layers` for a user's --aux-layers: ValueError naming the flag, the rule broken
    and an example that obeys it (capture checks it before writing, train --online before loading
    the drafter)."""
    try:
        check_aux_layers(list(aux_layers), num_layers)
    except ConventionError as e:
        example = ",".join(map(str, default_aux_layers(num_layers))) if num_layers >= 4 else "0,1,2"
        raise ValueError(
            f"--aux-layers {','.join(map(str, aux_layers))}: {e}; give 3 increasing "
            f"layers in 0..{num_layers}, e.g. {example}"
        ) from None


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


def default_aux_layers(num_layers: int) -> list[int]:
    """specdraft's default aux layers for an L-layer target: [2, L//2, L-3] when distinct.

    For 5 <= L < 7 the trio [2, clamp(L//2, 3, L-2), L-1] (L = 5: [2, 3, 4]), which every
    engine, class and version can express. For L = 4, [1, 2, 3] (the only trio without the
    embeddings or index L); SGLang >= 0.5.13 cannot write it on DeepSeek-class targets.
    Raises ConventionError for L < 4 (no three distinct decoder-layer outputs).
    """
    if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 4:
        raise ConventionError(f"3 aux layers need at least 4 decoder layers, got {num_layers!r}")
    if num_layers >= 7:
        return [2, num_layers // 2, num_layers - 3]
    if num_layers == 4:
        return [1, 2, 3]
    return [2, min(max(num_layers // 2, 3), num_layers - 2), num_layers - 1]


def engine_default_ids(engine: str, num_layers: int) -> list[int]:
    """Ids (in ``engine``'s explicit convention) that mean the engine's no-ids default.

    SGLang [1, L//2-1, L-4], vLLM/speculators [2, L//2, L-3]: both capture specdraft
    [2, L//2, L-3] (sglang models/llama.py, vllm get_eagle3_aux_hidden_state_layers).
    They collapse for L < 7; see ``default_layers_captured``.
    """
    if engine not in ENGINES:
        raise ConventionError(f"unknown engine {engine!r}; expected one of {ENGINES}")
    shift = 1 if engine == "sglang" else 0
    return [2 - shift, num_layers // 2 - shift, num_layers - 3 - shift]


def default_layers_captured(num_layers: int) -> list[int]:
    """Specdraft indices an engine captures with no ids: the distinct valid ones of the default."""
    return sorted({i for i in (2, num_layers // 2, num_layers - 3) if 0 <= i < num_layers})


# What each engine captures when a draft config names no aux ids, read from its source: the same
# specdraft indices [2, L//2, L-3] for every engine (DESIGN.md section 2, "Defaults").
ENGINE_DEFAULT_SOURCES = {
    "sglang": "sglang srt/models/llama.py set_eagle3_layers_to_capture (stored source, the 0.5.23 "
    "line; deepseek_v2.py and the Qwen models alike): layer_ids None -> layers_to_capture "
    "[2, L//2, L-3] without the +1 explicit ids get, so index i = the input of layer i",
    "vllm": "vllm model_executor/models/llama.py get_eagle3_aux_hidden_state_layers (stored source, "
    "the 0.32 line; the Qwen models alike): (2, L//2, L-3), read as-is",
}


def engines_default_layers(num_layers: int) -> list[int]:
    """The layers every engine captures from a config without aux ids, as specdraft indices:
    [2, L//2, L-3] (`ENGINE_DEFAULT_SOURCES`). Raises ConventionError for L < 7, where the
    default names fewer than 3 distinct layers (no drafter of 3 aux states is served by it)."""
    layers = default_layers_captured(num_layers)
    if len(layers) != 3:
        raise ConventionError(
            f"the engines' default aux layers [2, L//2, L-3] collapse to {layers} on a "
            f"{num_layers}-layer target; write the ids the drafter was trained on"
        )
    return layers


# The conventions an --aux-layers value may be written in ("vllm:2,16,29"; no name = specdraft).
AUX_CONVENTIONS = ("specdraft", "vllm", "sglang", "speculators")


def split_aux_option(text: str) -> tuple[str, str]:
    """An --aux-layers value as (convention, the comma-separated list): "sglang:1,15,28" ->
    ("sglang", "1,15,28"), "2,16,29" -> ("specdraft", "2,16,29"). ValueError for another name."""
    name, sep, rest = text.partition(":")
    if not sep:
        return "specdraft", text
    if name.strip() not in AUX_CONVENTIONS:
        raise ValueError(
            f"{text!r}: {name.strip()!r} is no aux-id convention; write "
            f"{' | '.join(AUX_CONVENTIONS)}:IDS, e.g. vllm:2,16,29 or sglang:1,15,28"
        )
    return name.strip(), rest


def layers_of_option(
    convention: str,
    ids,
    num_layers: int,
    target_class: str = "llama",
    sglang_version: str | None = None,
) -> list[int]:
    """Specdraft indices an --aux-layers value names: ids in `convention` ("specdraft": as given,
    checked by `check_aux_layers`; an engine: `from_engine_ids` by its rule for the target's class
    and SGLang version). Raises ConventionError naming the rule broken."""
    if (
        convention == "specdraft"
    ):  # no engine's count: the drafter's fc width bounds it (`check_aux_count`)
        return check_aux_layers(list(ids), num_layers, engine="specdraft")
    return from_engine_ids(list(ids), convention, num_layers, target_class, sglang_version)


@dataclass(frozen=True)
class AuxReading:
    """What each engine captures from one draft config, in specdraft indices.

    sglang / vllm: from the explicit ids, or None when that engine falls back to ``default``
    (the same tensors for both engines: ``default_layers_captured``). vllm_key: the key vLLM
    took its ids from ("top-level", "eagle_config" or None: none, its default).
    """

    sglang: list[int] | None
    vllm: list[int] | None
    default: list[int]
    vllm_key: str | None = None

    def captured(self, engine: str) -> list[int]:
        explicit = self.sglang if engine == "sglang" else self.vllm
        return self.default if explicit is None else explicit

    @property
    def differs(self) -> bool:
        return self.captured("sglang") != self.captured("vllm")

    def problems(self) -> list[str]:
        """FC-03: the file is read differently by SGLang and vLLM."""
        if not self.differs:
            return []
        sglang, vllm = self.captured("sglang"), self.captured("vllm")
        return [
            f"read differently by the two engines: SGLang captures {sglang}, vLLM {vllm} "
            "(specdraft indices); write the top-level "
            f"{AUX_KEY} in vLLM's convention and eagle_config.{AUX_KEY} in SGLang's"
        ]

    def misread(self, engine: str) -> list[str]:
        """FC-03: `engine` reads a key written in another engine's convention (`AUX_ID_KEYS`)
        in its own, so it captures other layers than the ids mean; empty when it does not."""
        key = self.vllm_key if engine in ("vllm", "speculators") else "eagle_config"
        owner = AUX_ID_KEYS.get(key)
        if (
            key is None
            or owner is None
            or owner == engine
            or self.captured(owner) == self.captured(engine)
        ):
            return []
        return [
            f"{ENGINE_NAMES[engine]} reads the {key} ids, which are in {ENGINE_NAMES[owner]}'s "
            f"convention, in its own: it captures {self.captured(engine)}, not the "
            f"{self.captured(owner)} they mean (specdraft indices); write the top-level {AUX_KEY} "
            f"in vLLM's convention"
        ]


def _keys(config: dict) -> tuple[list | None, list | None, str | None]:
    """(nested ids, the ids vLLM reads, the key vLLM took them from) of a draft config.json."""
    eagle_config = config.get("eagle_config")
    nested = eagle_config.get(AUX_KEY) if isinstance(eagle_config, dict) else None
    if nested is not None and len(nested) == 0:
        raise ConventionError(
            f"eagle_config.{AUX_KEY} is empty: SGLang captures no aux states; "
            "drop the key for the default or write the ids"
        )
    vllm_key = "top-level" if config.get(AUX_KEY) else "eagle_config" if nested else None
    return nested, config.get(AUX_KEY) or nested, vllm_key


def default_captured(
    engine: str, num_layers: int, target_class: str = "llama", sglang_version: str | None = None
) -> list[int]:
    """The layers `engine` captures from a config without ids (`default_layers_captured`);
    ConventionError naming the engine's reason when it serves no EAGLE-3 drafter on the class
    (a rule's `refuse`), so a missing key never reads as a deployment that would work."""
    rules = _rules(engine, target_class, sglang_version)
    if rules and all(rule.refuse is not None for rule in rules):
        raise ConventionError(rules[0].refuse)
    return default_layers_captured(num_layers)


def captured_by(
    config: dict,
    engine: str,
    num_layers: int,
    target_class: str = "llama",
    sglang_version: str | None = None,
) -> list[int]:
    """The specdraft indices `engine` captures from a draft config.json dict, reading only the key
    that engine reads (SGLang: eagle_config's; vLLM and speculators: top-level, else eagle_config's),
    its default when absent. Raises ConventionError when it cannot read the ids it finds."""
    nested, vllm_ids, _ = _keys(config)
    ids = nested if engine == "sglang" else vllm_ids
    if not ids:
        return default_captured(engine, num_layers, target_class, sglang_version)
    return from_engine_ids(ids, engine, num_layers, target_class, sglang_version)


def aux_layers_from_config(
    config: dict, num_layers: int, target_class: str = "llama", sglang_version: str | None = None
) -> AuxReading:
    """Read a draft config.json dict as each engine does (DESIGN.md section 2).

    SGLang reads only ``eagle_config.eagle_aux_hidden_state_layer_ids`` and falls back to its
    default only when the key is absent (sglang 0.5.23 model_runner_components/
    spec_aux_hidden_state.py); vLLM reads the top-level key, then the nested one, as-is,
    skipping empty lists (gpu_model_runner.py). Raises ConventionError when an engine cannot
    read the ids it finds (an empty nested list makes SGLang capture nothing) or, without ids,
    serves no EAGLE-3 drafter on the class (`default_captured`).
    """
    nested, vllm_ids, vllm_key = _keys(config)

    def read(ids, engine):
        return (
            from_engine_ids(ids, engine, num_layers, target_class, sglang_version) if ids else None
        )

    for ids, engine in ((nested, "sglang"), (vllm_ids, "vllm")):
        if not ids:  # the engine's default: refused where it serves no EAGLE-3 drafter on the class
            default_captured(engine, num_layers, target_class, sglang_version)
    return AuxReading(
        read(nested, "sglang"),
        read(vllm_ids, "vllm"),
        default_layers_captured(num_layers),
        vllm_key,
    )


def lint_sglang_ids(ids) -> list[str]:
    """Problems with an explicit SGLang id list (FC-03); empty when none."""
    ids = list(ids or [])
    if not ids or ids[0] == 1:
        return []
    return [
        f"SGLang aux ids {ids} start with {ids[0]}, not 1: SGLang >= 0.5.13 reads such a "
        "list as-is on DeepSeek-class targets while older versions and Llama/Qwen classes "
        "add 1, so it captures different layers by version; write ids whose first is 1 "
        "(specdraft index 2) or pin the SGLang version"
    ]


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
