"""What the commands that read a drafter's aux ids take from --target, --aux-layers and
--sglang-version (`checkpoint.id_reading.IdReading`), and the check of the drafter's and the
target's config.json before any loader reads them (`refuse_bad_configs`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from specdraft.errors import UnusableInput

if TYPE_CHECKING:  # the checkpoint package imports torch: not at the CLI's start
    from specdraft.checkpoint.id_reading import IdReading


def engine_reading(
    speculating: bool, target: str, draft: str, aux_layers, sglang_version: str
) -> IdReading | None:
    """The `IdReading` generate's and serve's engine loads the drafter with (`id_reading` of
    --target, --aux-layers and --sglang-version, as `engine.load.load_engine` takes it); None for
    plain decoding, which reads no aux ids."""
    if not speculating:
        return None
    return id_reading(read_target(target), aux_layers, sglang_version, draft, target)


def read_target(target: str, trust_remote_code: bool = False):
    """A --target's config.json as published (`target.read_target_config`: read once, for every use
    a command makes of it), None when no --target is given; --trust-remote-code reads one whose
    model_type only its own code defines. ValueError naming the file and the fix when it is
    unreadable or lacks model_type / num_hidden_layers (`refuse_bad_configs`)."""
    if not target:
        return None
    from specdraft.targets.config import read_target_config

    refuse_bad_configs("", target, ("model_type", "num_hidden_layers"))
    return read_target_config(target, trust_remote_code)


def id_reading(
    target_config,
    aux: tuple[str, tuple[int, ...]] | None,
    sglang_version: str = "",
    drafter: str = "",
    target: str = "",
) -> IdReading:
    """The `IdReading` of the --target's config (`read_target`; None without --target), the
    --sglang-version and --aux-layers (`conventions.layers_of_option`). UnusableInput naming the
    flag: --aux-layers without --target or naming layers its convention cannot; before that, the
    check that a manifest-less `drafter` was built for this target (`refuse_other_target`)."""
    from specdraft.checkpoint.id_reading import IdReading

    if target_config is None:
        if aux is not None:
            raise UnusableInput(
                "--aux-layers needs --target DIR: aux ids are read by the target's layer count "
                "and class"
            )
        return IdReading(sglang_version=sglang_version or None)
    from specdraft.targets.config import TARGET_CLASSES

    text = target_config.get_text_config()
    refuse_other_target(drafter, target, text)
    target_class = TARGET_CLASSES.get(text.model_type, "llama")
    return IdReading(
        text.num_hidden_layers,
        target_class,
        sglang_version or None,
        None if aux is None else aux_layers_of_option(aux, text, target_class, sglang_version),
    )


def refuse_other_target(drafter: str, target: str, text) -> None:
    """ValueError naming both when the manifest-less `drafter` directory's config.json was built for
    a target of another hidden size or vocabulary than the --target's text config `text`
    (`engine.load.refuse_other_target`: the most basic mismatch, which the default aux ids' collapse
    would hide; a manifest names the aux layers, and the loader checks its record)."""
    from specdraft.checkpoint import MANIFEST_FILE

    path = Path(drafter)
    if not drafter or not (path / "config.json").is_file() or (path / MANIFEST_FILE).is_file():
        return
    from specdraft.checkpoint import read_config
    from specdraft.checkpoint.config_read import config_target_sizes
    from specdraft.engine.load import refuse_other_target as refuse

    refuse(
        config_target_sizes(read_config(path)),
        {"hidden_size": text.hidden_size, "vocab_size": text.vocab_size},
        drafter,
        target,
    )


def aux_layers_of_option(
    aux: tuple[str, tuple[int, ...]], text, target_class: str, sglang_version: str
) -> list[int]:
    """--aux-layers (convention, ids) as specdraft indices of the target whose text config is
    `text`; UnusableInput naming the option as given when its convention cannot name them."""
    from specdraft.conventions import ConventionError, layers_of_option

    try:
        return layers_of_option(
            aux[0], aux[1], text.num_hidden_layers, target_class, sglang_version or None
        )
    except ConventionError as e:
        typed = ",".join(
            map(str, aux[1])
        )  # as given: a list without a convention name is specdraft's
        given = typed if aux[0] == "specdraft" else f"{aux[0]}:{typed}"
        raise UnusableInput(f"--aux-layers {given}: {e}") from None


def refuse_bad_configs(draft: str, target: str, target_keys: tuple[str, ...] | None = None) -> None:
    """ValueError naming the file, what is wrong and the fix when the drafter's or the target's
    config.json is unreadable, not JSON or no object (`doctor.inputs.given_config`, doctor's
    words), or the target's lacks one of `target_keys` (default: all `target.TARGET_REQUIRED_KEYS`).
    Either path may be empty (not given) or lack config.json (left to the loaders)."""

    from specdraft.checkpoint import DRAFTER_CONFIG_FIX
    from specdraft.doctor.inputs import given_config
    from specdraft.targets.config import (
        TARGET_CONFIG_FIX,
        TARGET_REQUIRED_KEYS,
        check_target_config,
    )

    if draft:
        given_config(Path(draft), DRAFTER_CONFIG_FIX)
    config = given_config(Path(target), TARGET_CONFIG_FIX) if target else None
    if config is not None:
        check_target_config(target, config, target_keys or TARGET_REQUIRED_KEYS)
