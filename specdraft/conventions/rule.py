"""One row of the engine-facts table (`rules.ENGINE_RULES`): how one engine reads explicit aux
ids on one target class, with the engine file and version it was read from."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineRule:
    """How one engine reads explicit aux ids for one target class (and SGLang version range).

    offset: "plus1" (id k = index k+1), "as_is" (id k = index k), "plus1_if_first_is_1" or
    "plus1_unless_last_is_L" (ids as-is when the largest is L, else +1).
    Capturable specdraft indices are lowest..L-top. Versions are [since, until); None = open.
    refuse: why the engine serves no EAGLE-3 drafter on this class (every list is refused), or None.
    """

    engine: str
    target_class: str
    offset: str
    lowest: int
    top: int
    since: tuple[int, ...] | None
    until: tuple[int, ...] | None
    source: str
    evidence: str
    refuse: str | None = None
