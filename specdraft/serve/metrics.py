"""The server's Prometheus metrics, in a registry of their own (`ServerMetrics`).

- Speculative counters under two names: specdraft's (`specdraft:spec_decode_num_drafts`,
  `..._num_draft_tokens`, `..._num_accepted_tokens`, `..._num_accepted_tokens_per_pos{position}`)
  and vLLM's (`vllm:spec_decode_*`, the same four, with vLLM's labels `model_name` = the served
  name and `engine` = "0", and `position` on the per-position one: vllm/v1/spec_decode/metrics.py,
  vllm/v1/metrics/loggers.py), so a dashboard keyed on vLLM's names works unchanged. Both sets
  count the same steps; a scraper reads one prefix (specdraft.client: "specdraft:" on this server).
  prometheus_client exposes a counter with the suffix `_total`, as vLLM does; `position` is
  0-based (0 = first draft). They move only on a speculative engine, for finished requests.
- Requests (finished by reason, refused with 429, cancelled by a disconnect while running or
  waiting), prompt and generated tokens, time to first token, time per output token, waiting /
  running requests: `specdraft:` names only.
Imports prometheus_client only when built.
"""

from __future__ import annotations

from specdraft.engine.speculate import GenerationResult
from specdraft.serve.protocol import FINISH_REASONS

TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0)
SPEC_PREFIXES = ("specdraft:", "vllm:")  # the speculative counters' two names
VLLM_ENGINE = "0"  # vLLM's `engine` label: the engine core's index (one engine here)


class SpecCounters:
    """The four speculative counters under one prefix; `labels` on every sample (vLLM's
    model_name / engine; none for specdraft's)."""

    def __init__(self, prefix: str, labels: dict[str, str], num_positions: int, registry) -> None:
        from prometheus_client import Counter

        names, spec = list(labels), prefix + "spec_decode_"
        self.num_drafts = Counter(
            spec + "num_drafts", "Verification steps (speculative rounds)", names, registry=registry
        )
        self.num_draft_tokens = Counter(
            spec + "num_draft_tokens", "Draft tokens verified", names, registry=registry
        )
        self.num_accepted_tokens = Counter(
            spec + "num_accepted_tokens", "Draft tokens accepted", names, registry=registry
        )
        self.accepted_per_pos = Counter(
            spec + "num_accepted_tokens_per_pos",
            "Accepted drafts at each depth (position 0 = first draft)",
            [*names, "position"],
            registry=registry,
        )
        # the samples each request adds to (a labelled counter's child, exposed at 0 from the start)
        self.totals = [
            c.labels(**labels) if labels else c
            for c in (self.num_drafts, self.num_draft_tokens, self.num_accepted_tokens)
        ]
        self.labels = labels
        for k in range(num_positions):
            self.accepted_per_pos.labels(**labels, position=str(k))

    def record(self, result: GenerationResult) -> None:
        """Add one finished request's speculative counts."""
        m = result.metrics
        for total, value in zip(
            self.totals, (m.num_verify_steps, m.num_drafted_tokens, m.num_accepted_tokens)
        ):
            total.inc(value)
        for k, count in enumerate(m.accepted_per_position):
            self.accepted_per_pos.labels(**self.labels, position=str(k)).inc(count)


class ServerMetrics:
    """Prometheus metrics in their own CollectorRegistry (names: see the module docstring).
    model_name: the served name (vLLM's `model_name` label); num_positions: draft depth."""

    def __init__(self, num_positions: int, model_name: str = "") -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = r = CollectorRegistry()
        self.spec = [
            SpecCounters("specdraft:", {}, num_positions, r),
            SpecCounters(
                "vllm:", {"model_name": model_name, "engine": VLLM_ENGINE}, num_positions, r
            ),
        ]
        self.requests = Counter(
            "specdraft:request_success", "Finished requests", ["finished_reason"], registry=r
        )
        self.rejected = Counter(
            "specdraft:request_rejected", "Requests refused: queue full (429)", registry=r
        )
        self.cancelled = Counter(
            "specdraft:request_cancelled",
            "Requests stopped by a disconnect, running or waiting, or by shutdown",
            registry=r,
        )
        self.prompt_tokens = Counter(
            "specdraft:prompt_tokens", "Prompt tokens processed", registry=r
        )
        self.generation_tokens = Counter(
            "specdraft:generation_tokens", "Tokens generated", registry=r
        )
        self.ttft = Histogram(
            "specdraft:time_to_first_token_seconds", "Arrival to first token", registry=r
        )
        self.tpot = Histogram(
            "specdraft:time_per_output_token_seconds",
            "(last - first token time) / (tokens - 1), per request",
            buckets=TPOT_BUCKETS,
            registry=r,
        )
        self.waiting = Gauge("specdraft:num_requests_waiting", "Requests in the queue", registry=r)
        self.running = Gauge(
            "specdraft:num_requests_running", "Requests running (0 or 1)", registry=r
        )

    def record(
        self, result: GenerationResult, speculative: bool, arrival: float, first: float, end: float
    ) -> None:
        """Count one finished request (spec counters only on a speculative engine)."""
        m = result.metrics
        if speculative:
            for counters in self.spec:
                counters.record(result)
        self.requests.labels(finished_reason=FINISH_REASONS[result.finish_reason]).inc()
        self.prompt_tokens.inc(m.num_prompt_tokens)
        self.generation_tokens.inc(len(result.token_ids))
        self.ttft.observe(first - arrival)
        if len(result.token_ids) > 1:
            self.tpot.observe((end - first) / (len(result.token_ids) - 1))
