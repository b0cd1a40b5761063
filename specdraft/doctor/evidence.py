"""What the doctor looks at, gathered once and lazily: the drafter's and the target's files
(`file_evidence.FileEvidence`), and on top of them what the engines read (the --engine-args, the
engines checked, the aux ids each reads, the weight names each loads, the drafter as each loads
it) and the samples (--samples read, its chats, the notes about them).

A piece that cannot be had raises `Unavailable` with the reason and what would provide it; a
check turns that into a skip (or, where the missing piece is itself the fault, a fail). What the
user gave is `inputs.DoctorInputs`; how each engine reads the weights is `keys.py`.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import torch

from specdraft.checkpoint import CheckpointError, aux_layers_note, state_dict_for_layout
from specdraft.conventions import (
    AUX_KEY,
    AuxReading,
    ConventionError,
    aux_layers_from_config,
    captured_by,
    unknown_class_text,
)
from specdraft.conventions.engines import DraftLoading, draft_loading
from specdraft.data.records import DataError
from specdraft.doctor.file_evidence import Broken, FileEvidence, Unavailable, Unloadable, memo
from specdraft.doctor.inputs import DOCTOR_ENGINES
from specdraft.doctor.keys import KeyMap, draft_as_loaded, key_map
from specdraft.draft import Eagle3Draft
from specdraft.export import TargetFacts
from specdraft.serve.engine_args import EngineArgs, aux_capture, detect_engine, parse_engine_args


class Unreadable(Broken):
    """An engine cannot read the config's aux ids."""


class UnknownClass(Unavailable):
    """The target's class is none the engine rules cover: the checks of aux ids skip."""


class Evidence(FileEvidence):
    """Lazily gathered evidence for one doctor run (module doc): the files', then the engines'
    and the samples'."""

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

    def served_template(self) -> tuple[str, str] | None:
        """(file, engine reading it) of the chat template serving uses: --chat-template (read
        as the engine checked reads it, vLLM's way when none is named), else the launch line's
        --chat-template (read as its engine does); None: the target tokenizer's own."""
        if self.inputs.chat_template is not None:
            return str(self.inputs.chat_template), self.engine or "vllm"
        try:
            args = self.engine_args
        except Unavailable:
            return None
        return (args.chat_template, args.engine) if args and args.chat_template else None

    @property
    def engines(self) -> list[str]:
        """Engines to check: the named one, else every engine that serves this layout."""
        if self.engine is not None:
            return [self.engine]
        return ["vllm"] if self.layout == "speculators" else list(DOCTOR_ENGINES)

    @memo
    def reading(self) -> AuxReading:
        """How each engine checked reads the config's aux ids, in specdraft indices. With --engine
        sglang, SGLang's rules alone: vLLM's reading of the file is no finding, and SGLang's is
        taken for both. With --engine vllm (SGLang not checked), SGLang's ids are read only to say
        what they mean: an SGLang that cannot read them (e.g. a class it serves no EAGLE-3 drafter
        on) is no finding, and its reading is taken as vLLM's."""
        facts = self.known_class
        try:
            if self.engines == ["sglang"]:
                return self._taken_for_both("sglang")
            return aux_layers_from_config(
                self.config, facts.num_layers, facts.target_class, self.inputs.sglang_version
            )
        except ConventionError as e:
            if "sglang" not in self.engines:
                with contextlib.suppress(ConventionError):
                    return self._taken_for_both("vllm")
            raise Unreadable(
                f"an engine cannot read the config's aux ids: {e}",
                "re-export with `specdraft export`, which writes each engine's ids",
            ) from None

    def _taken_for_both(self, engine: str) -> AuxReading:
        """`engine`'s reading of the config's aux ids (`conventions.captured_by`, --sglang-version
        for SGLang), taken for both engines: the other one is not checked."""
        facts = self.known_class
        version = self.inputs.sglang_version if engine == "sglang" else None
        ids = captured_by(self.config, engine, facts.num_layers, facts.target_class, version)
        key = "top-level" if engine != "sglang" and self.config.get(AUX_KEY) else "eagle_config"
        return AuxReading(ids, ids, ids, key)

    @memo
    def known_class(self) -> TargetFacts:
        """The target's facts when its engine rule class is known (engines read aux ids by class);
        Unavailable naming the target's class when no engine rule is known for it, or naming
        --target when neither --target nor the manifest says which class it is."""
        facts = self.facts
        if facts.target_class is not None:
            return facts
        if facts.architecture is None and self.inputs.target is None:
            raise Unavailable(
                "the target class is unknown (engines read aux ids by class)",
                "pass the target (--target DIR)",
            )
        raise UnknownClass(
            f"{unknown_class_text(facts.architecture, facts.source)}; the checks of the aux "
            "layers the engines capture cannot run",
            "serve a target of a class in the table, or check the layers by hand",
        )

    def ids_source(self, engine: str) -> str:
        """Where `engine` takes its aux ids from in config.json, in words (its default when none)."""
        nested = (self.config.get("eagle_config") or {}).get(AUX_KEY)
        top = self.config.get(AUX_KEY)
        if engine == "sglang":
            return (
                f"eagle_config ids {nested}" if nested else "no eagle_config ids: SGLang's default"
            )
        if top or nested:
            return f"top-level ids {top}" if top else f"eagle_config ids {nested}, read as-is"
        return "no ids: vLLM's default"

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
        used them); a --target transformers could not load or of a class no engine rule
        covers, with the checks that skipped for it (`_target_notes`)."""
        return self._aux_notes() + self._skipped_notes() + self._target_notes()

    def _target_notes(self) -> list[str]:
        """One line per target fact the checks lacked (a model transformers cannot load, a
        class no engine rule covers), naming the checks that skipped for it."""
        notes = []
        for key in ("target", "known_class"):
            found, value = self._cache.get(key, (True, None))
            if found or not isinstance(value, (Unloadable, UnknownClass)):
                continue
            skipped = [
                f.check for f in self.findings if f.verdict == "skip" and f.evidence == value.reason
            ]
            notes.append(f"{value.reason}: skipped {', '.join(skipped)}; the other checks ran")
        return notes

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
