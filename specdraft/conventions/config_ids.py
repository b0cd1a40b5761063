"""A draft config.json's aux ids as each engine reads them (DESIGN.md section 2, FC-03): SGLang
the nested eagle_config ids, vLLM the top-level ones, else the nested as-is; the engine's
default when there are none."""

from __future__ import annotations

from dataclasses import dataclass

from specdraft.conventions.defaults import default_layers_captured
from specdraft.conventions.ids import (
    AUX_KEY,
    ENGINE_NAMES,
    ConventionError,
    class_label,
    from_engine_ids,
    rules_for,
)

# The config keys that hold aux ids -> the engine whose convention they are written in (the
# official EAGLE-3 config nests SGLang's ids; vLLM's are top-level). SGLang reads only
# eagle_config; vLLM reads top-level, else eagle_config as-is (`aux_layers_from_config`), so a
# file with only eagle_config ids is misread by vLLM unless both conventions agree (FC-03).
AUX_ID_KEYS = {"top-level": "vllm", "eagle_config": "sglang"}


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
    rules = rules_for(engine, target_class, sglang_version)
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


def lint_sglang_ids(ids, target_class: str) -> list[str]:
    """Problems with an explicit SGLang id list on a `target_class` target (FC-03): a first id
    other than 1 where SGLang's rows of the class read a list by its first id (offset
    "plus1_if_first_is_1", read from DeepSeek's model file only), so that versions read it
    differently; empty when none, and for every class whose SGLang rows add 1 whatever the list."""
    ids = list(ids or [])
    by_first = [
        r for r in rules_for("sglang", target_class, None) if r.offset == "plus1_if_first_is_1"
    ]
    if not ids or ids[0] == 1 or not by_first:
        return []
    since = ".".join(map(str, by_first[0].since or ()))
    return [
        f"SGLang aux ids {ids} start with {ids[0]}, not 1: SGLang >= {since} reads such a "
        f"list as-is on {class_label(target_class)}-class targets while older versions add 1, "
        "so it captures different layers by version; write ids whose first is 1 "
        "(specdraft index 2) or pin the SGLang version"
    ]
