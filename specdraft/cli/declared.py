"""Command parameters as their options declare them: an option's default declared once with its
type and help (`DeclaredOption`, made by `options.option` / `options.flag`), and options that
commands take together declared once as a frozen dataclass (`OptionGroup`), which the command
receives whole. `declared_signature` turns a command into the function typer reads."""

from __future__ import annotations

import functools
import inspect
from dataclasses import fields
from typing import Annotated, Any, get_args, get_origin, get_type_hints

from typer.models import OptionInfo


class DeclaredOption(OptionInfo):
    """typer's option declaration with the default it declares (`options.option`): every command
    that takes the option names its alias alone (`workers: Workers,`), and `declared_signature`
    gives the parameter this default."""

    def __init__(self, default: Any, declared: OptionInfo) -> None:
        self.__dict__.update(vars(declared))
        self.declared_default = default


class OptionGroup:
    """The base of a frozen dataclass of options that commands take together, each field
    annotated with its option's alias: a command parameter annotated with the class stands, in
    --help and on the command line, for the fields' options in their order, and the command
    receives the dataclass built from them."""


def declared_signature(command):
    """`command` as typer should read it: each `OptionGroup` parameter replaced by its fields'
    options, in place, and each parameter without `= value` whose alias is a `DeclaredOption`
    given its default (a parameter with neither stays required: an argument, or a required
    option), in the `__signature__` of a wrapper that calls `command` with each group built from
    its options. TypeError (a bug) for a parameter with a default in both places."""
    signature = inspect.signature(command, eval_str=True)
    params, groups = [], {}
    for param in signature.parameters.values():
        if isinstance(param.annotation, type) and issubclass(param.annotation, OptionGroup):
            members = _group_params(param.annotation)
            groups[param.name] = (param.annotation, [p.name for p in members])
            params += members
        else:
            params.append(_with_default(command.__name__, param))

    @functools.wraps(command)
    def run(**given):
        for name, (group, names) in groups.items():
            given[name] = group(**{field: given.pop(field) for field in names})
        return command(**given)

    run.__signature__ = signature.replace(
        parameters=[p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in params]
    )
    return run


def _group_params(group: type) -> list[inspect.Parameter]:
    """The options of an `OptionGroup` dataclass, one keyword parameter per field."""
    hints = get_type_hints(group, include_extras=True)
    return [
        _with_default(
            group.__name__,
            inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, annotation=hints[f.name]),
        )
        for f in fields(group)
    ]


def _with_default(owner: str, param: inspect.Parameter) -> inspect.Parameter:
    """`param` with the default its `DeclaredOption` declares, if it has one."""
    declared = _declared(param.annotation)
    if declared is None:
        return param
    if param.default is not param.empty:
        raise TypeError(f"{owner}({param.name}): a default in both places")
    return param.replace(default=declared.declared_default)


def _declared(annotation) -> DeclaredOption | None:
    """The `DeclaredOption` of an `Annotated` alias, or None."""
    if get_origin(annotation) is not Annotated:
        return None
    items = get_args(annotation)[1:]
    return next((item for item in items if isinstance(item, DeclaredOption)), None)
