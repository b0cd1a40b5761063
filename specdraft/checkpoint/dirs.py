"""What a directory holds, from its config.json alone: a drafter, a target model, or other.

`classify_dir` tells a drafter directory from a target model's; `wrong_dir_message` is the one
line every command prints when given the one for the other (or a capture store, or a run
directory where a drafter is wanted). `is_training_checkpoint` tells a training run's checkpoint
(RUN/checkpoints/step-N.pt, or a sharded step-N directory) from a drafter directory;
`read_config` is the one reader of a drafter's config.json (its errors carry the fix);
`source_verifier` reads a speculators config's verifier and `verifier_replaced_note` is
convert's and export's line when they record another.
"""

from __future__ import annotations

import json
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specdraft.checkpoint.layouts import (
    DRAFTER_CONFIG_FIX,
    MANIFEST_FILE,
    OFFICIAL_ARCHITECTURES,
    READ_ARCHITECTURES,
    CheckpointError,
    InvalidCheckpointFile,
    UnreadableCheckpointFile,
)
from specdraft.conventions.engines import (
    PLAIN_DRAFT_ARCHITECTURE_READ,
    RELEASES_READ,
    engines_serving_architecture,
)
from specdraft.files import unreadable

# Config keys only an EAGLE-3 drafter's config has (a transformers model's has none of them),
# at the top or in a speculators transformer_layer_config.
DRAFTER_CONFIG_KEYS = (
    "speculators_model_type",
    "draft_vocab_size",
    "target_hidden_size",
    "eagle_config",
    "eagle_aux_hidden_state_layer_ids",
)
PROGRESS_FILE = "trainer.pt"  # inside a sharded checkpoint directory: the trainer's progress state
DRAFTER_DIRS = "pass the drafter directory (specdraft train's OUT/draft or an export)"


@dataclass(frozen=True)
class DirKind:
    """What a directory holds, judged from its config.json (and manifest) alone.

    kind: "drafter" (an EAGLE-3 draft model), "target" (a transformers model) or "other" (no or
    unreadable config.json, or one that is neither). evidence: what decided it, e.g. "its
    config.json says architectures ['LlamaForCausalLMEagle3']" or "LlamaForCausalLM, 5 layers".
    trained_for: the target a drafter records (manifest, else speculators verifier), or None.
    """

    kind: str
    evidence: str = ""
    trained_for: str | None = None


def classify_dir(path: str | Path) -> DirKind:
    """Drafter, target model or other, from `path`/config.json (see DirKind); never raises."""
    path = Path(path)
    config = _json_or_none(path / "config.json")
    if not isinstance(config, dict):
        return DirKind("other")
    architectures = config.get("architectures")
    architectures = [str(a) for a in architectures] if isinstance(architectures, list) else []
    evidence = _drafter_evidence(path, config, architectures)
    if evidence:
        return DirKind("drafter", evidence, _recorded_target(path, config))
    if not (architectures or config.get("model_type")):
        return DirKind("other")
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    layers = text.get("num_hidden_layers")
    name = ", ".join(architectures) or f"model_type {config['model_type']}"
    return DirKind("target", name + (f", {layers} layers" if layers else ""))


def _drafter_evidence(path: Path, config: dict[str, Any], architectures: list[str]) -> str:
    """What marks a drafter: an EAGLE-3 architecture, a drafter-only key, a manifest ("" if none)."""
    if set(architectures) & set(READ_ARCHITECTURES):
        return f"its config.json says architectures {architectures}"
    layer = config.get("transformer_layer_config")
    layer = layer if isinstance(layer, dict) else {}
    for key in DRAFTER_CONFIG_KEYS:
        if key in config or key in layer:
            value = config.get(key, layer.get(key))
            return f"its config.json has {key}" + (
                "" if isinstance(value, dict) else f" = {value!r}"
            )
    if any("eagle3" in a.lower() for a in architectures):  # one specdraft does not read
        return f"its config.json says architectures {architectures}"  # (DeepSeekForCausalLMEagle3)
    return f"it holds {MANIFEST_FILE}" if (path / MANIFEST_FILE).is_file() else ""


def read_config(path: Path, fix: str = DRAFTER_CONFIG_FIX) -> dict[str, Any]:
    """config.json of a checkpoint dir; CheckpointError for a missing file, InvalidCheckpointFile
    for bad JSON (or not text) or no JSON object, UnreadableCheckpointFile for one the OS will not read (permissions, a
    directory), then `fix` (the one message every command prints for that file)."""
    file = Path(path) / "config.json"
    if not file.exists():  # a run directory or a store given for its drafter: say what to pass
        raise CheckpointError(
            wrong_dir_message(path, "drafter")
            or f"{file}: missing; a draft checkpoint directory needs config.json"
        )
    try:
        config = json.loads(file.read_text())
    except json.JSONDecodeError as e:
        raise InvalidCheckpointFile(f"{file}: not valid JSON ({e}); {fix}") from e
    except UnicodeDecodeError as e:
        raise InvalidCheckpointFile(f"{file}: not valid JSON ({unreadable(e)}); {fix}") from e
    except OSError as e:
        reason = unreadable(e)
        raise UnreadableCheckpointFile(f"{file}: cannot be read ({reason}); {fix}", reason) from e
    if not isinstance(config, dict):
        raise InvalidCheckpointFile(f"{file}: not a JSON object (a {type(config).__name__}); {fix}")
    return config


