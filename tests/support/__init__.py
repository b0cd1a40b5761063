"""Builders and fixtures the test modules share (tiny seeded models and tokenizers, drafters,
servers, worlds); a test module imports from here or gets them from a conftest.py, never from
another test module (tests/README.md)."""
