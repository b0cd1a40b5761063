"""What the user gave `specdraft doctor`, refused up front when doctor cannot judge it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specdraft.bench.suites import suite_names
from specdraft.checkpoint import (
    DRAFTER_CONFIG_FIX,
    MANIFEST_FILE,
    CheckpointError,
    Manifest,
    check_weight_headers,
    classify_dir,
    read_config,
    refuse_other_aux_layers,
)
from specdraft.client import SERVER_WAIT_S
from specdraft.data.records import DataError
from specdraft.data.template import read_chat_template
from specdraft.errors import UnusableInput
from specdraft.targets.config import check_target_weights, read_target_config

DOCTOR_ENGINES = ("sglang", "vllm")
PATHS = ("target", "samples", "chat_template")  # DoctorInputs' optional paths


class DoctorInputError(UnusableInput):
    """An input doctor cannot judge: a path that does not exist, a directory of the wrong kind, a
    config.json that cannot be read, a bad option value. An unusable input: the CLI exits 2 for
    it, in doctor as in the commands that check configs with `given_config`."""


@dataclass(frozen=True)
class DoctorInputs:
    """What the user gave `specdraft doctor` (None = not given; paths as str or Path, held as Path,
    "" = not given: `PATHS`).

    engine: "sglang" | "vllm" (None: guessed from engine_args, else every engine the layout
    serves). engine_args: the engine's command line. aux_layers: the training layers (specdraft
    indices) of a drafter without a manifest (--aux-layers), replacing what its config.json says
    (with a manifest: refused unless they are the layers it records).
    trust_remote_code: read a --target config whose model_type only its own code defines. samples: a capture store directory or a
    JSONL of token ids ({"input_ids", "loss_mask"}), chats or texts; skip_bad skips its bad
    records instead of refusing the file. template_kwargs: the chat template kwargs the server
    uses (default: vLLM's --default-chat-template-kwargs, else {}). chat_template: the Jinja
    file serving renders chats with (default: the launch line's --chat-template, else the
    target tokenizer's own). max_samples / max_length
    bound the offline run. server_wait_s: how long to wait for a server that refuses
    connections (still starting) before the online check fails. Raises DoctorInputError for an
    input doctor cannot judge (and what `given_config`, `checkpoint.check_weight_headers`,
    `target.config.read_target_config` / `check_target_weights` and
    `checkpoint.refuse_other_aux_layers` raise).
    """

    checkpoint: Path | str
    target: Path | str | None = None
    engine: str | None = None
    engine_args: str | None = None
    samples: Path | str | None = None
    server: str | None = None
    sglang_version: str | None = None
    aux_layers: list[int] | None = None
    trust_remote_code: bool = False
    template_kwargs: dict[str, Any] | None = None
    chat_template: Path | str | None = None
    max_samples: int = 32
    max_length: int = 512
    skip_bad: bool = False
    server_wait_s: float = SERVER_WAIT_S

    def __post_init__(self) -> None:
        object.__setattr__(self, "checkpoint", Path(self.checkpoint))
        for name in PATHS:
            given = getattr(self, name)
            object.__setattr__(self, name, Path(given) if given else None)
        if self.engine is not None and self.engine not in DOCTOR_ENGINES:
            raise DoctorInputError(
                f"engine {self.engine!r}: choose one of {', '.join(DOCTOR_ENGINES)}"
            )
        if self.max_samples < 1 or self.max_length < 3:
            raise DoctorInputError("max_samples must be >= 1 and max_length >= 3")
        # A path the user typed that does not exist is an error, never a row of skips.
        if not self.checkpoint.is_dir():
            raise DoctorInputError(
                f"{self.checkpoint}: no such directory; pass a draft checkpoint directory"
            )
        given_config(self.checkpoint, DRAFTER_CONFIG_FIX)
        check_weight_headers(self.checkpoint)  # cut short: doctor cannot judge it, as bad JSON
        refuse_model_dir(self.checkpoint)
        refuse_aux_override(self.checkpoint, self.aux_layers)
        if self.target is not None and not (self.target / "config.json").is_file():
            raise DoctorInputError(
                f"{self.target}: no config.json; pass the target's transformers directory"
            )
        if self.target is not None:
            given_config(self.target, "pass a transformers model directory")
            read_target_config(
                self.target, self.trust_remote_code
            )  # unknown remote code: one line, no prompt
            check_target_weights(self.target)  # a truncated download: one line, not a row of skips
        if self.chat_template is not None:
            try:
                read_chat_template(self.chat_template)
            except DataError as e:
                raise DoctorInputError(str(e)) from None
        if (
            self.samples is not None
            and not self.samples.exists()
            and str(self.samples) not in suite_names()
        ):
            raise DoctorInputError(
                f"{self.samples}: no such file or directory; pass a capture store, a JSONL file or a "
                f"suite ({', '.join(suite_names())})"
            )


def given_config(path: Path, fix: str) -> dict[str, Any] | None:
    """`path`/config.json of a directory the user named (None when there is none: left to the
    checks); DoctorInputError (a ValueError) naming the file when it is there but unreadable, not valid JSON
    (`checkpoint.read_config`'s words) or not a JSON object, then `fix`: doctor cannot judge
    the directory, so this is an unusable input, never a row of skips or fails."""
    file = path / "config.json"
    if not file.is_file():
        return None
    try:
        return read_config(path, fix)
    except CheckpointError as e:
        raise DoctorInputError(str(e)) from None
    except OSError as e:
        raise DoctorInputError(f"{file}: cannot be read ({e.strerror or e}); {fix}") from None


def refuse_aux_override(path: Path, aux_layers: list[int] | None) -> None:
    """--aux-layers for a drafter whose manifest records its training layers: the same layers pass,
    others are refused (`checkpoint.refuse_other_aux_layers`). A manifest that cannot be read is
    left to the checks (a failing finding)."""
    file = path / MANIFEST_FILE
    if aux_layers is None or not file.is_file():
        return
    try:
        recorded = Manifest.read(file).aux_layers
    except (CheckpointError, TypeError):
        return
    refuse_other_aux_layers(file, recorded, aux_layers)


def refuse_model_dir(path: Path) -> None:
    """DoctorInputError when `path`/config.json can be read but marks no drafter (`checkpoint.classify_dir`;
    `run_doctor` has already named a target model given as CHECKPOINT). A missing config is left
    to the checks (a failing finding); an unreadable one `given_config` has refused."""
    file = path / "config.json"
    try:
        config = json.loads(file.read_text())
    except (OSError, ValueError):
        return
    if isinstance(config, dict) and classify_dir(path).kind != "drafter":
        raise DoctorInputError(
            f"{file}: not an EAGLE-3 draft config (no EAGLE-3 architecture, no drafter key such as "
            f"speculators_model_type, no {MANIFEST_FILE}): pass the drafter's directory as CHECKPOINT"
        )
