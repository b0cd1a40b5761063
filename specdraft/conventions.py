"""Conventions every stage shares: aux hidden-state layers and dtype names (the draft
vocabulary map: `specdraft.data.vocab`).

Aux layers are named by *specdraft index* (= transformers ``hidden_states`` index): 0 = the
embedding output, k in 1..L-1 = output of decoder layer k (1-based), L = output of the last
decoder layer *before* the final norm. Engines write other ids; how each one reads them lives
in ``ENGINE_RULES``, one row per (engine, target class, SGLang version range), with the source
it was read from. Re-check the rows when bumping an engine.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

import torch

from specdraft.errors import SpecdraftError

ENGINES = ("sglang", "vllm", "speculators")
# The engines' rule classes (`specdraft.target.target_class_of` maps a transformers class to one):
# llama: Llama/Qwen2/Qwen3/Mistral/Phi-3; deepseek: DeepSeek-V2/V3 and Kimi-K2.5's wrapper;
# llava: Llava and Mistral3 wrappers over a Llama-family text model; the rest one class each.
_CLASS_NAMES = {"llama": "Llama", "deepseek": "DeepSeek", "qwen3_moe": "Qwen3-MoE", "gpt_oss": "GPT-OSS",
                "gemma2": "Gemma 2", "gemma3": "Gemma 3", "llama4": "Llama 4", "qwen2_vl": "Qwen2-VL",
                "llava": "Llava/Mistral3"}
TARGET_CLASSES = tuple(_CLASS_NAMES)
AUX_KEY = "eagle_aux_hidden_state_layer_ids"
# Aux states an engine's fc takes (fc input = 3 x target hidden). SGLang >= 0.5.12 sizes fc from
# len(eagle_config ids) (read in its llama_eagle3.py); 3 stays the contract both engines accept.
NUM_AUX_FIXED = {"sglang": 3, "vllm": 3}


# The one dtype table: the names capture, train, export and the CLI take.
DTYPES = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float16": torch.float16,
          "fp16": torch.float16, "float32": torch.float32, "fp32": torch.float32}


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


@dataclass(frozen=True)
class EngineRule:
    """How one engine reads explicit aux ids for one target class (and SGLang version range).

    offset: "plus1" (id k = index k+1), "as_is" (id k = index k), "plus1_if_first_is_1" or
    "plus1_unless_last_is_L" (ids as-is when the largest is L, else +1).
    Capturable specdraft indices are lowest..L-top. Versions are [since, until); None = open.
    refuse: why the engine serves no EAGLE-3 drafter on this class (every list is refused), or None.
    """

    engine: str
    target_class: str
    offset: str
    lowest: int
    top: int
    since: tuple[int, ...] | None
    until: tuple[int, ...] | None
    source: str
    evidence: str
    refuse: str | None = None


_VLLM_LLAMA = (
    "vllm model_executor/models/llama.py + interfaces.py EagleModelMixin",
    "EagleModelMixin (vLLM PR #36063, merged 2026-03-04): id 0 = embeddings, id k = hidden + "
    "residual after layer k, so id L = last output before the norm; earlier vLLM read id k "
    "before layer k (0 and L not capturable). Read from stored source; release not pinned.",
)
_VLLM_DEEPSEEK = (
    "vllm 0.32.0 model_executor/models/deepseek_v2.py (kimi_k25.py delegates to it)",
    "read 0.32.0 wheel: captures hidden + residual before layer k (id k = index k); id 0 fails "
    "(residual is None before the first layer); id L is appended after the loop when end_layer is "
    "in aux_hidden_state_layers (hidden + residual, before the norm). Ids sorted, de-duplicated "
    "(interfaces.py EagleModelMixin). In fp16 the residual stream is scaled by "
    "1 / routed_scaling_factor, so fp16 aux values differ from transformers'.",
)


def _vllm_mixin(file: str) -> tuple[str, str]:
    return (f"vllm 0.32.0 model_executor/models/{file}",
            "read 0.32.0 wheel: EagleModelMixin._maybe_add_hidden_state before the first layer "
            "(id 0 = embeddings) and after layer k (id k), so id L = last output before the norm.")


def _vllm_refuses(cls: str, file: str) -> dict:
    return {"source": f"vllm 0.32.0 model_executor/models/{file}",
            "evidence": "read 0.32.0 wheel: the class does not implement SupportsEagle3",
            "refuse": f"vLLM 0.32.0 serves no EAGLE-3 drafter on {cls} ({file}: no SupportsEagle3)"}


def _sglang_refuses(cls: str, file: str, why: str = "does not implement set_eagle3_layers_to_capture") -> dict:
    return {"source": f"sglang 0.5.23 srt/models/{file}",
            "evidence": "read 0.5.23 wheel (model_runner_components/attention_backend_setup.py raises "
                        "for a model without set_eagle3_layers_to_capture); older versions not read",
            "refuse": f"SGLang 0.5.23 serves no EAGLE-3 drafter on {cls}: {file} {why}"}


_SGLANG_BOUNDARY = ("read 0.5.23 wheel only: [id + 1]; the marked layer captures its input at the layer "
                    "boundary (the embeddings when no residual exists yet, layers/layer_boundary/"
                    "stage.py); nothing after the last layer (index L never captured)")
_GEMMA3_SGLANG_WHY = ("appends the layer's hidden_states, which for layers >= 1 is the MLP branch after "
                      "post_feedforward_layernorm with the residual add deferred to the next layer: not "
                      "the residual stream specdraft trains on (index 0 alone matches: the embeddings "
                      "scaled by sqrt(H) in Gemma3TextScaledWordEmbedding, as transformers' embed_tokens)")
_SPECULATORS = (
    "speculators config.json top-level key, served by vLLM "
    "(vllm transformers_utils/configs/speculators/algos.py update_eagle3, PR #25961)",
    "copied as-is into vLLM's config, so read as vLLM reads it; speculators' trainer unread.",
)
# Fields: engine, target_class, offset, lowest, top, since, until, source, evidence.
ENGINE_RULES: tuple[EngineRule, ...] = (
    EngineRule(
        "sglang", "llama", "plus1", 1, 1, None, (0, 5, 22),
        "sglang srt/models/llama.py (qwen2.py, qwen3.py alike; mistral.py reuses Llama)",
        "read 0.5.12-0.5.21 wheels (older: same +1 in stored source): layers_to_capture = "
        "[id + 1]; hidden + residual is taken "
        "before layer i, residual is None before layer 0 (id -1 raises) and the loop ends "
        "before the final norm (index L never captured); no ids -> [2, L//2, L-3], no +1.",
    ),
    EngineRule(
        "sglang", "llama", "plus1", 0, 1, (0, 5, 22), None,
        "sglang srt/models/llama.py + srt/layers/layer_boundary/stage.py",
        "read 0.5.22/0.5.23 wheels: +1 kept; _prepare_attention captures the bare embeddings "
        "when no residual exists yet (id -1 works; read, not run); index L still not captured.",
    ),
    EngineRule(
        "sglang", "deepseek", "plus1", 1, 1, None, (0, 5, 13),
        "sglang srt/models/deepseek_v2.py",
        "read 0.5.12/0.5.12.post1 wheels: [id + 1], hidden + residual before layer i.",
    ),
    EngineRule(
        "sglang", "deepseek", "plus1_if_first_is_1", 1, 1, (0, 5, 13), (0, 5, 14),
        "sglang srt/models/deepseek_v2.py",
        "read 0.5.13 wheel: +1 only when layer_ids[0] == 1, else as-is (PR #25454, merged "
        "2026-05-18; absent from 0.5.12.post1); capture still fails before layer 0.",
    ),
    EngineRule(
        "sglang", "deepseek", "plus1_if_first_is_1", 0, 1, (0, 5, 14), None,
        "sglang srt/models/deepseek_v2.py + srt/layers/communicator.py",
        "read 0.5.14/0.5.17/0.5.23 wheels: first-id rule kept; captures the residual after "
        "prepare_attn, which is the embeddings before layer 0 (read, not run).",
    ),
    EngineRule("sglang", "qwen3_moe", "plus1", 0, 1, (0, 5, 23), None,
               "sglang srt/models/qwen3_moe.py + qwen2_moe.py Qwen2MoeModel", _SGLANG_BOUNDARY),
    EngineRule("sglang", "llama4", "plus1", 0, 1, (0, 5, 23), None,
               "sglang srt/models/llama4.py (set_eagle3_layers_to_capture from llama.py)", _SGLANG_BOUNDARY),
    EngineRule("sglang", "gpt_oss", "plus1_unless_last_is_L", 0, 0, (0, 5, 23), None,
               "sglang srt/models/gpt_oss.py",
               "read 0.5.23 wheel only: ids kept as-is when max(ids) == L, else [id + 1]; boundary 0 "
               "is the embedding output, boundary k the output of block k, boundary L captured by "
               "the final norm (before it)."),
    EngineRule("sglang", "gemma2", "as_is", 0, 0, None, None,
               **_sglang_refuses("Gemma 2 (Gemma2ForCausalLM)", "gemma2.py")),
    EngineRule("sglang", "gemma3", "plus1", 0, 1, None, None,
               **_sglang_refuses("Gemma 3 (Gemma3ForCausalLM)", "gemma3_causal.py", _GEMMA3_SGLANG_WHY)),
    EngineRule("sglang", "qwen2_vl", "as_is", 0, 0, None, None,
               **_sglang_refuses("Qwen2-VL (Qwen2VLForConditionalGeneration)", "qwen2_vl.py")),
    EngineRule("sglang", "llava", "as_is", 0, 0, None, None,
               **_sglang_refuses("Llava / Mistral3 (LlavaForConditionalGeneration, "
                                 "Mistral3ForConditionalGeneration in mistral.py)", "llava.py")),
    EngineRule("vllm", "llama", "as_is", 0, 0, None, None, *_VLLM_LLAMA),
    EngineRule("vllm", "deepseek", "as_is", 1, 0, None, None, *_VLLM_DEEPSEEK),
    EngineRule("vllm", "qwen3_moe", "as_is", 0, 0, None, None, *_vllm_mixin("qwen3_moe.py")),
    EngineRule("vllm", "gpt_oss", "as_is", 0, 0, None, None, *_vllm_mixin("gpt_oss.py")),
    EngineRule("vllm", "llama4", "as_is", 0, 0, None, None,
               *_vllm_mixin("llama4.py (Llama4ForCausalLM(LlamaForCausalLM), Llama4Model keeps "
                            "LlamaModel.forward)")),
    EngineRule("vllm", "llava", "as_is", 0, 0, None, None,
               *_vllm_mixin("llava.py, mistral3.py (SupportsEagle3, delegating to the language model)")),
    EngineRule("vllm", "gemma2", "as_is", 0, 0, None, None, **_vllm_refuses("Gemma 2", "gemma2.py")),
    EngineRule("vllm", "gemma3", "as_is", 0, 0, None, None, **_vllm_refuses("Gemma 3", "gemma3.py")),
    EngineRule("vllm", "qwen2_vl", "as_is", 0, 0, None, None, **_vllm_refuses("Qwen2-VL", "qwen2_vl.py")),
)
# speculators files are served by vLLM: each of its rows is vLLM's, read through the speculators key.
ENGINE_RULES += tuple(dataclasses.replace(rule, engine="speculators", source=f"{rule.source}; {_SPECULATORS[0]}")
                      for rule in ENGINE_RULES if rule.engine == "vllm")


# The config keys that hold aux ids -> the engine whose convention they are written in (the
# official EAGLE-3 config nests SGLang's ids; vLLM's are top-level). SGLang reads only
# eagle_config; vLLM reads top-level, else eagle_config as-is (`aux_layers_from_config`), so a
# file with only eagle_config ids is misread by vLLM unless both conventions agree (FC-03).
AUX_ID_KEYS = {"top-level": "vllm", "eagle_config": "sglang"}
_ENGINE_NAMES = {"sglang": "SGLang", "vllm": "vLLM", "speculators": "speculators"}


def _parse_version(version: str) -> tuple[int, ...]:
    match = re.match(r"v?(\d+)\.(\d+)(?:\.(\d+))?", str(version))
    if match is None:
        raise ConventionError(f"cannot parse SGLang version {version!r}; write e.g. '0.5.13'")
    return tuple(int(part or 0) for part in match.groups())


def _version_label(rule: EngineRule) -> str:
    name = _ENGINE_NAMES[rule.engine]
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
        v = _parse_version(sglang_version)
        read = ", ".join(_version_label(r) for r in rules)
        rules = [r for r in rules
                 if (r.since is None or v >= r.since) and (r.until is None or v < r.until)]
        if not rules:
            raise ConventionError(f"SGLang {sglang_version}'s {_CLASS_NAMES[target_class]} model file was "
                                  f"not read (rules: {read}); serve a version the table covers")
    return rules


def _index_problem(rule: EngineRule, index: int, num_layers: int, engine_id: int) -> str | None:
    where = f"{_CLASS_NAMES[rule.target_class]}-class targets in {_version_label(rule)}"
    if rule.refuse is not None:
        return rule.refuse
    if not 0 <= index <= num_layers:
        return f"id {engine_id} names index {index}, outside 0..{num_layers}"
    if index < rule.lowest:
        return f"id {engine_id} (embeddings) is not capturable on {where}"
    if index > num_layers - rule.top:
        return (f"index {index} (last layer's output, before the final norm) is not capturable "
                f"on {where}: its capture loop ends before the final norm")
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
        raise ConventionError(f"index 1 cannot be the first aux layer on DeepSeek-class targets "
                              f"in {_version_label(rule)}: first id 1 reads as index 2, 0 as 0")
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
        raise ConventionError(f"{engine} hard-codes {count} aux states (fc input = {count} x "
                              f"target hidden size); got {len(values)} {what}: {values}")
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
        raise ConventionError(f"{errors[0]}{hint}")
    if len({tuple(out) for _, out in results}) > 1:
        readings = ", ".join(f"{_version_label(r)}: {out}" for r, out in results)
        raise ConventionError(f"{what} are read differently by SGLang version on "
                              f"{_CLASS_NAMES[target_class]}-class targets ({readings}); "
                              "pass --sglang-version")
    return list(results[0][1])


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
        raise ValueError(f"--aux-layers {','.join(map(str, aux_layers))}: {e}; give 3 increasing "
                         f"layers in 0..{num_layers}, e.g. {example}") from None


def to_engine_ids(layers, engine: str, num_layers: int, target_class: str = "llama",
                  sglang_version: str | None = None) -> list[int]:
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


def from_engine_ids(ids, engine: str, num_layers: int, target_class: str = "llama",
                    sglang_version: str | None = None) -> list[int]:
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
        return [f"read differently by the two engines: SGLang captures {sglang}, vLLM {vllm} "
                "(specdraft indices); write the top-level "
                f"{AUX_KEY} in vLLM's convention and eagle_config.{AUX_KEY} in SGLang's"]

    def misread(self, engine: str) -> list[str]:
        """FC-03: `engine` reads a key written in another engine's convention (`AUX_ID_KEYS`)
        in its own, so it captures other layers than the ids mean; empty when it does not."""
        key = self.vllm_key if engine in ("vllm", "speculators") else "eagle_config"
        owner = AUX_ID_KEYS.get(key)
        if key is None or owner is None or owner == engine or self.captured(owner) == self.captured(engine):
            return []
        return [f"{_ENGINE_NAMES[engine]} reads the {key} ids, which are in {_ENGINE_NAMES[owner]}'s "
                f"convention, in its own: it captures {self.captured(engine)}, not the "
                f"{self.captured(owner)} they mean (specdraft indices); write the top-level {AUX_KEY} "
                f"in vLLM's convention"]


def _keys(config: dict) -> tuple[list | None, list | None, str | None]:
    """(nested ids, the ids vLLM reads, the key vLLM took them from) of a draft config.json."""
    eagle_config = config.get("eagle_config")
    nested = eagle_config.get(AUX_KEY) if isinstance(eagle_config, dict) else None
    if nested is not None and len(nested) == 0:
        raise ConventionError(f"eagle_config.{AUX_KEY} is empty: SGLang captures no aux states; "
                              "drop the key for the default or write the ids")
    vllm_key = "top-level" if config.get(AUX_KEY) else "eagle_config" if nested else None
    return nested, config.get(AUX_KEY) or nested, vllm_key


def captured_by(config: dict, engine: str, num_layers: int, target_class: str = "llama",
                sglang_version: str | None = None) -> list[int]:
    """The specdraft indices `engine` captures from a draft config.json dict, reading only the key
    that engine reads (SGLang: eagle_config's; vLLM and speculators: top-level, else eagle_config's),
    its default when absent. Raises ConventionError when it cannot read the ids it finds."""
    nested, vllm_ids, _ = _keys(config)
    ids = nested if engine == "sglang" else vllm_ids
    if not ids:
        return default_layers_captured(num_layers)
    return from_engine_ids(ids, engine, num_layers, target_class, sglang_version)


def aux_layers_from_config(config: dict, num_layers: int, target_class: str = "llama",
                           sglang_version: str | None = None) -> AuxReading:
    """Read a draft config.json dict as each engine does (DESIGN.md section 2).

    SGLang reads only ``eagle_config.eagle_aux_hidden_state_layer_ids`` and falls back to its
    default only when the key is absent (sglang 0.5.23 model_runner_components/
    spec_aux_hidden_state.py); vLLM reads the top-level key, then the nested one, as-is,
    skipping empty lists (gpu_model_runner.py). Raises ConventionError when an engine cannot
    read the ids it finds (an empty nested list makes SGLang capture nothing).
    """
    nested, vllm_ids, vllm_key = _keys(config)
    read = lambda ids, engine: None if not ids else from_engine_ids(  # noqa: E731
        ids, engine, num_layers, target_class, sglang_version)
    return AuxReading(read(nested, "sglang"), read(vllm_ids, "vllm"),
                      default_layers_captured(num_layers), vllm_key)


def lint_sglang_ids(ids) -> list[str]:
    """Problems with an explicit SGLang id list (FC-03); empty when none."""
    ids = list(ids or [])
    if not ids or ids[0] == 1:
        return []
    return [f"SGLang aux ids {ids} start with {ids[0]}, not 1: SGLang >= 0.5.13 reads such a "
            "list as-is on DeepSeek-class targets while older versions and Llama/Qwen classes "
            "add 1, so it captures different layers by version; write ids whose first is 1 "
            "(specdraft index 2) or pin the SGLang version"]

