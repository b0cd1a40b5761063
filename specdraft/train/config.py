"""The one merge of a --config file, the flags given and a resumed checkpoint's settings into a
run's TrainConfig (`run_config`, what `specdraft train` calls), the data order and lr schedule that
follow from it, and `specdraft train`'s SOURCE (`train_source`).

A resumed run may change only the settings its declaration lets it (`settings.MAY_CHANGE_ON_RESUME`:
what does not shape its weights, its length, how a rank splits a batch); every other setting must
match the checkpoint's (`refuse_changed_settings`). Errors name a field by the `specdraft train`
flag that sets it (`settings.flag`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from specdraft.checkpoint import checkpoint_paths
from specdraft.draft_config import DraftConfig, method_flags
from specdraft.errors import SettingsMismatch, SpecdraftError, UnusableInput
from specdraft.files import differing_fields
from specdraft.train.run_dir import check_run_dir, checkpoint_config
from specdraft.train.settings import (
    MAY_CHANGE_ON_RESUME,
    TrainConfig,
    flag,
    refuse_other_methods_settings,
    unknown_keys_text,
)
from specdraft.train.sources import OnlineSource, TargetInfo

# The settings whose default (None) a run resolves at its start, from its data (`resolved_config`);
# checkpoints store the resolved values.
RESOLVED_AT_START = ("draft_vocab_size", "aux_layers")


class SourceError(SpecdraftError, ValueError):
    """A `specdraft train` SOURCE that is no capture store directory (a data file, a missing path)."""


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


def draft_config(config: TrainConfig, info: TargetInfo) -> DraftConfig:
    """The EAGLE-3 drafter's config for `info`'s target (`DraftConfig.from_target`, the norm flags
    of `config.method`, `draft_overrides` over both). The draft vocabulary defaults to the usable one: the tokenizer's length
    (`info.vocab_limit`; a target's vocab_size may pad past it), else the target's vocabulary."""
    return DraftConfig.from_target(
        info.config,
        info.aux_layers,
        config.draft_vocab_size or info.vocab_limit,
        **{**method_flags(config.method), **config.draft_overrides},
    )


def resolved_config(config: TrainConfig, info: TargetInfo) -> TrainConfig:
    """`config` with the defaults RESOLVED_AT_START as the values the run uses on `info`'s data:
    draft_vocab_size the EAGLE-3 drafter's (`draft_config`; a DFlash drafter predicts over the
    target's vocabulary and has none), aux_layers the data's. A run trains, checkpoints and
    compares on resume these values, so that re-passing a default's value is no change. Raises
    DraftError as `DraftConfig.from_target`."""
    vocab = config.draft_vocab_size
    if config.method != "dflash":
        vocab = draft_config(config, info).draft_vocab_size
    return replace(config, draft_vocab_size=vocab, aux_layers=tuple(info.aux_layers))


def resolve_saved(
    saved: dict[str, Any], info: TargetInfo, source: Path
) -> tuple[dict[str, Any], str | None]:
    """A checkpoint's settings with the defaults RESOLVED_AT_START that it holds unresolved (None:
    checkpoints of specdraft before issue #34 stored them so) resolved as this run resolves them
    (`resolved_config` on the same data), and the line saying so (None: nothing resolved)."""
    unresolved = [k for k in RESOLVED_AT_START if k in saved and saved[k] is None]
    if not unresolved:
        return saved, None
    known = {k: v for k, v in saved.items() if k in TrainConfig.__dataclass_fields__}
    resolved = resolved_config(TrainConfig.from_dict(known), info).to_dict()
    taken = ", ".join(f"{flag(k)} {shown(resolved[k])}" for k in unresolved)
    note = (
        f"{source} records the default of {', '.join(flag(k) for k in unresolved)} unresolved "
        f"(an older specdraft): taken as {taken}, the default on this data"
    )
    return {**saved, **{k: resolved[k] for k in unresolved}}, note


def shown(value: Any) -> str:
    """A setting's value as its flag takes it: a list of layers as "1,2,3"."""
    return ",".join(map(str, value)) if isinstance(value, (list, tuple)) else repr(value)


def refuse_changed_early(
    config: TrainConfig, saved: dict[str, Any], info: TargetInfo, source: Path
) -> None:
    """`refuse_changed_settings` before a drafter is built (another --method, say): `saved`
    resolved as `resolve_saved`, and each default `config` leaves out (None) taken as the
    checkpoint's resolved value, since the data was checked to be the same
    (`run_dir.check_same_data`). Raises SettingsMismatch."""
    saved, _ = resolve_saved(saved, info, source)
    given = {k: saved[k] for k in RESOLVED_AT_START if getattr(config, k) is None and k in saved}
    refuse_changed_settings(replace(config, **given), saved, source)


def refuse_changed_settings(config: TrainConfig, saved: dict[str, Any], source: Path) -> None:
    """SettingsMismatch (a ValueError) naming the flags when `config` differs from the checkpoint
    `source`'s settings `saved` (a TrainConfig dict) in anything that shapes the weights."""
    now = config.to_dict()
    differ = differing_fields(saved, now, [k for k in now if k not in MAY_CHANGE_ON_RESUME])
    if differ:
        changes = ", ".join(f"{flag(k)} {shown(saved.get(k))} -> {shown(now[k])}" for k in differ)
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
    out_dir: str | Path,
    resume: bool,
    say: Callable[[str], None] = lambda line: None,
    **flags: Any,
) -> TrainConfig:
    """The TrainConfig of `specdraft train`: the --config file's keys, then the `flags` given (TrainConfig
    fields; None = not given) over them; a run length flag (total_steps / epochs) replaces both of
    the file's. With `resume`, the settings not given come from out_dir's newest checkpoint
    (`resume_config`), and `say` receives the line naming it. UnusableInput (a usage error) for both
    run lengths given, a bad config file or value, a flag or --config key of another method than
    the run's (`settings.refuse_other_methods_settings`); FileExistsError for an out_dir that is no run
    directory."""
    steps, epochs = flags.get("total_steps"), flags.get("epochs")
    if steps is not None and epochs is not None:
        raise UnusableInput(
            f"--steps {steps} and --epochs {epochs} both set: give one run length "
            "(neither = one epoch)"
        )
    from_file = config_file_values(config_file)
    values = dict(from_file)
    if steps is not None or epochs is not None:
        values.update(total_steps=None, epochs=None)
    values.update({k: v for k, v in flags.items() if v is not None})
    if not resume:
        cfg = TrainConfig.from_dict(values)
        return refuse_other_methods_settings(cfg, flags, config_file, from_file)
    check_run_dir(out_dir)  # before saying anything about it
    saved = checkpoint_paths(out_dir)
    say(
        f"resuming from {saved[-1]} with its settings"
        if saved
        else f"--resume: no checkpoint in {out_dir} yet: starting at step 0"
    )
    cfg = resume_config(out_dir, values)
    return refuse_other_methods_settings(cfg, flags, config_file, from_file)


