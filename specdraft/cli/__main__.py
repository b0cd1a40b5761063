"""`torchrun -m specdraft.cli train ...`, `python -m specdraft.cli`."""

from specdraft.cli import app

app()
