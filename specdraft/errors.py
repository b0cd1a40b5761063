"""The root of every error specdraft raises for bad input.

A `SpecdraftError`'s message is one line for a user: what is wrong, the file or value it is
in, and the fix. The CLI prints it and exits 1 (`specdraft.cli.common.run_command`); any other
exception is a bug and keeps its traceback. Each stage's error subclasses it, most also as
`ValueError` (bad input) so callers that catch `ValueError` keep working.
"""

from __future__ import annotations


class SpecdraftError(Exception):
    """Bad input, a damaged file or a refused setting: a one-line message naming the fix."""


class SettingsMismatch(SpecdraftError, ValueError):
    """An output written with other settings than this run's (resuming would mix the two)."""


class DamagedFile(SpecdraftError, ValueError):
    """A file specdraft reads that is cut short or not in its format (a truncated download)."""
