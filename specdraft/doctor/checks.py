"""The doctor's checks in the order they run, and the field cases each catches.

One function per verification rule, each named for what it verifies (`verdict.Result`):
- `audit.py`: the checkpoint's own files (target identity, tensor names, shapes, vocab map);
- `lint.py`: the config as each engine reads it; `norms.py`: the norms the engine applies
  against training's (the method, EAGLE-3.1's fc_norm + norm_output); `launch.py`: the serving
  command line;
  `rope.py`: the rope the engines build;
- `parity.py`: serving feeds what training did (tokenizer, chat template, aux width);
- `acceptance.py`: acceptance offline, per chain step and on a live server.
`CASES` maps every field case id (shared/cases) to the checks that catch it; `specdraft export`
covers S1, S3, FC-01 and FC-03 as well (`EXPORT_CASES`).
"""

from __future__ import annotations

from specdraft.doctor.acceptance import offline_acceptance_matches_training, online_acceptance
from specdraft.doctor.audit import (
    keys_match_engine,
    shapes_and_dtypes,
    specdraft_loads,
    target_matches_training,
    values_finite,
    verifier_is_target,
    vocab_map_valid,
)
from specdraft.doctor.depth import draft_depth_pays_off
from specdraft.doctor.launch import (
    algorithm_is_eagle3,
    launch_names_these_models,
    speculative_settings_valid,
)
from specdraft.doctor.lint import (
    aux_ids_read_alike,
    draft_vocab_size_declared,
    embedding_and_head_as_trained,
    engine_captures_training_layers,
    fc_width_matches_aux,
    lm_head_untied,
    variant_flags_implemented,
)
from specdraft.doctor.norms import norms_as_trained
from specdraft.doctor.parity import (
    aux_width_on_target,
    chat_template_matches_manifest,
    tokenizer_matches_manifest,
)
from specdraft.doctor.rope import rope_matches_training

CHECKS = (
    target_matches_training,
    verifier_is_target,
    specdraft_loads,
    keys_match_engine,
    shapes_and_dtypes,
    values_finite,
    vocab_map_valid,
    fc_width_matches_aux,
    aux_ids_read_alike,
    engine_captures_training_layers,
    algorithm_is_eagle3,
    launch_names_these_models,
    speculative_settings_valid,
    variant_flags_implemented,
    norms_as_trained,
    draft_vocab_size_declared,
    lm_head_untied,
    embedding_and_head_as_trained,
    rope_matches_training,
    tokenizer_matches_manifest,
    chat_template_matches_manifest,
    aux_width_on_target,
    offline_acceptance_matches_training,
    draft_depth_pays_off,
    online_acceptance,
)

# Field case id (shared/cases/README.md) -> the checks that catch it.
CASES = {
    "S1": ["keys_match_engine", "specdraft_loads", "offline_acceptance_matches_training"],
    "S2": ["aux_width_on_target", "fc_width_matches_aux"],
    "S3": ["engine_captures_training_layers", "offline_acceptance_matches_training"],
    "S4": ["speculative_settings_valid"],
    "S5": ["draft_depth_pays_off"],
    "S6": ["offline_acceptance_matches_training", "online_acceptance"],
    "FC-01": ["specdraft_loads", "keys_match_engine", "shapes_and_dtypes"],
    "FC-02": [
        "vocab_map_valid",
        "draft_vocab_size_declared",
        "offline_acceptance_matches_training",
    ],
    "FC-03": ["aux_ids_read_alike", "engine_captures_training_layers"],
    "FC-06": ["algorithm_is_eagle3", "fc_width_matches_aux", "speculative_settings_valid"],
    "FC-08": ["tokenizer_matches_manifest", "chat_template_matches_manifest"],
    "FC-09": ["rope_matches_training", "offline_acceptance_matches_training"],
}
# Cases `specdraft export` also covers (refuses, or writes the engine's names / ids).
EXPORT_CASES = {
    "S1": "writes midlayer.* for SGLang",
    "S3": "refuses layers an engine cannot capture",
    "FC-01": "proves every tensor bit-identical",
    "FC-03": "writes each engine's own ids",
}
