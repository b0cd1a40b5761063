"""specdraft.cli.decode: demo's option group sets the DemoConfig field of each option's name, with
its paths as Paths and a path left out ("") as None."""

from __future__ import annotations

from pathlib import Path

from specdraft.cli.decode import DemoOptions
from specdraft.demo.config import DemoConfig


def options(**given) -> DemoOptions:
    values = dict(
        out="runs/demo",
        device="cpu",
        target="",
        data="docs.txt",
        chat_template="",
        train_steps=7,
        method="dflash",
        block_size=4,
        num_train=12,
        threads=3,
    )
    return DemoOptions(**{**values, **given})


def test_demo_options_set_the_config_fields_of_their_names():
    assert options().config() == DemoConfig(
        out=Path("runs/demo"),
        data=Path("docs.txt"),
        train_steps=7,
        method="dflash",
        block_size=4,
        num_train=12,
        threads=3,
    )


def test_demo_paths_given_are_paths_and_left_out_none():
    cfg = options(target="models/t", data="", chat_template="t.jinja").config()
    assert (cfg.target, cfg.data, cfg.chat_template) == (Path("models/t"), None, Path("t.jinja"))
