"""A training run's settings, each declared once: `TrainConfig`, whose fields carry their help text,
the `specdraft train` flag that sets them (the others are --config keys only), the flag's range and
how a resumed run treats them (`setting`). The CLI's options of `specdraft train`, its --config keys
(`unknown_keys_text`) and the resume check (`MAY_CHANGE_ON_RESUME`) are derived from these
declarations. Importing this module imports no torch (the CLI builds its options from it).
"""

from __future__ import annotations

import math
from dataclasses import MISSING, Field, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from specdraft.draft_config import EAGLE3_METHODS, NORM_FLAGS, method_flags
from specdraft.errors import UnusableInput, closest_name

PRECISIONS = ("fp32", "bf16")
# The drafting methods `specdraft train --method` trains (EAGLE-3 the default): the EAGLE-3 ones
# (`draft_config.EAGLE3_METHODS`, a norm placement each) and DFlash.
METHODS = (*EAGLE3_METHODS, "dflash")

# How a resumed run treats a setting (`config.refuse_changed_settings`):
MATCH = "match"  # it shapes the weights: it must be the checkpoint's
BOOKKEEPING = "bookkeeping"  # may change: it does not change the weights the run ends with
RUN_LENGTH = "run length"  # may change: a resumed run may extend, the lr schedule is recomputed
# may change: how a rank splits its share of a batch changes the weights by float rounding only (as
# the number of ranks does): a run resumed on other ranks may need another split to fit memory
BATCH_SPLIT = "batch split"


def setting(
    default: Any = MISSING,
    help: str = "",
    *,
    flag: str | None = None,
    resume: str = MATCH,
    factory: Any = MISSING,
    **option: Any,
) -> Any:
    """A TrainConfig field: its `default` (or `factory`), its `help` (the --help of `flag` and
    what the --config key means), the `specdraft train` flag that sets it (None: a --config key
    only), how a resumed run treats it (MATCH, BOOKKEEPING, RUN_LENGTH or BATCH_SPLIT), and
    `option`: the flag's range (min=1) or `choices`."""
    metadata = {"help": help, "flag": flag, "resume": resume, "option": option}
    return field(default=default, default_factory=factory, metadata=metadata)


def run_length(help: str, flag: str) -> Any:
    """A setting of the run's length (`total_steps` or `epochs`: one of them, or neither for one
    epoch): None (not given) by default, at least 1, and a resumed run may extend it."""
    return setting(None, help, flag=flag, resume=RUN_LENGTH, min=1)


