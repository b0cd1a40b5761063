"""What vLLM's OpenAI server exposes that specdraft's server answers in the same shape: its
Prometheus request metrics (`REQUEST_METRICS`: name, type, buckets) and the bodies of its
tokenizer endpoints (`TOKENIZE_FIELDS`), each with the vLLM file and version it was read from.

Names are without the `vllm:` prefix (specdraft's server exposes every one under `specdraft:` and
`vllm:`); prometheus_client appends `_total` to a counter's samples, as vLLM's do.
"""

from __future__ import annotations

from dataclasses import dataclass

METRICS_SOURCE = "vllm 0.32.0 v1/metrics/loggers.py PrometheusStatLogger"
TOKENIZE_SOURCE = "vllm 0.32.0 entrypoints/serve/tokenize/protocol.py"
VLLM_LABELS = ("model_name", "engine")  # on every vLLM metric (`engine` = the core's index)

# vLLM's buckets (loggers.py): time to first token, inter-token latency / TPOT, request phases
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
TOKEN_LATENCY_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0,
)  # fmt: skip
REQUEST_LATENCY_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
    240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip


@dataclass(frozen=True)
class RequestMetric:
    """One of vLLM's request metrics. kind: "counter" | "gauge" | "histogram"; labels: beyond
    VLLM_LABELS; buckets: a histogram's (None: prometheus_client's defaults)."""

    name: str
    kind: str
    doc: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] | None = None


REQUEST_METRICS: tuple[RequestMetric, ...] = (
    RequestMetric("num_requests_running", "gauge", "Requests running (in the batch)"),
    RequestMetric("num_requests_waiting", "gauge", "Requests in the queue"),
    RequestMetric("request_success", "counter", "Finished requests", labels=("finished_reason",)),
    RequestMetric("prompt_tokens", "counter", "Prompt tokens processed"),
    RequestMetric("generation_tokens", "counter", "Tokens generated"),
    RequestMetric(
        "time_to_first_token_seconds", "histogram", "Arrival to first token", buckets=TTFT_BUCKETS
    ),
    RequestMetric(
        "inter_token_latency_seconds",
        "histogram",
        "Time between a request's consecutive verification steps",
        buckets=TOKEN_LATENCY_BUCKETS,
    ),
    RequestMetric(
        "request_time_per_output_token_seconds",
        "histogram",
        "(last - first token time) / (tokens - 1), per request",
        buckets=TOKEN_LATENCY_BUCKETS,
    ),
    RequestMetric(
        "e2e_request_latency_seconds",
        "histogram",
        "Arrival to the last token",
        buckets=REQUEST_LATENCY_BUCKETS,
    ),
    RequestMetric(
        "request_queue_time_seconds",
        "histogram",
        "Arrival to the start of its generation (waiting in the queue)",
        buckets=REQUEST_LATENCY_BUCKETS,
    ),
    RequestMetric(
        "request_inference_time_seconds",
        "histogram",
        "Start of generation to the last token",
        buckets=REQUEST_LATENCY_BUCKETS,
    ),
    RequestMetric(
        "request_prefill_time_seconds",
        "histogram",
        "Start of generation to the first token",
        buckets=REQUEST_LATENCY_BUCKETS,
    ),
    RequestMetric(
        "request_decode_time_seconds",
        "histogram",
        "First token to the last token",
        buckets=REQUEST_LATENCY_BUCKETS,
    ),
)

# /tokenize and /detokenize bodies (TOKENIZE_SOURCE): request fields -> response fields
TOKENIZE_FIELDS = {
    "tokenize (completion)": (
        ("model", "prompt", "add_special_tokens", "return_token_strs"),
        ("count", "max_model_len", "tokens", "token_strs"),
    ),
    "tokenize (chat)": (
        ("model", "messages", "add_generation_prompt", "add_special_tokens", "return_token_strs"),
        ("count", "max_model_len", "tokens", "token_strs"),
    ),
    "detokenize": (("model", "tokens"), ("prompt",)),
}
