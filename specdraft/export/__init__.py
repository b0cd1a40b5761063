"""Export a trained drafter for one serving engine: layout, config rules, refusals, launch command.

`export = convert + one engine's config rules + refusals + launch command` (DESIGN.md §2):
- sglang: the official layout (`midlayer.*`); SGLang reads only the nested
  `eagle_config.eagle_aux_hidden_state_layer_ids`, in its convention (id k = index k+1).
- vllm: the official layout (vLLM renames `midlayer.` to `layers.0.`); the top-level ids, as-is.
- speculators: `layers.0.*` with a speculators config (served by vLLM) whose
  `verifier.name_or_path` must resolve on the serving host.
Each config gets both id keys when both engines can express the layers (one file serves both),
`draft_vocab_size`, `norm_before_residual` and the EAGLE-3.1 norm flags the drafter sets,
`tie_word_embeddings: false` and the drafter's rope/max positions (taken from the target at
training); a flag the engine does not implement is refused (`refusals.check_norm_flags`). The
manifest is written alongside. An engine that would read the files differently from training is refused with the
reason. After writing, every tensor is re-read and proven bit-identical under its new name.
The source is a drafter directory (any layout) or a training checkpoint that `train
--save-every` wrote (RUN/checkpoints/step-N.pt, or a step-N directory from several ranks).

The package's modules: `target_facts` (what is known of the target, and from where),
`refusals` (ExportError and each rule an export is refused by), `notes` (what the export tells
the user), `run` (`export_draft`: read, check, write, prove; the launch command), `found`
(where exports are written, and an export of a drafter already on disk).
"""

from __future__ import annotations

from specdraft.export.found import existing_export, export_dir_beside_run, suggested_export_dir
from specdraft.export.refusals import ExportError, spec_for_export
from specdraft.export.run import EXPORT_ENGINES, ExportResult, export_draft, launch_command
from specdraft.export.target_facts import TargetFacts

__all__ = [
    "EXPORT_ENGINES",
    "ExportError",
    "ExportResult",
    "TargetFacts",
    "existing_export",
    "export_dir_beside_run",
    "export_draft",
    "launch_command",
    "spec_for_export",
    "suggested_export_dir",
]
