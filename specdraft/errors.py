"""The root of every error specdraft raises for bad input.

A `SpecdraftError`'s message is one line for a user: what is wrong, the file or value it is
in, and the fix. The CLI prints it and exits 1, or 2 for an `UnusableInput`
(`specdraft.cli.common.user_errors`); any other exception is a bug and keeps its traceback. Each
stage's error subclasses it, most also as `ValueError` (bad input) so callers that catch
`ValueError` keep working.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

# difflib's similarity from which a mistyped name is taken for a known one (a typo: "rope_thetta",
# "num_key_value_head"); below it the hint would name an unrelated one
CLOSE_NAME_RATIO = 0.8


class SpecdraftError(Exception):
    """Bad input, a damaged file or a refused setting: a one-line message naming the fix."""


class SettingsMismatch(SpecdraftError, ValueError):
    """An output written with other settings than this run's (resuming would mix the two)."""


class UnusableInput(SpecdraftError, ValueError):
    """Input the user must fix before anything can run: an option or option combination that cannot
    work, an output that is the input, a config file that is not valid, a file cut short. The CLI
    exits 2 for it, as click does for a bad option value."""


class DamagedFile(UnusableInput):
    """A file specdraft reads that is cut short or not in its format (a truncated download)."""


def closest_name(name: str, names: Iterable[str]) -> str | None:
    """The one of `names` a mistyped `name` most likely means (difflib, similarity >= CLOSE_NAME_RATIO),
    None when none is that close; for "did you mean" hints."""
    close = difflib.get_close_matches(name, list(names), 1, CLOSE_NAME_RATIO)
    return close[0] if close else None
