"""The stub's `openai.types.chat`: the names speculators/data_generation/vllm_client.py:10 imports."""

from openai import OfflineOnly


class ChatCompletion(OfflineOnly):
    """A response type (annotations and isinstance only)."""


class ChatCompletionMessageParam(OfflineOnly):
    """A message type (annotations only)."""
