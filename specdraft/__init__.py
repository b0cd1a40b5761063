"""specdraft: train, export, verify and serve EAGLE-3 speculative-decoding drafters."""

__version__ = "0.1.0"
