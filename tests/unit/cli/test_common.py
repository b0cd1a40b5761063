"""specdraft.cli.common.config_of: a command's options become the fields of its config by name, and
an option that lands in no field (a renamed field) is a bug, not a silently dropped setting."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from specdraft.cli.common import config_of, option_fields


@dataclass(frozen=True)
class Inner:
    seed: int = 0


@dataclass(frozen=True)
class Outer:
    length: int = 1
    chat: bool = True
    inner: Inner = Inner()


def test_options_become_fields_of_their_name_and_nested_configs():
    params = {"length": 7, "no_chat": True, "seed": 3, "threads": 2}
    inner = Inner(**option_fields(Inner, params))
    cfg = config_of(Outer, params, ("no_chat", "threads"), chat=not params["no_chat"], inner=inner)
    assert cfg == Outer(length=7, chat=False, inner=Inner(seed=3))


def test_an_option_that_maps_to_no_field_is_a_bug():
    params = {"max_length": 7, "seed": 3}  # the field is `length`: --max-length would be dropped
    with pytest.raises(RuntimeError, match=r"\['max_length'\] map to no field of Outer"):
        config_of(Outer, params, inner=Inner(**option_fields(Inner, params)))
    with pytest.raises(RuntimeError, match=r"\['threads'\]"):
        config_of(Outer, {"length": 2, "threads": 1})
