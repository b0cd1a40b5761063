"""A stand-in for the `openai` package where it is not installed, put on the path by
benchmarks/side_by_side_workers.py (`stub_openai`) for speculators 0.9.0's trainer: its training
path imports openai (speculators/train/data.py:8, data_generation/vllm_client.py:9-11) but uses
it only online, against a vLLM endpoint (`_setup_client`); side_by_side.py trains on stored hidden
states. The names it reads at import are here; constructing any of them raises."""


class OfflineOnly:
    """Refused on construction: the stub serves no client."""

    def __init__(self, *args, **kwargs):
        raise RuntimeError(
            "openai is not installed: benchmarks/openai_stub stands in for it, for stored "
            "hidden states only"
        )


class OpenAI(OfflineOnly):
    """speculators/train/data.py:203."""


class Client(OfflineOnly):
    """speculators/data_generation/vllm_client.py:249 (an annotation)."""


class AsyncClient(OfflineOnly):
    """speculators/data_generation/vllm_client.py:195 (an annotation)."""
