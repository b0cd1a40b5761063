"""What the doctor reads from the drafter's and the target's own files, gathered once and
lazily (`FileEvidence`): config.json, the manifest, the weights, the target's facts, model and
tokenizer, the draft config; and how a piece that cannot be had is said (`Unavailable`, a skip;
`Broken`, the checkpoint's own files at fault, a fail).

Every piece is computed on first use and cached, value or failure alike (`memo`). What the
engines and the samples add is `evidence.Evidence`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from specdraft.checkpoint import (
    MANIFEST_FILE,
    MANIFEST_FIX,
    CheckpointError,
    Manifest,
    WeightFiles,
    config_from_files,
    owned_embedding_config,
    read_config,
    read_weights,
)
from specdraft.checkpoint.config_read import config_without_target
from specdraft.doctor.inputs import DoctorInputs
from specdraft.draft_config import DraftConfig
from specdraft.export import TargetFacts
from specdraft.train.progress import status_while

# A drafter without a manifest: only training writes one; export keeps a manifest, never makes one.
NO_MANIFEST_FIX = (
    "only `specdraft train` writes the manifest (RUN/draft; `specdraft export` keeps it in what it "
    "writes): this check needs a drafter trained by specdraft; exporting this one writes config.json "
    "and weights, no manifest"
)


class Unavailable(Exception):
    """Evidence that cannot be had: `reason` (why) and `fix` (what would provide it)."""

    def __init__(self, reason: str, fix: str = "") -> None:
        super().__init__(reason)
        self.reason, self.fix = reason, fix


class Broken(Unavailable):
    """The checkpoint's own files are at fault (unreadable, inconsistent): a fail, not a skip."""


class Unloadable(Unavailable):
    """The --target's config reads but transformers cannot build or fill its model: the checks
    that run the target skip with this reason; the report's notes say it once."""


def memo(fn: Callable) -> property:
    """A property computed once per instance (`Evidence.cached`, keyed by the function's name)."""
    prop = property(lambda self: self.cached(fn.__name__, lambda: fn(self)))
    prop.__doc__ = fn.__doc__
    return prop