@dataclass(frozen=True)
class TrainConfig:
    """Hyper-parameters of one training run (grouped by stage). Unset sizes come from the target.

    Length of the run: exactly one of `total_steps` (optimizer steps) or `epochs` (passes over
    the training split; the last partial global batch of an epoch is dropped); neither = 1 epoch.
    `batch_size` counts sequences per optimizer step over all ranks; each rank runs its share as
    `grad_accum_steps` micro-batches of batch_size / (world size · grad_accum_steps) sequences,
    which must divide exactly. `aux_layers` picks an online target's layers (a store or TrainData
    holding other layers is an error). `precision` "bf16" autocasts on CUDA only (fp32 master
    weights); on the CPU it is an error. `draft_overrides` replace DraftConfig fields derived
    from the target.
    """

    # optimisation
    lr: float = setting(
        1e-4,
        "Peak learning rate, after warm-up (1e-4: suits long runs on large data; small data / short "
        "runs need a larger one, e.g. the demo's --lr 3e-3 --ttt-steps 4 for 1000 steps on 800 "
        "documents).",
        flag="--lr",
    )
    warmup_steps: int = setting(
        100, "Linear learning-rate warm-up steps.", flag="--warmup-steps", min=0
    )
    total_steps: int | None = run_length(
        "Total optimizer steps (instead of --epochs; neither = one epoch).", "--steps"
    )
    epochs: int | None = run_length(
        "Passes over the training split (neither --steps nor --epochs = one epoch).", "--epochs"
    )
    batch_size: int = setting(8, "Sequences per step, over all ranks.", flag="--batch-size", min=1)
    grad_accum_steps: int = setting(
        1,
        "Micro-batches per step on each rank.",
        flag="--grad-accum-steps",
        resume=BATCH_SPLIT,
        min=1,
    )
    max_length: int = setting(
        2048, "Truncate samples to this many tokens.", flag="--max-length", min=1
    )
    grad_clip: float = setting(1.0, "Gradient norm clipping (0 = off).")
    weight_decay: float = setting(0.0, "AdamW weight decay.")
    min_lr_ratio: float = setting(0.0, "The cosine schedule's last lr, as a fraction of lr.")
    # method
    method: str = setting(
        "eagle3",
        "Drafter to train: eagle3 (TTT unroll), eagle3.1 (EAGLE-3 with a norm on each aux state "
        "before fc and the post-norm state fed back: fc_norm, norm_output) or dflash (block "
        "drafter, block-wise loss).",
        flag="--method",
        choices=METHODS,
    )
    # training-time test
    ttt_steps: int = setting(7, "Training-time-test unroll steps.", flag="--ttt-steps", min=1)
    step_weight: float = setting(0.8, "Loss weight of unroll step k: step_weight ** k.")
    # DFlash (--method dflash; SpecForge OnlineDFlashModel's settings)
    block_size: int = setting(
        16,
        "DFlash block size: tokens per draft forward, the anchor included.",
        flag="--block-size",
        min=2,
    )
    num_anchors: int = setting(512, "DFlash blocks sampled per sequence (at most).")
    loss_decay_gamma: float | None = setting(
        None, "DFlash loss weight of block position k: exp(-(k-1)/gamma); None: uniform."
    )
    # drafter
    draft_vocab_size: int | None = setting(
        None,
        "The EAGLE-3 drafter's vocabulary (DFlash predicts over the target's). Default: the usable "
        "vocabulary, the tokenizer's length (vocab_size may pad past it).",
        flag="--draft-vocab-size",
        min=1,
    )
    aux_layers: tuple[int, ...] | None = setting(
        None,
        "Specdraft indices, e.g. '2,3,4' (online default: [2, L//2, L-3] for an L-layer target; a "
        "store's must match).",
        flag="--aux-layers",
    )
    draft_overrides: dict[str, Any] = setting(
        help="DraftConfig fields replacing those derived from the target.", factory=dict
    )
    # data and bookkeeping
    val_fraction: float = setting(0.05, "Fraction of the samples held out for validation.")
    seed: int = setting(0, "Seed of the validation split and the data order.")
    eval_every: int = setting(500, "Validate every N steps.", resume=BOOKKEEPING)
    save_every: int = setting(
        500,
        "Checkpoint every N steps and at the end, under OUT/checkpoints; the newest 2 are kept "
        "(--config key keep_checkpoints).",
        flag="--save-every",
        resume=BOOKKEEPING,
        min=1,
    )
    keep_checkpoints: int = setting(2, "Checkpoints kept, the newest.", resume=BOOKKEEPING)
    precision: str = setting(
        "fp32", "fp32 | bf16 (CUDA autocast).", flag="--precision", choices=PRECISIONS
    )
    device: str = setting(
        "auto", "auto: the GPU when torch sees one, else the CPU.", resume=BOOKKEEPING
    )

    def __post_init__(self) -> None:
        positive = (
            "lr",
            "batch_size",
            "grad_accum_steps",
            "max_length",
            "ttt_steps",
            "eval_every",
            "save_every",
            "keep_checkpoints",
            "num_anchors",
        )
        for name in positive:
            if getattr(self, name) <= 0:
                raise UnusableInput(f"{flag(name)} {getattr(self, name)}: must be positive")
        if not math.isfinite(
            self.lr
        ):  # nan passes `<= 0`; torch's optimizer would say "Invalid learning rate"
            raise UnusableInput(f"{flag('lr')} {self.lr}: must be a finite positive number")
        self._check_run_length()
        if not 0.0 <= self.val_fraction < 1.0:
            raise UnusableInput(f"{flag('val_fraction')} {self.val_fraction}: must be in [0, 1)")
        self._check_method()
        if self.precision not in PRECISIONS:
            raise UnusableInput(
                f"{flag('precision')} {self.precision!r}: choose one of {', '.join(PRECISIONS)}"
            )
        for name in ("warmup_steps", "grad_clip", "weight_decay"):
            if getattr(self, name) < 0:
                raise UnusableInput(f"{flag(name)} {getattr(self, name)}: must be >= 0")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise UnusableInput(f"{flag('min_lr_ratio')} {self.min_lr_ratio}: must be in [0, 1]")
        if not 0.0 < self.step_weight <= 1.0:
            raise UnusableInput(f"{flag('step_weight')} {self.step_weight}: must be in (0, 1]")
        if self.aux_layers is not None:
            object.__setattr__(self, "aux_layers", tuple(self.aux_layers))

    def _check_method(self) -> None:
        """UnusableInput for an unknown method or a DFlash setting it cannot train with."""
        if self.method not in METHODS:
            raise UnusableInput(
                f"{flag('method')} {self.method!r}: choose one of {', '.join(METHODS)}"
            )
        self._check_method_flags()
        if self.block_size < 2:
            raise UnusableInput(f"{flag('block_size')} {self.block_size}: must be at least 2")
        if self.loss_decay_gamma is not None and not self.loss_decay_gamma > 0:
            raise UnusableInput(
                f"{flag('loss_decay_gamma')} {self.loss_decay_gamma}: must be positive (or null)"
            )

    def _check_method_flags(self) -> None:
        """UnusableInput for draft_overrides that change the norm flags an EAGLE-3 method other
        than plain eagle3 defines (`draft_config.EAGLE3_METHODS`); plain eagle3 takes any."""
        if self.method not in EAGLE3_METHODS or self.method == "eagle3":
            return
        flags = method_flags(self.method)
        changed = {
            k: v for k, v in self.draft_overrides.items() if k in NORM_FLAGS and v != flags[k]
        }
        if changed:
            named = ", ".join(EAGLE3_METHODS[self.method])
            raise UnusableInput(
                f"{flag('method')} {self.method} sets {named} and no other norm flag; "
                f"draft_overrides {changed} changes that: drop them, or train --method eagle3 "
                "with draft_overrides for another variant"
            )

    def _check_run_length(self) -> None:
        """UnusableInput for both run lengths set (a --config file) or one that is not positive."""
        if self.total_steps is not None and self.epochs is not None:
            raise UnusableInput(
                f"total_steps {self.total_steps} and epochs {self.epochs} both set (--config): keep "
                "one run length, or pass --steps or --epochs, which replaces both"
            )
        for name in ("total_steps", "epochs"):
            if getattr(self, name) is not None and getattr(self, name) <= 0:
                raise UnusableInput(f"{flag(name)} {getattr(self, name)}: must be positive")

    def num_steps(self, batches_per_epoch: int) -> int:
        """Total optimizer steps for a training split of `batches_per_epoch` global batches."""
        return self.total_steps or (self.epochs or 1) * batches_per_epoch

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict of every field."""
        d = asdict(self)
        d["aux_layers"] = list(self.aux_layers) if self.aux_layers is not None else None
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainConfig:
        """Inverse of `to_dict`; an unknown key is an UnusableInput naming it (`unknown_keys_text`)."""
        if set(d) - set(cls.__dataclass_fields__):
            raise UnusableInput(f"TrainConfig: {unknown_keys_text(d)}")
        return cls(**d)


def flagged_settings() -> list[Field]:
    """The TrainConfig fields `specdraft train` sets by a flag, in their declared order."""
    return [f for f in fields(TrainConfig) if f.metadata["flag"]]


# The `specdraft train` flag of each TrainConfig field it sets; errors name these, and any other
# field by its --config key, since users type flags, not field names.
FLAG_OF_FIELD = {f.name: f.metadata["flag"] for f in flagged_settings()}
# The fields a resumed run may change (every other must be the checkpoint's).
MAY_CHANGE_ON_RESUME = frozenset(
    f.name for f in fields(TrainConfig) if f.metadata["resume"] != MATCH
)


# The settings only one kind of method trains with (the others ignore them): "eagle3" = every
# EAGLE-3 method (`draft_config.EAGLE3_METHODS`), "dflash" = --method dflash (a DFlash drafter
# predicts over the target's whole vocabulary: no draft_vocab_size).
METHOD_OF_SETTING = {
    "ttt_steps": "eagle3",
    "step_weight": "eagle3",
    "draft_vocab_size": "eagle3",
    "block_size": "dflash",
    "num_anchors": "dflash",
    "loss_decay_gamma": "dflash",
}


def refuse_other_methods_settings(
    cfg: TrainConfig,
    given: dict[str, Any],
    config_file: str | Path | None = None,
    file_values: dict[str, Any] | None = None,
) -> TrainConfig:
    """`cfg`, or UnusableInput naming the first setting that belongs to another method than
    cfg.method (`METHOD_OF_SETTING`), which would ignore it: a flag in `given` (flags passed:
    field -> value, None = not given), else a key of the --config file `config_file` in
    `file_values` (its keys) set to other than the field's default (a key at its default
    changes nothing: a saved `TrainConfig.to_dict()`, which holds every field, passes)."""
    for name, value in given.items():
        methods = other_methods(cfg, name)
        if value is not None and methods:
            raise UnusableInput(
                f"{flag(name)} {value}: a setting of {methods}, and this run trains --method "
                f"{cfg.method}, which ignores it: drop it, or train {methods}"
            )
    for name, value in (file_values or {}).items():
        methods = other_methods(cfg, name)
        if methods and value != TrainConfig.__dataclass_fields__[name].default:
            raise UnusableInput(
                f"--config {config_file}: key {name} is a setting of {methods}, and this run "
                f"trains --method {cfg.method}, which ignores it: drop {name} from "
                f"{config_file}, or train {methods}"
            )
    return cfg


def other_methods(cfg: TrainConfig, name: str) -> str | None:
    """The methods setting `name` belongs to when cfg.method is not one of them
    (`METHOD_OF_SETTING`), as a user passes them: "--method dflash" or "--method eagle3 /
    eagle3.1"; None for a setting of cfg.method's kind or of every method."""
    owner = METHOD_OF_SETTING.get(name)
    if owner is None or owner == ("dflash" if cfg.method == "dflash" else "eagle3"):
        return None
    return "--method dflash" if owner == "dflash" else "--method eagle3 / eagle3.1"


def flag(name: str) -> str:
    """How a user sets TrainConfig field `name`: its `specdraft train` flag, else its --config key."""
    return FLAG_OF_FIELD.get(name, f"--config key {name}")


def unknown_keys_text(values: dict[str, Any]) -> str:
    """ "unknown keys: KEY (did you mean FIELD?), ...; TrainConfig fields are ..." for the keys of
    `values` that are no TrainConfig field, each with the field it is closest to (`closest_name`)."""
    known = TrainConfig.__dataclass_fields__
    named = []
    for key in sorted(set(values) - set(known)):
        close = closest_name(key, known)
        named.append(f"{key}" + (f" (did you mean {close}?)" if close else ""))
    return f"unknown keys: {', '.join(named)}; TrainConfig fields are {', '.join(known)}"
