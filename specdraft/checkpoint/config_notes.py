"""What specdraft's reading of a drafter's config.json means for the engines, in one line each:
values an engine reads otherwise than specdraft (`reading_notes`: vLLM's architecture name, a
tied head, no draft_vocab_size, keys no engine reads), and the values a written config.json
(export, convert) gives otherwise than its source (`changed_values_note`). The facts are
`conventions.config_reads`'.
"""

from __future__ import annotations

import json
from typing import Any

from specdraft.checkpoint.config_keys import ignored_keys_note
from specdraft.checkpoint.layouts import OFFICIAL_ARCHITECTURES, READ_ARCHITECTURES
from specdraft.conventions import AUX_KEY
from specdraft.conventions.config_reads import (
    ABSENT_DRAFT_VOCAB_READ,
    ARCHITECTURE_READ,
    TIED_HEAD_READ,
    TRAINER_ARCHITECTURE,
)
from specdraft.conventions.engines import PLAIN_DRAFT_ARCHITECTURE_READ

# Keys a written config.json may hold otherwise than its source without changing what an engine
# computes: the aux ids (export and convert write each engine's convention and say so) and
# the layout's own records.
RECORD_KEYS = (
    AUX_KEY,
    "eagle_config",
    "speculators_config",
    "speculators_version",
    "speculators_model_type",
    "transformer_layer_config",
    "transformers_version",
    "_name_or_path",
)


def _layer(config: dict[str, Any]) -> dict[str, Any]:
    layer = config.get("transformer_layer_config")
    return layer if isinstance(layer, dict) else config


def reading_notes(config: dict[str, Any]) -> list[str]:
    """One line for each value of a manifest-less drafter's config.json that an engine reads
    otherwise than specdraft, or that no engine reads (`config_keys.ignored_keys_note`), naming
    what each engine does and what export / convert write."""
    notes = []
    architectures = config.get("architectures") or []
    official = OFFICIAL_ARCHITECTURES[0]
    vllm_names = [a for a in architectures if a in READ_ARCHITECTURES and a != official]
    if vllm_names and official not in architectures:
        notes.append(
            f"architectures {architectures}, vLLM's name of the Llama EAGLE-3 drafter: read as "
            f"{official} ({ARCHITECTURE_READ}); export and convert write {official}"
        )
    if architectures == [TRAINER_ARCHITECTURE]:
        notes.append(
            f"architectures {architectures}, the official EAGLE-3 trainer's: read as {official}, "
            f"as vLLM reads it; {PLAIN_DRAFT_ARCHITECTURE_READ}: serve it on SGLang only as "
            f"exported (export and convert write {official})"
        )
    if _layer(config).get("tie_word_embeddings") is True:
        notes.append(f"tie_word_embeddings true: {TIED_HEAD_READ}; export and convert write false")
    if "speculators_model_type" not in config and _layer(config).get("draft_vocab_size") is None:
        notes.append(
            f"config.json has no draft_vocab_size: {ABSENT_DRAFT_VOCAB_READ}; export and convert "
            "write it"
        )
    ignored = ignored_keys_note(config)
    return notes + ([ignored] if ignored else [])


def changed_values_note(source: dict[str, Any], written: dict[str, Any]) -> str | None:
    """The one line naming each value `written` (a config.json export or convert wrote) gives
    otherwise than its `source`, both read as the engines read them (a speculators layer config
    and the top level as one), "key old -> new"; a draft_vocab_size the source lacks is named
    too (SGLang then ran the target's head). The architecture between two layouts, and the keys
    of RECORD_KEYS, are left out. None when nothing changed."""
    old, new = {**_layer(source), **source}, {**_layer(written), **written}
    skip = set(RECORD_KEYS) | (
        {"architectures"}
        if ("speculators_model_type" in source) != ("speculators_model_type" in written)
        else set()
    )
    changed = [
        f"{k} {_shown(old[k])} -> {_shown(new[k])}"
        for k in new
        if k in old and k not in skip and old[k] != new[k]
    ]
    if "draft_vocab_size" in new and old.get("draft_vocab_size") is None:
        changed.append(f"draft_vocab_size absent -> {new['draft_vocab_size']}")
    if not changed:
        return None
    return f"config.json values written otherwise than the source's: {'; '.join(changed)}"


def _shown(value: Any) -> str:
    return json.dumps(value)
