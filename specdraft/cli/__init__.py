"""The `specdraft` command line: thin typer commands over the library.

Each command builds a config, calls one library function and renders the result with rich.
`common` holds the typer app and what the commands share (`command`: the app's class and every
command's); importing a command module registers its commands, in the order `specdraft --help`
lists them.
"""

from specdraft.cli import pipeline, drafter, decode, benchmark, store  # noqa: F401, I001
from specdraft.cli.common import app

__all__ = ["app"]
