"""A training run's settings: TrainConfig, and the one merge of a --config file, the flags given
and a resumed checkpoint's settings (`run_config`, what `specdraft train` calls), with the data
order and lr schedule that follow from them.

A resumed run may change only what does not shape its weights (BOOKKEEPING_FIELDS), its length
(RUN_LENGTH_FIELDS: the lr schedule is recomputed) and how a rank splits a batch
(BATCH_SPLIT_FIELDS); every other setting must match the checkpoint's (`refuse_changed_settings`).
Errors name a field by the `specdraft train` flag that sets it (`flag`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from specdraft.checkpoint import checkpoint_paths
from specdraft.errors import SettingsMismatch, UnusableInput, closest_name
from specdraft.files import differing_fields
from specdraft.train.run_dir import check_run_dir, checkpoint_config
from specdraft.train.sources import OnlineSource

PRECISIONS = ("fp32", "bf16")
# TrainConfig fields a resumed run may change: they do not change the weights it ends with.
BOOKKEEPING_FIELDS = frozenset({"eval_every", "save_every", "keep_checkpoints", "device"})
# ... and the run's length, which a resumed run may extend (the lr schedule is recomputed for it).
RUN_LENGTH_FIELDS = frozenset({"total_steps", "epochs"})
# ... and how a rank splits its share of a batch, which changes the weights by float rounding only
# (as the number of ranks does): a run resumed on other ranks may need another split to fit memory.
BATCH_SPLIT_FIELDS = frozenset({"grad_accum_steps"})
# The `specdraft train` flag of each TrainConfig field it sets (cli/pipeline.py); errors name these, and
# any other field by its --config key, since users type flags, not field names.
FLAG_OF_FIELD = {
    "total_steps": "--steps",
    "epochs": "--epochs",
    "lr": "--lr",
    "batch_size": "--batch-size",
    "grad_accum_steps": "--grad-accum-steps",
    "max_length": "--max-length",
    "ttt_steps": "--ttt-steps",
    "draft_vocab_size": "--draft-vocab-size",
    "precision": "--precision",
    "aux_layers": "--aux-layers",
    "warmup_steps": "--warmup-steps",
    "save_every": "--save-every",
}


def flag(name: str) -> str:
    """How a user sets TrainConfig field `name`: its `specdraft train` flag, else its --config key."""
    return FLAG_OF_FIELD.get(name, f"--config key {name}")


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
    lr: float = 1e-4
    warmup_steps: int = 100
    total_steps: int | None = None
    epochs: int | None = None
    batch_size: int = 8
    grad_accum_steps: int = 1
    max_length: int = 2048
    grad_clip: float = 1.0
    weight_decay: float = 0.0
    min_lr_ratio: float = 0.0
    # training-time test
    ttt_steps: int = 7
    step_weight: float = 0.8
    # drafter
    draft_vocab_size: int | None = None
    aux_layers: tuple[int, ...] | None = None
    draft_overrides: dict[str, Any] = field(default_factory=dict)
    # data and bookkeeping
    val_fraction: float = 0.05
    seed: int = 0
    eval_every: int = 500
    save_every: int = 500
    keep_checkpoints: int = 2
    precision: str = "fp32"
    device: str = "auto"

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
        )
        for name in positive:
            if getattr(self, name) <= 0:
                raise UnusableInput(f"{flag(name)} {getattr(self, name)}: must be positive")
        if not math.isfinite(
            self.lr
        ):  # nan passes `<= 0`; torch's optimizer would say "Invalid learning rate"
            raise UnusableInput(f"{flag('lr')} {self.lr}: must be a finite positive number")
        if self.total_steps is not None and self.epochs is not None:
            raise UnusableInput(
                f"total_steps {self.total_steps} and epochs {self.epochs} both set (--config): keep "
                "one run length, or pass --steps or --epochs, which replaces both"
            )
        for name in ("total_steps", "epochs"):
            if getattr(self, name) is not None and getattr(self, name) <= 0:
                raise UnusableInput(f"{flag(name)} {getattr(self, name)}: must be positive")
        if not 0.0 <= self.val_fraction < 1.0:
            raise UnusableInput(f"{flag('val_fraction')} {self.val_fraction}: must be in [0, 1)")
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


def unknown_keys_text(values: dict[str, Any]) -> str:
    """ "unknown keys: KEY (did you mean FIELD?), ...; TrainConfig fields are ..." for the keys of
    `values` that are no TrainConfig field, each with the field it is closest to (`closest_name`)."""
    fields = TrainConfig.__dataclass_fields__
    named = []
    for key in sorted(set(values) - set(fields)):
        close = closest_name(key, fields)
        named.append(f"{key}" + (f" (did you mean {close}?)" if close else ""))
    return f"unknown keys: {', '.join(named)}; TrainConfig fields are {', '.join(fields)}"


def batch_order(train_ids: Sequence[int], epoch: int, config: TrainConfig) -> list[list[int]]:
    """The global batches of one epoch: a (seed, epoch)-seeded permutation, full batches only."""
    g = torch.Generator().manual_seed(permutation_seed(config.seed, epoch))
    order = [train_ids[i] for i in torch.randperm(len(train_ids), generator=g).tolist()]
    b = config.batch_size
    return [order[i : i + b] for i in range(0, len(order) - b + 1, b)]


def permutation_seed(seed: int, epoch: int) -> int:
    """Seed of epoch `epoch`'s shuffle (stored in checkpoints as the data position)."""
    return seed * 1_000_003 + epoch + 1


