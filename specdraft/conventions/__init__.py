"""Conventions every stage shares: aux hidden-state layers and dtype names (the draft
vocabulary map: `specdraft.data.vocab`). The names other modules import from
`specdraft.conventions` are listed in `__all__`; the modules (DESIGN.md §7):

- `ids`: specdraft indices and engine ids, written and read by the rules; ConventionError;
- `defaults`: specdraft's default aux layers and what each engine captures without ids;
- `config_ids`: a draft config.json's ids as each engine reads them (FC-03);
- `options`: a user's --aux-layers, checked or read in the convention it names;
- `dtypes`: the dtype names every command takes;
- `rules`: how each engine numbers and captures aux layers (ENGINE_RULES, with sources);
- `engines`: what each engine loads, computes and returns.

Aux layers are named by *specdraft index* (= transformers ``hidden_states`` index): 0 = the
embedding output, k in 1..L-1 = output of decoder layer k (1-based), L = output of the last
decoder layer *before* the final norm. Engines write other ids; how each one reads them lives
in ``ENGINE_RULES``, one row per (engine, target class, SGLang version range), with the source
it was read from. Re-check the rows when bumping an engine.
"""

from __future__ import annotations

from specdraft.conventions.config_ids import (
    AUX_ID_KEYS,
    AuxReading,
    aux_layers_from_config,
    captured_by,
    default_captured,
    lint_sglang_ids,
)
from specdraft.conventions.defaults import (
    ENGINE_DEFAULT_SOURCES,
    default_aux_layers,
    default_layers_captured,
    engine_default_ids,
    engines_default_layers,
)
from specdraft.conventions.dtypes import DTYPES, UnknownDtype, parse_dtype
from specdraft.conventions.ids import (
    AUX_KEY,
    ENGINE_NAMES,
    ENGINES,
    NUM_AUX_FIXED,
    TARGET_CLASSES,
    ConventionError,
    capture_ids,
    check_aux_layers,
    from_engine_ids,
    misreadings,
    parse_version,
    to_engine_ids,
    unknown_class_text,
    version_label,
)
from specdraft.conventions.options import (
    AUX_CONVENTIONS,
    check_aux_flag,
    layers_of_option,
    split_aux_option,
)

__all__ = [
    "AUX_CONVENTIONS",
    "AUX_ID_KEYS",
    "AUX_KEY",
    "DTYPES",
    "ENGINES",
    "ENGINE_DEFAULT_SOURCES",
    "ENGINE_NAMES",
    "NUM_AUX_FIXED",
    "TARGET_CLASSES",
    "AuxReading",
    "ConventionError",
    "UnknownDtype",
    "aux_layers_from_config",
    "capture_ids",
    "captured_by",
    "check_aux_flag",
    "check_aux_layers",
    "default_aux_layers",
    "default_captured",
    "default_layers_captured",
    "engine_default_ids",
    "engines_default_layers",
    "from_engine_ids",
    "misreadings",
    "layers_of_option",
    "lint_sglang_ids",
    "parse_dtype",
    "parse_version",
    "split_aux_option",
    "to_engine_ids",
    "unknown_class_text",
    "version_label",
]