@dataclass
class FileEvidence:
    """The evidence of the drafter's and the target's files for one doctor run (module doc)."""

    inputs: DoctorInputs
    findings: list = field(default_factory=list)  # findings so far, in check order (run.py)
    reads_dflash = False  # a DFlash drafter's manifest is read (doctor.block), not refused
    _cache: dict[str, tuple[bool, Any]] = field(default_factory=dict)

    def cached(self, key: str, compute: Callable[[], Any]) -> Any:
        """compute() once per key; an Unavailable it raises is cached and re-raised too."""
        if key not in self._cache:
            try:
                self._cache[key] = (True, compute())
            except Unavailable as e:
                self._cache[key] = (False, e)
        ok, value = self._cache[key]
        if not ok:
            raise value
        return value

    @property
    def path(self) -> Path:
        """The checkpoint directory."""
        return Path(self.inputs.checkpoint)

    @memo
    def config(self) -> dict[str, Any]:
        """config.json as written."""
        try:
            return read_config(self.path)
        except CheckpointError as e:
            raise Broken(str(e), "point doctor at a draft checkpoint directory") from None

    @memo
    def layout(self) -> str:
        """ "speculators" when config.json is a speculators config, else "sglang" (official)."""
        return "speculators" if self.config.get("speculators_model_type") else "sglang"

    @memo
    def layer_config(self) -> dict[str, Any]:
        """The Llama-shaped part of the config (speculators: transformer_layer_config)."""
        if self.layout == "speculators":
            return self.config.get("transformer_layer_config") or {}
        return self.config

    @memo
    def manifest(self) -> Manifest | None:
        """specdraft_manifest.json, or None when the directory has none."""
        file = self.path / MANIFEST_FILE
        if not file.exists():
            return None
        try:
            return Manifest.read(file, dflash=self.reads_dflash)
        except (CheckpointError, TypeError) as e:
            raise Broken(str(e).removesuffix(f"; {MANIFEST_FIX}"), MANIFEST_FIX) from None

    def need_manifest(self) -> Manifest:
        """The manifest, or Unavailable naming what it would have told."""
        if self.manifest is None:
            raise Unavailable(
                f"{self.path} has no {MANIFEST_FILE}: what the drafter was trained on is unknown",
                NO_MANIFEST_FIX,
            )
        return self.manifest

    @memo
    def weights(self) -> tuple[dict[str, torch.Tensor], WeightFiles]:
        """Every tensor of the drafter's weight files, by its name there, read by the loader's
        own reader (`checkpoint.read_weights`: any format it reads, the same refusals)."""
        try:
            return read_weights(self.path)
        except CheckpointError as e:
            message, _, fix = str(e).rpartition("; ")
            raise Broken(message or fix, fix if message else "re-export it") from None

    @property
    def tensors(self) -> dict[str, torch.Tensor]:
        """Every tensor of the weight files, by its name there (`weights`)."""
        return self.weights[0]

    @property
    def weights_file(self) -> Path:
        """The weights file findings name (a sharded save's index)."""
        return self.weights[1].entry

    @memo
    def facts(self) -> TargetFacts:
        """The target: its directory's config (--target) or the manifest's record."""
        try:
            if self.inputs.target is not None:
                return TargetFacts.from_target_dir(
                    self.inputs.target, self.inputs.trust_remote_code
                )
            if self.manifest is not None:
                return TargetFacts.from_manifest(self.manifest)
        except (FileNotFoundError, OSError, ValueError) as e:
            raise Unavailable(
                str(e), "pass the target's transformers directory (--target DIR)"
            ) from None
        raise Unavailable(
            "no --target and no manifest: the target is unknown",
            "pass the target's transformers directory (--target DIR)",
        )

    @memo
    def target_config_hash(self) -> str:
        """`target.config_hash` of the --target's config, as training records it in the manifest."""
        from specdraft.targets.config import config_hash, read_target_config

        target = self.need_target_dir()
        try:
            return config_hash(read_target_config(target, self.inputs.trust_remote_code))
        except (OSError, ValueError) as e:
            raise Unavailable(
                f"cannot read {target}/config.json: {e}", "pass a transformers directory"
            ) from None

    def need_target_dir(self) -> Path:
        """The --target directory, or Unavailable."""
        if self.inputs.target is None:
            raise Unavailable(
                "needs the target", "pass the target's transformers directory (--target DIR)"
            )
        return Path(self.inputs.target)

    @memo
    def draft_config(self) -> DraftConfig:
        """The DraftConfig the drafter was trained with (manifest) or its config declares."""
        if self.manifest is not None:
            return DraftConfig.from_dict(self.manifest.draft)
        facts = self.facts
        try:
            cfg = config_from_files(
                self.path,
                self.layout,
                self.config,
                None,
                facts.num_layers,
                facts.target_class or "llama",
                self.inputs.sglang_version,
                self.inputs.aux_layers,
            )
            return owned_embedding_config(
                cfg, None, self.tensors
            )  # the file's embed_tokens, as load_draft
        except (CheckpointError, ValueError) as e:
            raise Broken(f"cannot read the draft config: {e}", "fix config.json") from None

    @memo
    def shape_config(self) -> DraftConfig:
        """The DraftConfig that fixes the tensors' names and shapes: `draft_config`, or, when the
        target's layer count is unknown (no --target, no manifest), config.json read with a
        stand-in count that admits its aux ids (aux layers set no tensor's shape)."""
        try:
            return self.draft_config
        except Broken:
            raise
        except Unavailable:
            pass
        try:
            return config_without_target(self.path, self.layout, self.config, self.tensors)
        except (CheckpointError, ValueError) as e:
            raise Broken(f"cannot read the draft config: {e}", "fix config.json") from None

    def target_sizes(self) -> tuple[int, int, str]:
        """(hidden size, vocabulary, where from) of the target the checks compare with: the
        target's (`facts`), else what the drafter's own config says it was built for."""
        try:
            return self.facts.hidden_size, self.facts.vocab_size, "target"
        except Unavailable:
            cfg = self.shape_config
            return cfg.target_hidden_size, cfg.vocab_size, "the drafter's config"

    @memo
    def target(self) -> Any:
        """The target model (specdraft.targets.Target, float32, CPU). A directory transformers
        cannot build or fill (e.g. a wrapper saved by another transformers release: its
        from_pretrained raises RuntimeError for mismatched sizes, TypeError / AttributeError /
        KeyError in a class that reads the config otherwise) is Unavailable naming the directory
        and the loader's reason in one line (`target_unloadable`): the checks that run the target
        skip, the others still run."""
        from specdraft.targets import load_target

        target = self.need_target_dir()
        try:
            with status_while(f"doctor: loading the target {target}"):
                return load_target(target)
        except ImportError as e:  # e.g. an FP8 quantization_config whose kernels are not installed
            raise Unavailable(
                f"cannot run the target here: {e} (checks of sizes read its config.json alone)",
                "install what transformers names to run the target's forward",
            ) from None
        except (FileNotFoundError, ValueError, OSError) as e:
            raise Unavailable(
                f"cannot load the target: {e}", "pass a transformers directory"
            ) from None
        except (RuntimeError, TypeError, AttributeError, KeyError) as e:
            raise Unloadable(
                target_unloadable(target, e),
                "load the target with the transformers release that saved it, or re-save it "
                "with this one (checks of sizes read its config.json alone)",
            ) from None

    def served_template(self) -> tuple[str, str] | None:
        """(file, engine reading it: "vllm" | "sglang") of the chat template serving uses in
        place of the target tokenizer's own; None: the tokenizer's own. The files alone do not
        say: `evidence.Evidence` reads it from --chat-template and the launch line."""
        return None

    @memo
    def tokenizer(self) -> Any:
        """The target directory's tokenizer (`targets.tokenizer.load_target_tokenizer`: Unavailable
        with its reason when none loads), with the chat template serving uses (`served_template`)."""
        from specdraft.data.records import DataError
        from specdraft.data.template import use_chat_template
        from specdraft.targets.tokenizer import TargetTokenizerError, load_target_tokenizer

        try:
            tokenizer = load_target_tokenizer(self.need_target_dir())
        except TargetTokenizerError as e:
            raise Unavailable(e.reason, e.fix) from None
        served = self.served_template()
        if served is None:
            return tokenizer
        try:
            return use_chat_template(tokenizer, served[0], engine=served[1])
        except DataError as e:  # a launch line's template: a file on the serving host, a name
            raise Unavailable(
                f"the served chat template: {e}", "pass --chat-template FILE, the file it names"
            ) from None


def target_unloadable(target: Path, error: BaseException) -> str:
    """One line: transformers cannot load the model in `target`, and the loader's reason (its
    exception's type and first line)."""
    reason = (str(error).strip().splitlines() or [""])[0]
    return f"transformers cannot load the target {target} ({type(error).__name__}: {reason})"


def describe(value: Any) -> str:
    """Compact JSON-ish rendering of a config value for evidence text."""
    return json.dumps(value, sort_keys=True) if isinstance(value, (dict, list)) else repr(value)
