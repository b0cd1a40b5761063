"""The settings of one demo run (`DemoConfig`), checked when built (errors.UnusableInput)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from specdraft.errors import UnusableInput
from specdraft.machine_load import DEFAULT_THREADS

METHODS = ("eagle3", "dflash")  # demo --method: the pipeline, or DFlash beside it (`demo.dflash`)


@dataclass(frozen=True)
class DemoConfig:
    """Settings of one demo run.

    target: a transformers model directory, or None for the bundled stories260K.
    data: documents separated by blank lines (default: the bundled TinyStories sample); with
    `chat_template` (a Jinja file, `data.template`), JSONL chats rendered with it at every stage.
    prompt_tokens: prompt length cut from each document; max_new_tokens: continuation length
    (regeneration and the generation benchmark). num_train / num_heldout: documents used.
    train_steps, batch_size, lr: drafter training. sweep_steps: chain depths measured.
    method: "eagle3" (the pipeline), or "dflash": the pipeline's EAGLE-3 drafter and a DFlash
    drafter of block_size, dflash_layers draft layers, dflash_steps optimizer steps at peak lr
    dflash_lr with dflash_anchors blocks per document (a demo document holds ~100 positions;
    SpecForge's 512 suits long chats) on the same store, compared (`demo.dflash`).
    timing_repeats: rounds in which every setting and plain decoding are each timed once;
    min_speedup: the median speedup over plain decoding a recommended setting needs (it must
    also be faster in three rounds of four: lower quartile > 1x; else the report recommends none).
    """

    out: Path = Path("specdraft-demo")
    target: Path | None = None
    data: Path | None = None
    chat_template: Path | None = None
    device: str = "cpu"
    prompt_tokens: int = 8
    max_new_tokens: int = 96
    num_train: int = 800
    num_heldout: int = 16
    train_steps: int = 1000
    batch_size: int = 8
    lr: float = 3e-3
    ttt_steps: int = 4
    seed: int = 0
    sweep_steps: tuple[int, ...] = (1, 2, 3, 4, 5, 6)
    tree: tuple[int, int, int] = (4, 2, 8)  # num_steps, topk, num_draft_tokens
    method: str = "eagle3"
    block_size: int = 8
    dflash_layers: int = 2
    dflash_steps: int = 600
    dflash_lr: float = 1e-2
    dflash_anchors: int = 16
    threads: int = DEFAULT_THREADS  # CPU threads torch uses (and the printed try: / serve: lines)
    timing_repeats: int = 5  # timed passes per setting, taking turns with plain decoding
    min_speedup: float = (
        1.05  # median speedup a recommended setting must reach (lower quartile > 1x)
    )

    def __post_init__(self) -> None:
        if (
            self.num_train < 2
        ):  # one for training, one for validation (the batch adapts: train_batch_size)
            raise UnusableInput(
                f"--num-train {self.num_train}: the demo needs at least 2 training documents"
            )
        if self.num_heldout < 1:
            raise UnusableInput(
                f"num_heldout {self.num_heldout}: the demo needs at least 1 held-out document"
            )
        if self.train_steps < 1:
            raise UnusableInput(
                f"--train-steps {self.train_steps}: must be at least 1 (the default is 1000)"
            )
        for name in ("prompt_tokens", "max_new_tokens", "batch_size", "ttt_steps"):
            if getattr(self, name) < 1:
                raise UnusableInput(f"{name} {getattr(self, name)}: must be at least 1")
        if not self.sweep_steps or min(self.sweep_steps) < 1:
            raise UnusableInput(
                f"sweep_steps {self.sweep_steps}: need at least one chain depth, each >= 1"
            )
        if self.method not in METHODS:
            raise UnusableInput(f"--method {self.method!r}: choose one of {', '.join(METHODS)}")
        for name, least in (
            ("block_size", 2),
            ("dflash_layers", 1),
            ("dflash_steps", 1),
            ("dflash_anchors", 1),
        ):
            if getattr(self, name) < least:
                raise UnusableInput(f"{name} {getattr(self, name)}: must be at least {least}")
        if self.timing_repeats < 1:
            raise UnusableInput(f"timing_repeats {self.timing_repeats}: must be at least 1")

    @property
    def max_length(self) -> int:
        """Tokens a sample may hold in capture and training: a document's prompt and
        continuation (plain text), or 2048 for a chat (its turns as the template renders them)."""
        if self.chat_template is not None:
            return 2048
        return self.prompt_tokens + self.max_new_tokens + 16
