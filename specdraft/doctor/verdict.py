"""What a check returns: a `Result` (verdict, evidence, fix), and the words checks share.

A check takes the `Evidence` and returns a `Result`; run.py names it after the function. A check
that lacks an input raises `file_evidence.Unavailable`, which becomes a skip with the reason (a skip
is never a pass).
"""

from __future__ import annotations

from dataclasses import dataclass

from specdraft.doctor.keys import ENGINE_NAMES

VERDICTS = ("pass", "fail", "skip")
NUM_AUX = 3  # fc input = 3 x target hidden in SGLang and vLLM


@dataclass(frozen=True)
class Result:
    """What a check concluded: verdict ("pass" | "fail" | "skip"), evidence, fix."""

    verdict: str
    evidence: str
    fix: str = ""

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict {self.verdict!r}: expected one of {VERDICTS}")
        if self.verdict == "skip" and not self.evidence:
            raise ValueError("a skip must say why")


def ok(evidence: str) -> Result:
    """A pass with its evidence."""
    return Result("pass", evidence)


def fail(evidence: str, fix: str) -> Result:
    """A failure with its evidence and the fix."""
    return Result("fail", evidence, fix)


def names_text(names: list[str], limit: int = 8) -> str:
    """The first `limit` names, comma-separated, then how many more."""
    shown = ", ".join(names[:limit])
    return shown + (f" ... (+{len(names) - limit})" if len(names) > limit else "")


def engine_name(engine: str | None) -> str:
    """ "SGLang" | "vLLM" | "specdraft" (engine None)."""
    return ENGINE_NAMES[engine]


def rates_text(values: list[float]) -> str:
    """ "[0.71, 0.52]": rates at two decimals."""
    return "[" + ", ".join(f"{v:.2f}" for v in values) + "]"
