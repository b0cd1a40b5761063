"""The `specdraft` command line: thin typer commands over the library.

Each command builds a config, calls one library function and renders the result with rich.
`common` holds the typer app and what the commands share (`command`: the app's class and every
command's), `options` the options more than one command takes, each declared once (`checks`: their
callbacks); importing a command module registers its commands, in the order `specdraft --help`
lists them.
"""

from specdraft.cli import pipeline, training, drafter, convert  # noqa: F401, I001
from specdraft.cli import deploy, decode, serve, benchmark, tune, store  # noqa: F401, I001
from specdraft.cli.common import app

__all__ = ["app"]
