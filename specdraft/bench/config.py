"""What a benchmark sweep measures (`BenchConfig`), and the errors of bench and tune: a setting
or prompts file that cannot work (`BenchInputError`), a sweep that cannot go on (`BenchError`)."""

from __future__ import annotations

from dataclasses import dataclass

from specdraft.client import SERVER_WAIT_S, check_url
from specdraft.errors import SpecdraftError

BUILTIN = "builtin"


class BenchError(SpecdraftError, RuntimeError):
    """A sweep that cannot go on: every request to a server failed at some level."""


class BenchInputError(SpecdraftError, ValueError):
    """A bench or tune input that cannot work: a setting out of range, a prompts file that is
    missing, unreadable or not JSONL, an output path that is a file."""


@dataclass(frozen=True)
class BenchConfig:
    """What to benchmark. url / baseline_url: server base URLs (http://host:port; trailing
    slashes and a trailing /v1 dropped, `check_url`); prompts:
    "builtin" or a JSONL file of the rows `load_prompts` reads (whatever the file's name;
    plain text is refused); concurrency: requests in flight, one level each; num_prompts: requests per
    run of a level (prompts cycled); repeats: runs per level (mean and spread of tokens/s;
    verdicts need MIN_VERDICT_REPEATS);
    max_tokens: per request; tie_band: speedups within 1 +- tie_band are ties, not wins (the
    crossover); wait_s: how long to wait for a server that refuses connections (still
    starting) before failing (`wait_for_server`; 0: try once). Raises BenchInputError (a
    ValueError) for a bad value."""

    url: str
    baseline_url: str | None = None
    prompts: str = BUILTIN
    concurrency: tuple[int, ...] = (1, 4, 16)
    max_tokens: int = 128
    num_prompts: int = 32
    temperature: float = 0.0
    ignore_eos: bool = True
    warmup: int = 1
    timeout_s: float = 600.0
    tie_band: float = 0.05
    repeats: int = 3
    wait_s: float = SERVER_WAIT_S

    def __post_init__(self) -> None:
        for name in ("url", "baseline_url"):
            if getattr(self, name) is not None:  # kept as base URLs (`check_url`)
                object.__setattr__(self, name, check_url(getattr(self, name), name))
        if not self.concurrency or any(c < 1 for c in self.concurrency):
            raise BenchInputError(
                f"concurrency {list(self.concurrency)}: give positive integers, e.g. 1,4,16"
            )
        for name in ("max_tokens", "num_prompts", "repeats"):
            if getattr(self, name) < 1:
                raise BenchInputError(f"{name} {getattr(self, name)}: must be >= 1")
        if (
            self.temperature < 0
            or self.warmup < 0
            or self.timeout_s <= 0
            or not 0 <= self.tie_band < 1
            or self.wait_s < 0
        ):
            raise BenchInputError(
                "temperature, warmup and wait_s must be >= 0, timeout_s > 0, tie_band in [0, 1)"
            )
