"""Every drafter on disk: strict load and save of the three layouts, convert, audit, and the
training checkpoints a run writes. The names other modules import from `specdraft.checkpoint`
are listed in `__all__`; the modules (DESIGN.md §7):

- `layouts`: the layouts as tables (file names, key prefixes, the tensors each stores),
  CheckpointError;
- `manifest`: the manifest, and `LoadedDraft`;
- `config_write` / `config_read`: each layout's config.json written, and the DraftConfig read
  back from it; `config_keys`: the keys a config.json may hold, and the flags refused;
- `dirs`: what a directory holds (drafter, target model or other) and the one line naming
  the mix-up; `read_config`, the one reader of a drafter's config.json;
- `weights`: the one reader of a drafter's weight files;
- `load`, `save`, `convert`, `audit`: the drafter read strictly, written atomically,
  rewritten in another layout and proven the same, checked for NaN and its vocabulary map;
- `training`: the training checkpoints under RUN/checkpoints, read here so that loading a
  drafter never imports the trainer.

Loading is strict: unlike every loader in the field, `load` refuses what does not match (S1, FC-01).
"""

from __future__ import annotations

from specdraft.checkpoint.audit import (
    TOKENIZER_FILES,
    all_finite,
    audit,
    check_vocab_map,
    file_sha256,
    tensor_digest,
    tokenizer_length,
    usable_vocab,
    vocab_map_problems,
)
from specdraft.checkpoint.config_keys import (
    FLAGS_FIX,
    UNIMPLEMENTED_FLAGS,
    refuse_unimplemented_flags,
    unimplemented_flags,
)
from specdraft.checkpoint.config_read import (
    aux_layers_note,
    config_from_files,
    owned_embedding_config,
    refuse_other_aux_layers,
)
from specdraft.checkpoint.config_write import official_config, speculators_config
from specdraft.checkpoint.convert import Converted, convert_draft, verify_written
from specdraft.checkpoint.dirs import (
    PROGRESS_FILE,
    DirKind,
    classify_dir,
    has_manifest,
    is_training_checkpoint,
    read_config,
    source_verifier,
    verifier_replaced_note,
    wrong_dir_message,
)
from specdraft.checkpoint.layouts import (
    DRAFTER_CONFIG_FIX,
    LAYER_PREFIX,
    LAYOUTS,
    MANIFEST_FILE,
    MANIFEST_FIX,
    SOURCE_FORMS,
    WEIGHTS_FILE,
    CheckpointError,
    describe_layout,
    state_dict_for_layout,
)
from specdraft.checkpoint.load import (
    build_draft,
    derived_tensors,
    detect_layout,
    draft_tensors,
    load_draft,
    read_draft_config,
)
from specdraft.checkpoint.manifest import LoadedDraft, Manifest
from specdraft.checkpoint.save import check_output_dir, save_draft
from specdraft.checkpoint.training import (
    CHECKPOINT_DIR,
    checkpoint_paths,
    load_training_checkpoint,
    read_sharded,
)
from specdraft.checkpoint.weights import (
    WEIGHT_FILES,
    WeightFiles,
    check_weight_headers,
    find_weights,
    open_safetensors,
    read_safetensors,
    read_weights,
    write_safetensors,
)

__all__ = [
    "CHECKPOINT_DIR",
    "SOURCE_FORMS",
    "TOKENIZER_FILES",
    "DRAFTER_CONFIG_FIX",
    "FLAGS_FIX",
    "LAYER_PREFIX",
    "LAYOUTS",
    "MANIFEST_FILE",
    "MANIFEST_FIX",
    "PROGRESS_FILE",
    "UNIMPLEMENTED_FLAGS",
    "WEIGHTS_FILE",
    "WEIGHT_FILES",
    "CheckpointError",
    "Converted",
    "DirKind",
    "LoadedDraft",
    "Manifest",
    "WeightFiles",
    "all_finite",
    "audit",
    "aux_layers_note",
    "build_draft",
    "check_output_dir",
    "check_vocab_map",
    "check_weight_headers",
    "checkpoint_paths",
    "classify_dir",
    "config_from_files",
    "convert_draft",
    "derived_tensors",
    "describe_layout",
    "detect_layout",
    "draft_tensors",
    "file_sha256",
    "find_weights",
    "has_manifest",
    "is_training_checkpoint",
    "load_draft",
    "load_training_checkpoint",
    "official_config",
    "open_safetensors",
    "owned_embedding_config",
    "read_config",
    "read_draft_config",
    "read_safetensors",
    "read_sharded",
    "read_weights",
    "refuse_other_aux_layers",
    "refuse_unimplemented_flags",
    "save_draft",
    "source_verifier",
    "speculators_config",
    "state_dict_for_layout",
    "tensor_digest",
    "tokenizer_length",
    "unimplemented_flags",
    "usable_vocab",
    "verifier_replaced_note",
    "verify_written",
    "vocab_map_problems",
    "write_safetensors",
    "wrong_dir_message",
]
