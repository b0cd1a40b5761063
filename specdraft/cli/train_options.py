"""`specdraft train`'s options of its training settings, derived from their one declaration
(`train.settings.TrainConfig`'s fields: flag, help, range, choices): each option defaults to None
(not given), so that a --config file or a resumed checkpoint can set it, and its help carries
TrainConfig's default as typer writes one elsewhere (`[default: 8]`)."""

from __future__ import annotations

import inspect
from dataclasses import Field
from typing import Annotated, Literal, Union, get_args, get_origin, get_type_hints

import typer

from specdraft.cli.checks import aux_layer_list
from specdraft.train.settings import TrainConfig, flagged_settings


def setting_option(setting: Field) -> inspect.Parameter:
    """The keyword parameter typer turns into the option of a flagged TrainConfig field: an int,
    float or choice as the field's; a tuple of ints given as a list ("2,3,4", `aux_layer_list`)."""
    option = dict(setting.metadata["option"])
    choices = option.pop("choices", None)
    kind = _value_type(get_type_hints(TrainConfig)[setting.name])
    if choices:
        kind = Literal[choices]
    callback = None
    if get_origin(kind) is tuple:
        kind, callback = str, aux_layer_list
    shown = "" if setting.default is None else f"  [default: {setting.default}]"
    declared = typer.Option(
        setting.metadata["flag"], help=setting.metadata["help"] + shown, callback=callback, **option
    )
    return inspect.Parameter(
        setting.name,
        inspect.Parameter.KEYWORD_ONLY,
        default=None,
        annotation=Annotated[kind | None, declared],
    )


def _value_type(hint):
    """A field's type without None (`int | None` -> int)."""
    if get_origin(hint) in (Union, type(int | None)):
        return next(arg for arg in get_args(hint) if arg is not type(None))
    return hint


def with_settings(after: str):
    """Decorate a typer command taking `**settings`: its signature gets one option per flagged
    TrainConfig field (`setting_option`), listed after its parameter `after`; typer then passes
    the values given (None: not given) as `settings`, keyed by field name."""

    def decorate(command):
        signature = inspect.signature(command, eval_str=True)
        params = [
            p.replace(kind=inspect.Parameter.KEYWORD_ONLY)
            for p in signature.parameters.values()
            if p.kind is not inspect.Parameter.VAR_KEYWORD
        ]
        at = [p.name for p in params].index(after) + 1
        settings = [setting_option(f) for f in flagged_settings()]
        command.__signature__ = signature.replace(parameters=params[:at] + settings + params[at:])
        return command

    return decorate
