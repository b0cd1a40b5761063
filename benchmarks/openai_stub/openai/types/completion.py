"""The stub's `openai.types.completion`: the name speculators/data_generation/vllm_client.py:11
imports."""

from openai import OfflineOnly


class Completion(OfflineOnly):
    """A response type (annotations and isinstance only)."""
