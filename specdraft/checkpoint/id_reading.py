"""How to read a drafter's aux ids (`IdReading`): one frozen value, built once from the command's
--target, --aux-layers and --sglang-version (`cli.reading.id_reading`) and passed whole to the
loaders that take it (`engine.load.load_engine`, `serve.server.build_app`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class IdReading:
    """How to read a drafter's aux ids, in the keywords of `checkpoint.load_draft` /
    `convert_draft` (`keywords`): the --target's layer count (None without --target) and class
    (None: the loader's default), the --sglang-version (None: not pinned) and --aux-layers as
    specdraft indices (None: left out)."""

    target_num_layers: int | None = None
    target_class: str | None = None
    sglang_version: str | None = None
    aux_layers: list[int] | None = None

    def keywords(self) -> dict:
        """The loaders' keyword arguments: the fields, without a target_class left to the loader."""
        given = asdict(self)
        if self.target_class is None:
            del given["target_class"]
        return given
