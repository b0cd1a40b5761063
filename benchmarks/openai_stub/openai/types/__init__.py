"""The stub's `openai.types` (benchmarks/openai_stub/openai/__init__.py)."""