# train_source's keywords: `specdraft train`'s options that apply with --online (their names)
ONLINE_OPTIONS = (
    "no_chat",
    "template_kwargs",
    "chat_template",
    "tokenizer",
    "target_dtype",
    "skip_bad",
    "reasoning",
)


def train_source(
    source: str,
    online: bool,
    target: str,
    *,
    no_chat: bool = False,
    template_kwargs: dict[str, Any] | None = None,
    chat_template: str | None = None,
    tokenizer: str | None = None,
    target_dtype: str | None = None,
    skip_bad: bool = False,
    reasoning: str | None = None,
) -> str | OnlineSource:
    """`specdraft train`'s SOURCE: a store directory, or with `online` an OnlineSource running
    `target` (in `target_dtype`, default float32) with `tokenizer` (default: the target's) and
    the Jinja file `chat_template` (default: the tokenizer's template). Offline, a
    `chat_template` must be the one the store was rendered with (`check_store_template`).
    Raises UnusableInput for an option that does not fit the mode, SourceError for a SOURCE
    that is no store directory (`check_store_source`)."""
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
            chat_template=chat_template or None,
            tokenizer=tokenizer or None,
            target_dtype=target_dtype or "float32",
            skip_bad=skip_bad,
            reasoning=reasoning or "keep",
        )
    check_store_source(source)
    if no_chat or template_kwargs or reasoning or tokenizer:
        raise UnusableInput(
            "--no-chat, --template-kwargs, --tokenizer and --reasoning apply with --online only "
            "(a store was rendered at capture)"
        )
    if target_dtype or skip_bad:
        raise UnusableInput(
            "--target-dtype and --skip-bad apply with --online only (a store was captured "
            "with them: specdraft capture --target-dtype / --skip-bad)"
        )
    if chat_template:
        check_store_template(source, chat_template)
    return source


def check_store_template(store: str, chat_template: str) -> None:
    """UnusableInput naming both fingerprints (12 characters) when the capture store `store` was
    not rendered with the Jinja file `chat_template` (`data.template`); DataError for a file
    that cannot be read."""
    from specdraft.capture.store import INDEX, read_index
    from specdraft.data.template import read_chat_template, template_fingerprint

    given = template_fingerprint(read_chat_template(chat_template))
    rendered = read_index(Path(store) / INDEX).get("chat_template")
    if not rendered:
        raise UnusableInput(
            f"--chat-template {chat_template}: {store} records no chat template (not written by "
            "specdraft capture); drop --chat-template"
        )
    if not rendered.get("chat", True):
        raise UnusableInput(
            f"--chat-template {chat_template}: {store} was captured as plain text (--no-chat); "
            "drop --chat-template, or capture the chats with it"
        )
    if rendered.get("hash") != given:
        raise UnusableInput(
            f"--chat-template {chat_template} (hash {given[:12]}): {store} was rendered with "
            f"chat template hash {str(rendered.get('hash'))[:12]}; capture with this template, "
            "or drop --chat-template"
        )


def check_store_source(source: str) -> None:
    """SourceError naming the fix when an offline SOURCE is a file (data to train --online on, or
    to capture first) or does not exist."""
    path = Path(source)
    if path.is_file():
        raise SourceError(
            f"{source} is a data file, not a capture store directory: train on it with "
            f"--online --target DIR (the target runs in the loop), or capture it first "
            f"(specdraft capture TARGET {source} STORE) and train on STORE"
        )
    if not path.exists():
        raise SourceError(
            f"{source}: no such directory; SOURCE is a capture store directory "
            "(specdraft capture), or with --online --target DIR a data file"
        )