def split_samples(num_samples: int, config: TrainConfig) -> tuple[list[int], list[int]]:
    """(train ids, validation ids): a seeded permutation, the first val_fraction held out."""
    g = torch.Generator().manual_seed(config.seed)
    perm = torch.randperm(num_samples, generator=g).tolist()
    num_val = math.ceil(config.val_fraction * num_samples) if config.val_fraction else 0
    return sorted(perm[num_val:]), sorted(perm[:num_val])


def lr_lambda(step: int, warmup: int, total: int, min_ratio: float) -> float:
    """Multiplier of the base lr at `step`: linear warmup from 0, then cosine to min_ratio."""
    if step < warmup:
        return (step + 1) / (warmup + 1)
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def resume_config(out_dir: str | Path, given: dict[str, Any]) -> TrainConfig:
    """The config of `--resume`: the newest checkpoint's under out_dir, with the settings `given`
    (TrainConfig fields the user set: flags and --config keys) in its place. A run length given
    (total_steps or epochs) replaces both of the checkpoint's; `device` is this machine's, never
    the checkpoint's. `TrainConfig.from_dict(given)` when out_dir holds no checkpoint yet.
    Settings given that differ from the checkpoint's are refused later, by `Trainer.load_state`.
    """
    paths = checkpoint_paths(Path(out_dir))
    if not paths:
        return TrainConfig.from_dict(given)
    saved = {
        k: v
        for k, v in checkpoint_config(paths[-1]).items()
        if k in TrainConfig.__dataclass_fields__ and k != "device"
    }
    if "total_steps" in given or "epochs" in given:
        saved.update(total_steps=None, epochs=None)
    return TrainConfig.from_dict({**saved, **given})


def refuse_changed_settings(config: TrainConfig, saved: dict[str, Any], source: Path) -> None:
    """SettingsMismatch (a ValueError) naming the flags when `config` differs from the checkpoint
    `source`'s settings `saved` (a TrainConfig dict) in anything that shapes the weights."""
    may_change = BOOKKEEPING_FIELDS | RUN_LENGTH_FIELDS | BATCH_SPLIT_FIELDS
    now = config.to_dict()
    differ = differing_fields(saved, now, [k for k in now if k not in may_change])
    if differ:
        changes = ", ".join(f"{flag(k)} {saved.get(k)!r} -> {getattr(config, k)!r}" for k in differ)
        raise SettingsMismatch(
            f"{source}: this checkpoint was trained with other settings ({changes}); leave them "
            f"out to resume with the checkpoint's values (only the run length, --steps / "
            f"--epochs, may change, as may --grad-accum-steps), or train into a new OUT directory"
        )


