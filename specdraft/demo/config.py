"""The settings of one demo run (`DemoConfig`), checked when built (errors.UnusableInput)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path

from specdraft.draft_config import EAGLE3_METHODS
from specdraft.errors import UnusableInput
from specdraft.machine_load import DEFAULT_THREADS

# --data documents (or chats) held out from training, after a seeded shuffle: the prompts the
# speculative-generation timing and doctor's held-out store use. --data needs --num-train + this.
NUM_HELDOUT = 16


def positive(default: int):
    """A DemoConfig count that must be at least 1 (`DemoConfig.__post_init__` names it otherwise)."""
    return field(default=default, metadata={"positive": True})


# demo --method: an EAGLE-3 method (the pipeline), or dflash (DFlash beside it, `demo.dflash`)
METHODS = (*EAGLE3_METHODS, "dflash")


@dataclass(frozen=True)
class DemoConfig:
    """Settings of one demo run.

    target: a transformers model directory, or None for the bundled stories260K.
    data: documents separated by blank lines (default: the bundled TinyStories sample); with
    `chat_template` (a Jinja file, `data.template`), JSONL chats rendered with it at every stage.
    prompt_tokens: prompt length cut from each document; max_new_tokens: continuation length
    (regeneration and the generation benchmark). num_train / num_heldout: documents used.
    train_steps, batch_size, lr: drafter training; method: an EAGLE-3 method of `specdraft train
    --method` (`draft_config.EAGLE3_METHODS`: eagle3, eagle3.1), or "dflash": the pipeline's EAGLE-3
    drafter and a DFlash drafter of block_size, dflash_layers draft layers, dflash_steps optimizer
    steps at peak lr dflash_lr with dflash_anchors blocks per document (a demo document holds ~100
    positions; SpecForge's 512 suits long chats) on the same store, compared (`demo.dflash`).
    sweep_steps: chain depths measured.
    timing_repeats: rounds in which every setting and plain decoding are each timed once;
    min_speedup: the median speedup over plain decoding a recommended setting needs (it must
    also be faster in three rounds of four: lower quartile > 1x; else the report recommends none).
    """

    out: Path = Path("specdraft-demo")
    target: Path | None = None
    data: Path | None = None
    chat_template: Path | None = None
    device: str = "cpu"
    prompt_tokens: int = positive(8)
    max_new_tokens: int = positive(96)
    num_train: int = 800
    num_heldout: int = NUM_HELDOUT
    train_steps: int = 1000
    batch_size: int = positive(8)
    lr: float = 3e-3
    ttt_steps: int = positive(4)
    seed: int = 0
    sweep_steps: tuple[int, ...] = (1, 2, 3, 4, 5, 6)
    tree: tuple[int, int, int] = (4, 2, 8)  # num_steps, topk, num_draft_tokens
    method: str = "eagle3"  # an EAGLE3_METHODS key (train --method)
    block_size: int = 8  # the DFlash drafter's (method dflash)
    dflash_layers: int = positive(2)
    dflash_steps: int = positive(600)
    dflash_lr: float = 1e-2
    dflash_anchors: int = positive(16)
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
        for name in (f.name for f in fields(self) if f.metadata.get("positive")):
            if getattr(self, name) < 1:
                raise UnusableInput(f"{name} {getattr(self, name)}: must be at least 1")
        if not self.sweep_steps or min(self.sweep_steps) < 1:
            raise UnusableInput(
                f"sweep_steps {self.sweep_steps}: need at least one chain depth, each >= 1"
            )
        if self.method not in METHODS:
            raise UnusableInput(
                f"--method {self.method!r}: the demo trains {' or '.join(EAGLE3_METHODS)} (what "
                "its generation, export and doctor stages read), or dflash beside eagle3"
            )
        if self.block_size < 2:
            raise UnusableInput(f"block_size {self.block_size}: must be at least 2")
        if self.timing_repeats < 1:
            raise UnusableInput(f"timing_repeats {self.timing_repeats}: must be at least 1")

    @property
    def eagle_method(self) -> str:
        """The EAGLE-3 method of the pipeline's drafter: `method`, eagle3 beside DFlash."""
        return "eagle3" if self.method == "dflash" else self.method

    @property
    def max_length(self) -> int:
        """Tokens a sample may hold in capture and training: a document's prompt and
        continuation (plain text), or 2048 for a chat (its turns as the template renders them)."""
        if self.chat_template is not None:
            return 2048
        return self.prompt_tokens + self.max_new_tokens + 16
