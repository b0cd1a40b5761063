"""The callbacks of specdraft's options: each checks one option's value when click parses it, a
usage error (`typer.BadParameter`, exit 2) naming the value and the fix before any command runs,
and returns the value the command receives (a list option as a tuple of integers)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import typer

from specdraft.cli.common import error
from specdraft.errors import SpecdraftError


def check_device(value: str) -> str:
    """--device: a torch device this install can use (one line instead of a traceback)."""
    import torch

    try:
        device = torch.device(value)
    except RuntimeError as e:
        raise typer.BadParameter(f"{value!r} is not a torch device (use cpu or cuda[:N])") from e
    if device.type == "cuda" and not torch.cuda.is_available():
        raise typer.BadParameter(
            f"{value!r}: this torch build ({torch.__version__}) sees no CUDA GPU; "
            "use --device cpu or install a CUDA build of torch"
        )
    return value


def check_model_dir(value: str, param: typer.CallbackParam = None) -> str:
    """--target: empty (not given) or a directory holding config.json, and no drafter. A file
    (e.g. DIR/config.json) or a `~` the shell left unexpanded (`--target=~/m`) is named as such."""

    path = Path(value)
    if value and not (path / "config.json").is_file():
        if not path.expanduser().exists():
            raise typer.BadParameter(
                f"{value}: no such directory; pass a transformers model directory"
            )
        if path.is_file():
            raise typer.BadParameter(
                f"{value} is a file; pass the model directory that holds it ({path.parent})"
            )
        if (path.expanduser() / "config.json").is_file():
            raise typer.BadParameter(
                f"{value}: ~ was not expanded (a shell leaves it as is after '='); pass "
                f"{path.expanduser()}"
            )
        refuse_wrong_kind(value, "target", param)  # a capture store: named as one
        raise typer.BadParameter(
            f"{value}: no config.json here; pass a transformers model directory"
        )
    if value:
        refuse_wrong_kind(value, "target", param)
    return value


def refuse_wrong_kind(value: str, want: str, param) -> None:
    """A drafter given as target or a target as drafter: `checkpoint.wrong_dir_message`, exit 1."""
    from specdraft.checkpoint import wrong_dir_message

    given_as = param.opts[0] if param is not None and param.param_type_name == "option" else ""
    message = wrong_dir_message(value, want, given_as)
    if message:
        error(SpecdraftError(message))
        raise typer.Exit(1)


def check_checkpoint_dir(value: str, param: typer.CallbackParam = None) -> str:
    """CKPT: an existing directory, not a target model's. A file path is refused; its directory is
    named when it holds a checkpoint (config.json and weights: a path to its model.safetensors)."""

    if not value:  # an optional --draft left out
        return value
    path = Path(value)
    if path.is_file():
        from specdraft.checkpoint import WEIGHT_FILES

        parent = path.parent
        holds = (parent / "config.json").is_file() and any(
            (parent / name).is_file() for name in WEIGHT_FILES
        )
        raise typer.BadParameter(
            f"{value} is a file; pass the checkpoint directory that holds config.json "
            f"and model.safetensors{f' (here: {parent})' if holds else ''}, not the file"
        )
    if not path.is_dir():
        raise typer.BadParameter(
            f"{value}: no such directory; pass a draft checkpoint directory "
            "(config.json and model.safetensors)"
        )
    refuse_wrong_kind(value, "drafter", param)
    return value


def url_option(value: str) -> str:
    """--url / --baseline-url / --endpoint: `client.check_port` as a usage error (exit 2) before
    anything runs; "" (not given) passes."""
    if not value:
        return value
    from specdraft.client import BadURL, check_port

    try:
        check_port(value)
    except BadURL as e:
        raise typer.BadParameter(str(e)) from None
    return value


def check_top_p(value: float) -> float:
    """--top-p: nucleus mass in (0, 1] (SamplingParams' rule), a usage error before anything loads
    (typer's min / max cannot leave 0 out)."""
    if not 0 < value <= 1:
        raise typer.BadParameter(f"{value}: must be in (0, 1] (1 = off)")
    return value


LIST_EXAMPLES = {
    "aux_layers": "2,16,29",
    "topks": "1,2,4",
}  # per option; others: bench --concurrency's


def list_example(param) -> str:
    return LIST_EXAMPLES.get(getattr(param, "name", None), "1,4,16")


def int_list(value: str, param: typer.CallbackParam = None) -> tuple[int, ...]:
    """A comma-separated integer option ("1,4,16") as the tuple the command receives; "" = ()."""
    numbers = []
    for item in value.split(",") if value.strip() else []:
        try:
            numbers.append(int(item))
        except ValueError:
            raise typer.BadParameter(
                f"{value!r}: {item.strip()!r} is not an integer; give comma-separated "
                f"integers, e.g. {list_example(param)}"
            ) from None
    return tuple(numbers)


def positive_int_list(value: str, param: typer.CallbackParam = None) -> tuple[int, ...]:
    """`int_list` of at least one integer, each >= 1 (bench --concurrency, tune --topks)."""
    numbers = int_list(value, param)
    if not numbers or min(numbers) < 1:
        raise typer.BadParameter(
            f"{value!r}: give comma-separated integers >= 1, e.g. {list_example(param)}"
        )
    return numbers


def aux_layer_list(value: str | None, param: typer.CallbackParam = None) -> tuple[int, ...] | None:
    """capture / train --aux-layers: None when left out (the default layers); given empty, a usage error."""
    if value is None:
        return None
    if not value.strip():
        raise typer.BadParameter(
            f"{value!r} is empty; leave --aux-layers out for the default layers "
            f"([2, L//2, L-3] for an L-layer target), or give three layers, e.g. "
            f"{list_example(param)}"
        )
    return int_list(value, param)


def check_sglang_version(value: str) -> str:
    """--sglang-version: "" (not pinned) or a version `conventions.parse_version` reads; a usage
    error naming the value and the form expected otherwise (a typo would silently pin nothing)."""
    from specdraft.conventions import ConventionError, parse_version

    if value:
        try:
            parse_version(value)
        except ConventionError:
            raise typer.BadParameter(f"{value!r} is not a version: write one like 0.5.23") from None
    return value


def aux_override(
    value: str | None, param: typer.CallbackParam = None
) -> tuple[str, tuple[int, ...]] | None:
    """inspect / convert / export / doctor --aux-layers: (convention, ids) (`conventions.split_aux_option`,
    the list parsed as capture's --aux-layers), None when left out."""
    from specdraft.conventions import split_aux_option

    if value is None:
        return None
    try:
        convention, text = split_aux_option(value)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None
    return convention, aux_layer_list(text, param)


def check_drafter(value: str, param: typer.CallbackParam = None) -> str:
    """The drafter of inspect / convert / export's kin and --draft of generate / serve / tune: a
    drafter directory (`check_checkpoint_dir`) or a training checkpoint (RUN/checkpoints/step-N.pt,
    or a sharded step-N directory), both read by `checkpoint.load_draft`."""
    if value:
        from specdraft.checkpoint import SOURCE_FORMS, is_training_checkpoint

        if is_training_checkpoint(value):
            return value
        if not Path(value).exists():
            raise typer.BadParameter(f"{value}: no such file or directory; pass {SOURCE_FORMS}")
        if Path(value).is_file() and Path(value).suffix == ".pt":  # torch.save writes a zip archive
            raise typer.BadParameter(
                f"{value}: not a readable training checkpoint (no torch.save archive: cut "
                f"short or damaged); pass another checkpoint of its run, or {SOURCE_FORMS}"
            )
    return check_checkpoint_dir(value, param)


def check_doctor_drafter(value: str, param: typer.CallbackParam = None) -> str:
    """doctor's CHECKPOINT: a drafter directory (`check_checkpoint_dir`). A training checkpoint is
    refused with the command that makes one from it: doctor checks the files an engine loads."""
    from specdraft.checkpoint import is_training_checkpoint

    if is_training_checkpoint(value):
        raise typer.BadParameter(
            f"{value} is a training checkpoint, which no engine loads; doctor checks the "
            f"files an engine does: export it first (specdraft export {value} OUT --engine "
            "sglang, vllm or speculators), then run doctor on OUT"
        )
    return check_checkpoint_dir(value, param)


def peer_aux_ids(
    value: str | None, param: typer.CallbackParam = None
) -> tuple[str | None, tuple[int, ...]] | None:
    """store convert --aux-layers: (the convention it names, None without a name; the ids), parsed as
    inspect / convert / export / doctor parse theirs (`aux_override`); None when left out."""
    parsed = aux_override(value, param)
    if parsed is None:
        return None
    return (parsed[0] if ":" in value else None), parsed[1]


def json_object(value: str) -> dict | None:
    """--template-kwargs: a JSON object as the dict the command receives; "" (not given) is None."""
    if not value:
        return None
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as e:
        raise typer.BadParameter(
            f"{value!r} is not JSON ({e.msg}); e.g. '{{\"enable_thinking\": false}}'"
        ) from e
    if not isinstance(parsed, dict):
        raise typer.BadParameter("must be a JSON object")
    return parsed


def check_min_speedup(value: float) -> float:
    """--min-speedup: a positive number (TuneConfig's range), a usage error otherwise."""
    if not (math.isfinite(value) and value > 0):
        raise typer.BadParameter(
            f"{value}: must be a positive number, e.g. 1.05 (5 % faster than no speculation)"
        )
    return value