def config_file_values(config: str | Path | None) -> dict[str, Any]:
    """--config FILE as a dict of TrainConfig fields ({} without one); UnusableInput naming the file."""
    if not config:
        return {}
    try:
        values = json.loads(Path(config).read_text())
    except OSError as e:
        raise UnusableInput(f"--config {config}: cannot read it ({e.strerror})") from None
    except json.JSONDecodeError as e:
        raise UnusableInput(
            f"--config {config}: not JSON ({e.msg.removesuffix(' at')} at line {e.lineno} "
            f"column {e.colno})"
        ) from None
    if not isinstance(values, dict):
        raise UnusableInput(
            f"--config {config}: expected a JSON object of TrainConfig fields, e.g. "
            '{"lr": 0.0003, "ttt_steps": 7}'
        )
    if set(values) - set(TrainConfig.__dataclass_fields__):
        raise UnusableInput(f"--config {config}: {unknown_keys_text(values)}")
    return values


def run_config(
    config_file: str | Path | None,
    flags: dict[str, Any],
    out_dir: str | Path,
    resume: bool,
    say: Callable[[str], None] = lambda line: None,
) -> TrainConfig:
    """The TrainConfig of `specdraft train`: the --config file's keys, then the `flags` given (TrainConfig
    fields; None = not given) over them; a run length flag (total_steps / epochs) replaces both of
    the file's. With `resume`, the settings not given come from out_dir's newest checkpoint
    (`resume_config`), and `say` receives the line naming it. UnusableInput (a usage error) for both
    run lengths given, a bad config file or value; FileExistsError for an out_dir that is no run
    directory."""
    steps, epochs = flags.get("total_steps"), flags.get("epochs")
    if steps is not None and epochs is not None:
        raise UnusableInput(
            f"--steps {steps} and --epochs {epochs} both set: give one run length "
            "(neither = one epoch)"
        )
    values = config_file_values(config_file)
    if steps is not None or epochs is not None:
        values.update(total_steps=None, epochs=None)
    values.update({k: v for k, v in flags.items() if v is not None})
    if not resume:
        return TrainConfig.from_dict(values)
    check_run_dir(out_dir)  # before saying anything about it
    saved = checkpoint_paths(out_dir)
    say(
        f"resuming from {saved[-1]} with its settings"
        if saved
        else f"--resume: no checkpoint in {out_dir} yet: starting at step 0"
    )
    return resume_config(out_dir, values)


def train_source(
    source: str,
    online: bool,
    target: str,
    *,
    no_chat: bool = False,
    template_kwargs: dict[str, Any] | None = None,
    target_dtype: str | None = None,
    skip_bad: bool = False,
    reasoning: str | None = None,
) -> str | OnlineSource:
    """`specdraft train`'s SOURCE: a store directory, or with `online` an OnlineSource running
    `target` (in `target_dtype`, default float32). Raises UnusableInput for an option that does not
    fit the mode, ValueError for a SOURCE that is no store directory."""
    if online:
        if not target:
            raise UnusableInput(
                "--online needs --target: the target model directory to run in the loop"
            )
        return OnlineSource(
            target,
            source,
            chat=not no_chat,
            template_kwargs=template_kwargs or {},
            target_dtype=target_dtype or "float32",
            skip_bad=skip_bad,
            reasoning=reasoning or "keep",
        )
    path = Path(source)
    if path.is_file():
        raise ValueError(
            f"{source} is a data file, not a capture store directory: train on it with "
            f"--online --target DIR (the target runs in the loop), or capture it first "
            f"(specdraft capture TARGET {source} STORE) and train on STORE"
        )
    if not path.exists():
        raise ValueError(
            f"{source}: no such directory; SOURCE is a capture store directory "
            "(specdraft capture), or with --online --target DIR a data file"
        )
    if no_chat or template_kwargs or reasoning:
        raise UnusableInput(
            "--no-chat, --template-kwargs and --reasoning apply with --online only (a "
            "store was rendered at capture)"
        )
    if target_dtype or skip_bad:
        raise UnusableInput(
            "--target-dtype and --skip-bad apply with --online only (a store was captured "
            "with them: specdraft capture --target-dtype / --skip-bad)"
        )
    return source
