"""The engine's user errors: what it refuses of a target, a drafter, a request or a setting.

`EngineError` is a `SpecdraftError` (the CLI prints its one line) and a `ValueError` (callers that
catch `ValueError` keep working); `SpecConfigError` (a speculative setting) is in `spec_config`.
Broken internal invariants stay `RuntimeError` / `AssertionError`.
"""

from __future__ import annotations

from specdraft.errors import SpecdraftError


class EngineError(SpecdraftError, ValueError):
    """A target, drafter, request or setting the engine refuses: a drafter that does not fit the
    target, a request longer than its caches allow, a bad sampling parameter, a target config or
    checkpoint the engine cannot run."""


class EngineFileMissing(EngineError, FileNotFoundError):
    """A file the engine loads from a target directory is not there (also a FileNotFoundError)."""