def _json_or_none(file: Path) -> Any:
    try:
        return json.loads(file.read_text())
    except (OSError, ValueError):
        return None


def _recorded_target(path: Path, config: dict[str, Any]) -> str | None:
    """The target a drafter names: its manifest's target.name_or_path, else the speculators verifier."""
    manifest = _json_or_none(path / MANIFEST_FILE)
    recorded = (
        (manifest.get("target") or {}).get("name_or_path") if isinstance(manifest, dict) else None
    )
    recorded = recorded or source_verifier(config).get("name_or_path")
    return str(recorded) if recorded else None


def source_verifier(config: dict) -> dict:
    """The speculators `verifier` record of a drafter's config.json ({} when it has none)."""
    spec = config.get("speculators_config")
    verifier = spec.get("verifier") if isinstance(spec, dict) else None
    return verifier if isinstance(verifier, dict) else {}


def verifier_replaced_note(config: dict, written: str | None) -> str | None:
    """convert's and export's one line when the written verifier.name_or_path replaces another
    the source's speculators config names (what `vllm serve DRAFTER` would have loaded); else None."""
    before = source_verifier(config).get("name_or_path")
    if not before or before == written:
        return None
    return (
        f"the source's verifier {before!r} is replaced by {written!r}: `vllm serve` on the written "
        "drafter loads that one as the target"
    )


def plain_architecture_message(path: Path, architectures: list[str]) -> str:
    """The one line for a drafter config (a drafter key) whose architectures name a plain model
    other than the official EAGLE-3 trainer's (read: `load.detect_layout`): what the engines make
    of such a value and the value to write."""
    return (
        f"{path}/config.json: architectures {architectures} names a plain model, not an EAGLE-3 drafter "
        f"({PLAIN_DRAFT_ARCHITECTURE_READ}); if it is one, set "
        f'"architectures": ["{OFFICIAL_ARCHITECTURES[0]}"] in config.json: SGLang, vLLM and '
        "specdraft load that"
    )


def wrong_dir_message(path: str | Path, want: str, given_as: str = "") -> str | None:
    """The one-line refusal when `path` holds a drafter where a target model is wanted
    (want="target"), a target model where a drafter is (want="drafter"), a capture store where
    either is, or a training run directory where a drafter is (naming RUN/draft); None otherwise
    (anything else is left to the loader). given_as: the option it came in, e.g. "--target"."""
    kind = classify_dir(path)
    given = f"{given_as} {path}" if given_as else str(path)
    if want == "target" and kind.kind == "drafter":
        which = (
            f"the one the drafter was trained for: {kind.trained_for}"
            if kind.trained_for
            else "the one the drafter was trained for; the drafter does not record it"
        )
        return (
            f"{given} is an EAGLE-3 drafter ({kind.evidence}), not a target model: pass the target "
            f"model directory ({which})"
        )
    if want == "drafter" and kind.kind == "target":
        return (
            f"{given} is a transformers target model ({kind.evidence}), not an EAGLE-3 drafter: "
            f"{DRAFTER_DIRS}, and this directory as --target"
        )
    path = Path(path)
    if (
        kind.kind == "other"
        and (path / "index.json").is_file()
        and not (path / "config.json").exists()
    ):
        if want == "drafter":
            return (
                f"{given} is a capture store (specdraft capture's index.json), not a drafter: train one on it "
                f"(specdraft train {path} OUT), then pass OUT/draft"
            )
        return (
            f"{given} is a capture store (specdraft capture's index.json), not a target model: pass the "
            f"target's transformers directory (the store's index.json records its path)"
        )
    if (
        want == "drafter"
        and kind.kind == "other"
        and classify_dir(path / "draft").kind == "drafter"
    ):
        return (
            f"{given} is a training run directory, not a drafter: pass {path / 'draft'} (the drafter "
            f"specdraft train writes at the end)"
        )
    return None


def is_training_checkpoint(path: str | Path) -> bool:
    """Whether `path` looks like a checkpoint of `checkpoint_paths`: a torch.save file (a zip
    archive, as the trainer writes) or a directory holding PROGRESS_FILE (sharded)."""
    path = Path(path)
    return (
        (path / PROGRESS_FILE).is_file()
        if path.is_dir()
        else path.is_file() and zipfile.is_zipfile(path)
    )


def has_manifest(path: str | Path) -> bool:
    """Whether the drafter at `path` carries a specdraft manifest: a training checkpoint does."""
    return is_training_checkpoint(path) or (Path(path) / MANIFEST_FILE).is_file()


def unimplemented_architecture_message(path: Path, architectures: list[str]) -> str:
    """The one line for a drafter config whose draft architecture specdraft does not implement,
    naming the engines that register it (`conventions.DRAFT_LOADING`) or that none does."""
    served = engines_serving_architecture(list(architectures))
    verb = "registers" if len(served) == 1 else "register"
    where = (
        f"{' and '.join(RELEASES_READ[e] for e in served)} {verb} it: serve it there, without specdraft"
        if served
        else f"neither {' nor '.join(RELEASES_READ.values())} registers it, so no engine loads it"
    )
    return (
        f"{path}/config.json: architectures {architectures} is a draft architecture specdraft does not "
        f"implement (it implements {', '.join(READ_ARCHITECTURES)}); {where}"
    )
