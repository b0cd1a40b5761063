"""specdraft: train, export, verify and serve speculative-decoding drafters (EAGLE-3, EAGLE-3.1, DFlash)."""

__version__ = "0.1.0"
