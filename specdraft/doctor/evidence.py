"""What the doctor looks at, gathered once and lazily: files, target, tokenizer, samples, runs.

Every piece is computed on first use and cached, value or failure alike. A piece that cannot be
had raises `Unavailable` with the reason and what would provide it; a check turns that into a
skip (or, where the missing piece is itself the fault, a fail). What the user gave is
`inputs.DoctorInputs`; how each engine reads the weights is `keys.py`.
"""

from __future__ import annotations

import contextlib
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
    aux_layers_note,
    config_from_files,
    owned_embedding_config,
    read_config,
    read_weights,
    state_dict_for_layout,
)
from specdraft.checkpoint.config_read import config_without_target
from specdraft.conventions import (
    AUX_KEY,
    AuxReading,
    ConventionError,
    aux_layers_from_config,
    captured_by,
)
from specdraft.conventions.engines import DraftLoading, draft_loading
from specdraft.data.records import DataError
from specdraft.doctor.inputs import DOCTOR_ENGINES, DoctorInputs
from specdraft.doctor.keys import KeyMap, draft_as_loaded, key_map
from specdraft.draft import DraftConfig, Eagle3Draft
from specdraft.export import TargetFacts
from specdraft.serve.engine_args import EngineArgs, aux_capture, detect_engine, parse_engine_args

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


class Unreadable(Broken):
    """An engine cannot read the config's aux ids."""


def memo(fn: Callable) -> property:
    """A property computed once per instance (`Evidence.cached`, keyed by the function's name)."""
    prop = property(lambda self: self.cached(fn.__name__, lambda: fn(self)))
    prop.__doc__ = fn.__doc__
    return prop


