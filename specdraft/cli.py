"""The `specdraft` command line: thin typer commands over the library.

Each command builds a config, calls one library function and renders the result with rich.
"""

from __future__ import annotations

import typer

app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)


@app.callback()
def main() -> None:
    """Train, export, verify and serve EAGLE-3 speculative-decoding drafters."""


@app.command()
def version() -> None:
    """Print specdraft's version."""
    from specdraft import __version__

    typer.echo(__version__)