@dataclass
class Evidence:
    """Lazily gathered evidence for one doctor run (see module doc)."""

    inputs: DoctorInputs
    findings: list = field(default_factory=list)  # findings so far, in check order (run.py)
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
            return Manifest.read(file)
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
    def engine_args(self) -> EngineArgs | None:
        """The parsed --engine-args (None when not given)."""
        text = self.inputs.engine_args
        if not text:
            return None
        engine = self.engine
        if engine is None:
            raise Unavailable("cannot tell which engine --engine-args are for", "pass --engine")
        try:
            return parse_engine_args(text, engine)
        except ValueError as e:
            raise Unavailable(f"--engine-args: {e}", "fix the command line") from None

    @property
    def engine(self) -> str | None:
        """The named engine, or the one the command line names, or None."""
        if self.inputs.engine is not None:
            return self.inputs.engine
        return detect_engine(self.inputs.engine_args) if self.inputs.engine_args else None

    @property
    def engines(self) -> list[str]:
        """Engines to check: the named one, else every engine that serves this layout."""
        if self.engine is not None:
            return [self.engine]
        return ["vllm"] if self.layout == "speculators" else list(DOCTOR_ENGINES)

    @memo
    def reading(self) -> AuxReading:
        """How each engine reads the config's aux ids, in specdraft indices. With --engine vllm
        (SGLang not checked), SGLang's ids are not read: an SGLang that cannot read them (e.g. a
        class it serves no EAGLE-3 drafter on) is no finding, and its reading is taken as vLLM's."""
        facts = self.facts
        if facts.target_class is None:
            raise Unavailable(
                "the target class is unknown (engines read ids by class)",
                "pass the target (--target DIR)",
            )
        try:
            return aux_layers_from_config(
                self.config, facts.num_layers, facts.target_class, self.inputs.sglang_version
            )
        except ConventionError as e:
            if "sglang" not in self.engines:
                with contextlib.suppress(ConventionError):
                    vllm = captured_by(self.config, "vllm", facts.num_layers, facts.target_class)
                    return AuxReading(
                        vllm,
                        vllm,
                        vllm,
                        "top-level" if self.config.get(AUX_KEY) else "eagle_config",
                    )
            raise Unreadable(
                f"an engine cannot read the config's aux ids: {e}",
                "re-export with `specdraft export`, which writes each engine's ids",
            ) from None

    def aux_capture(self, engine: str) -> tuple[bool, str]:
        """Whether `engine` captures aux states at all, and why (engine_args.aux_capture)."""
        try:
            args = self.engine_args
        except Unavailable:
            args = None
        return aux_capture(
            args if args is not None and args.engine == engine else None, self.config, engine
        )

    def loading(self, engine: str) -> list[DraftLoading]:
        """What `engine` loads (`conventions.DRAFT_LOADING`): for SGLang the row of --sglang-version,
        else one row per version range, oldest first."""
        try:
            return draft_loading(engine, self.inputs.sglang_version)
        except ConventionError as e:
            raise Unavailable(str(e), "pass --sglang-version as e.g. 0.5.23") from None

    def key_map(self, engine: str | None, row: DraftLoading | None = None) -> KeyMap:
        """How `engine` (None: specdraft's strict loader) maps the file onto the parameters, as
        the release of `row` reads names (default: the oldest release `loading` covers)."""
        tensors, cfg = self.tensors, self.shape_config
        with torch.device("meta"):
            expected = {
                k: tuple(v.shape)
                for k, v in state_dict_for_layout(Eagle3Draft(cfg), "sglang").items()
            }
        if engine is None:
            return key_map(tensors, expected, None, cfg.owns_embedding)
        row = row or self.loading(engine)[0]
        return key_map(tensors, expected, engine, cfg.owns_embedding, row.layer_prefixes)

    @memo
    def target(self) -> Any:
        """The target model (specdraft.targets.Target, float32, CPU)."""
        from specdraft.targets import load_target

        try:
            return load_target(self.need_target_dir())
        except ImportError as e:  # e.g. an FP8 quantization_config whose kernels are not installed
            raise Unavailable(
                f"cannot run the target here: {e} (checks of sizes read its config.json alone)",
                "install what transformers names to run the target's forward",
            ) from None
        except (FileNotFoundError, ValueError, OSError) as e:
            raise Unavailable(
                f"cannot load the target: {e}", "pass a transformers directory"
            ) from None

    @memo
    def tokenizer(self) -> Any:
        """The target directory's tokenizer."""
        from transformers import AutoTokenizer

        target = self.need_target_dir()
        try:
            return AutoTokenizer.from_pretrained(target, local_files_only=True)
        except (OSError, ValueError) as e:
            raise Unavailable(
                f"no tokenizer in {target} ({type(e).__name__})",
                "save the target's tokenizer into its directory",
            ) from None

    @memo
    def sample_read(self) -> Any:
        """--samples read (`doctor.samples.SampleRead`: the samples, tokenized with the manifest's
        template kwargs, and the bad records skip_bad skipped)."""
        from specdraft.doctor.samples import read_samples

        if self.inputs.samples is None:
            raise Unavailable("needs samples", "pass --samples FILE (a capture store or JSONL)")
        kwargs = (
            (self.manifest.chat_template or {}).get("kwargs") if self.manifest else None
        ) or {}
        # the tokenizer is loaded only for texts and chats
        return read_samples(
            Path(self.inputs.samples),
            lambda: self.tokenizer,
            kwargs,
            self.inputs.max_samples,
            self.inputs.max_length,
            self.inputs.skip_bad,
        )

    @property
    def samples(self) -> list:
        """Up to max_samples `data.Sample`s from --samples."""
        return self.sample_read.samples

    @property
    def labelled_samples(self) -> list:
        """`samples` with the target's outputs to replay offline; Unavailable for a suite's prompts."""
        if self.sample_read.prompts_only:
            raise Unavailable(
                f"--samples {self.inputs.samples} holds prompts only",
                "give the target's outputs for offline acceptance: a capture store or a "
                "regenerated JSONL (specdraft regenerate)",
            )
        return self.samples

    def notes(self) -> list[str]:
        """Report lines about the inputs: where a manifest-less drafter's aux layers came from
        when its config names none (`layouts.aux_layers_note`); with skip_bad, what was skipped in
        --samples (nothing when the samples could not be read for want of a tokenizer: no check
        used them)."""
        return self._aux_notes() + self._skipped_notes()

    def _aux_notes(self) -> list[str]:
        try:
            note = aux_layers_note(
                self.config, self.manifest, self.facts.num_layers, self.inputs.aux_layers
            )
        except (Unavailable, ConventionError):
            return []
        return [note] if note else []

    def _skipped_notes(self) -> list[str]:
        if not self.inputs.skip_bad or self.inputs.samples is None:
            return []
        try:
            return [f"--samples {self.inputs.samples}: {self.sample_read.skipped_text()}"]
        except Unavailable:
            return []

    def read_given_samples(self) -> None:
        """Read --samples now: a file the user gave that cannot be read is an error (DataError,
        `--samples FILE:LINE: ...`), never a row of skips. Samples that need a tokenizer not at
        hand (no --target) stay a skip of the checks that use them."""
        if self.inputs.samples is None:
            return
        try:
            _ = self.chats  # needs no tokenizer: a bad file is named even without --target
            _ = self.samples
        except Unavailable:
            pass
        except DataError as e:
            raise type(e)(f"--samples {e}") from None

    @memo
    def chats(self) -> list:
        """Chats (lists of messages) in --samples, for render parity; [] for other samples."""
        from specdraft.doctor.samples import read_chats

        if self.inputs.samples is None:
            raise Unavailable("no sample chats", "pass --samples chats.jsonl")
        return read_chats(Path(self.inputs.samples), self.inputs.max_samples, self.inputs.skip_bad)

    def engine_draft(self, engine: str | None) -> tuple[Eagle3Draft, str]:
        """The drafter as `engine` loads the files (unloaded parameters keep a seeded
        initialisation, as in the engine), or as specdraft loads them (engine None)."""
        return self.cached(f"engine_draft:{engine}", lambda: self._build_draft(engine))

    def _build_draft(self, engine: str | None) -> tuple[Eagle3Draft, str]:
        cfg, tensors = self.draft_config, self.tensors
        keys, served = (
            (self.key_map(engine), self.layer_config) if engine is not None else (None, {})
        )
        try:
            model, how = draft_as_loaded(cfg, tensors, engine, keys, served, self.weights_file)
        except CheckpointError as e:
            raise Unavailable(
                f"the checkpoint does not load: {e}", "see keys_match_engine"
            ) from None
        if not cfg.owns_embedding:
            model.load_target_embedding(self.target.embed_tokens.weight.detach().float())
        return model.eval(), how


def describe(value: Any) -> str:
    """Compact JSON-ish rendering of a config value for evidence text."""
    return json.dumps(value, sort_keys=True) if isinstance(value, (dict, list)) else repr(value)
