"""The server's Prometheus metrics, in a registry of their own (`ServerMetrics`).

- Speculative counters under two names: specdraft's (`specdraft:spec_decode_num_drafts`,
  `..._num_draft_tokens`, `..._num_accepted_tokens`, `..._num_accepted_tokens_per_pos{position}`)
  and vLLM's (`vllm:spec_decode_*`, the same four, with vLLM's labels `model_name` = the served
  name and `engine` = "0", and `position` on the per-position one: vllm/v1/spec_decode/metrics.py,
  vllm/v1/metrics/loggers.py), so a dashboard keyed on vLLM's names works unchanged. Both sets
  count the same steps; a scraper reads one prefix (specdraft.client: "specdraft:" on this server).
  prometheus_client exposes a counter with the suffix `_total`, as vLLM does; `position` is
  0-based (0 = first draft). They move only on a speculative engine, for finished requests.
- Requests: vLLM's request metrics (`conventions.vllm_serving.REQUEST_METRICS`: running /
  waiting requests, finished ones by reason, prompt and generated tokens, time to first token,
  inter-token latency, time per output token, end-to-end, queue, inference, prefill and decode
  seconds, with vLLM's buckets) under both prefixes, vLLM's with its labels (`RequestMetrics`);
  requests refused with 429 or cancelled (a disconnect while running or waiting, shutdown) and
  the older `specdraft:time_per_output_token_seconds`: `specdraft:` names only.
- Per batch size (a continuously batching server, `serve.batch_worker`; `watch_batches`), label
  `batch_size`: `specdraft:batch_rounds_total` (rounds run), `specdraft:batch_requests_total`
  (finished requests that ran a round at that size), `specdraft:batch_num_speculative_tokens`
  (the K of its last round, 0 = plain), `specdraft:batch_accept_length` (tau over its rounds'
  rows) and the rows' raw `specdraft:batch_num_verify_steps_total`, `..._num_draft_tokens_total`,
  `..._num_accepted_tokens_total` (to difference between scrapes). vLLM 0.32 has no per-batch-size
  metric (`conventions.vllm_serving`); its `vllm:num_requests_running` counts the batch.
Imports prometheus_client only when built.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from specdraft.conventions.vllm_serving import REQUEST_METRICS
from specdraft.engine.speculate import GenerationResult
from specdraft.serve.responses import FINISH_REASONS

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


class RequestMetrics:
    """vLLM's request metrics (`conventions.vllm_serving.REQUEST_METRICS`) under one prefix,
    `labels` on every sample (vLLM's model_name / engine; none for specdraft's). `metric(name)`:
    the labelled child (a metric with extra labels: the parent, to label further)."""

    def __init__(self, prefix: str, labels: dict[str, str], registry) -> None:
        from prometheus_client import Counter, Gauge, Histogram

        kinds = {"counter": Counter, "gauge": Gauge, "histogram": Histogram}
        self.labels, self.metrics = labels, {}
        for m in REQUEST_METRICS:
            extra = {"buckets": m.buckets} if m.buckets else {}
            metric = kinds[m.kind](
                prefix + m.name, m.doc, [*labels, *m.labels], registry=registry, **extra
            )
            self.metrics[m.name] = metric.labels(**labels) if labels and not m.labels else metric

    def metric(self, name: str):
        """The metric (labelled with `labels` unless it has labels of its own)."""
        return self.metrics[name]

    def set_queue(self, running: int, waiting: int) -> None:
        """The running / waiting gauges."""
        self.metric("num_requests_running").set(running)
        self.metric("num_requests_waiting").set(waiting)

    def record(self, result: GenerationResult, times: RequestTimes) -> None:
        """Count one finished request: tokens, reason, its phases' seconds, its step gaps."""
        reason = FINISH_REASONS[result.finish_reason]
        self.metric("request_success").labels(**self.labels, finished_reason=reason).inc()
        self.metric("prompt_tokens").inc(result.metrics.num_prompt_tokens)
        self.metric("generation_tokens").inc(len(result.token_ids))
        steps = times.steps
        for name, seconds in (
            ("time_to_first_token_seconds", steps[0] - times.arrival),
            ("e2e_request_latency_seconds", steps[-1] - times.arrival),
            ("request_queue_time_seconds", times.start - times.arrival),
            ("request_inference_time_seconds", steps[-1] - times.start),
            ("request_prefill_time_seconds", steps[0] - times.start),
            ("request_decode_time_seconds", steps[-1] - steps[0]),
        ):
            self.metric(name).observe(seconds)
        for a, b in zip(steps, steps[1:]):
            self.metric("inter_token_latency_seconds").observe(b - a)
        if len(result.token_ids) > 1:
            tpot = (steps[-1] - steps[0]) / (len(result.token_ids) - 1)
            self.metric("request_time_per_output_token_seconds").observe(tpot)


@dataclass
class RequestTimes:
    """A request's time.perf_counter() seconds: arrival (queued), start (its generation began),
    steps (each batch of tokens: the prefill's first token, then every verification step)."""

    arrival: float
    start: float
    steps: list[float]


class ServerMetrics:
    """Prometheus metrics in their own CollectorRegistry (names: see the module docstring).
    model_name: the served name (vLLM's `model_name` label); num_positions: draft depth."""

    def __init__(self, num_positions: int, model_name: str = "") -> None:
        from prometheus_client import CollectorRegistry, Counter, Histogram

        self.registry = r = CollectorRegistry()
        vllm_labels = {"model_name": model_name, "engine": VLLM_ENGINE}
        self.spec = [
            SpecCounters("specdraft:", {}, num_positions, r),
            SpecCounters("vllm:", vllm_labels, num_positions, r),
        ]
        self.request_sets = [
            RequestMetrics("specdraft:", {}, r),
            RequestMetrics("vllm:", vllm_labels, r),
        ]
        self.rejected = Counter(
            "specdraft:request_rejected", "Requests refused: queue full (429)", registry=r
        )
        self.cancelled = Counter(
            "specdraft:request_cancelled",
            "Requests stopped by a disconnect, running or waiting, or by shutdown",
            registry=r,
        )
        self.tpot = Histogram(
            "specdraft:time_per_output_token_seconds",
            "(last - first token time) / (tokens - 1), per request",
            buckets=TPOT_BUCKETS,
            registry=r,
        )

    def watch_batches(self, stats: Callable[[], dict]) -> None:
        """Export the per-batch-size metrics (module docstring) of `stats()`: {batch size:
        `engine.batch.BatchStats`}, read at each scrape."""
        self.registry.register(BatchCollector(stats))

    def set_queue(self, running: int, waiting: int) -> None:
        """Requests running and waiting, under both names."""
        for requests in self.request_sets:
            requests.set_queue(running, waiting)

    def record(self, result: GenerationResult, speculative: bool, times: RequestTimes) -> None:
        """Count one finished request (spec counters only on a speculative engine)."""
        if speculative:
            for counters in self.spec:
                counters.record(result)
        for requests in self.request_sets:
            requests.record(result, times)
        if len(result.token_ids) > 1:
            self.tpot.observe((times.steps[-1] - times.steps[0]) / (len(result.token_ids) - 1))


class BatchCollector:
    """A prometheus_client collector of the per-batch-size metrics (module docstring) read
    from `stats()` ({batch size: `engine.batch.BatchStats`}) at every scrape."""

    def __init__(self, stats: Callable[[], dict]) -> None:
        self.stats = stats

    def collect(self) -> Iterator:
        """The families, one sample per batch size that ran a round."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        p, label = "specdraft:batch_", ["batch_size"]
        families = {
            "rounds": CounterMetricFamily(p + "rounds", "Rounds run", labels=label),
            "requests": CounterMetricFamily(
                p + "requests", "Finished requests that ran a round at this size", labels=label
            ),
            "k": GaugeMetricFamily(
                p + "num_speculative_tokens", "K of the last round (0 = plain)", labels=label
            ),
            "tau": GaugeMetricFamily(p + "accept_length", "Tau over the rows", labels=label),
            "steps": CounterMetricFamily(p + "num_verify_steps", "Rows verified", labels=label),
            "drafts": CounterMetricFamily(p + "num_draft_tokens", "Drafts verified", labels=label),
            "accepted": CounterMetricFamily(
                p + "num_accepted_tokens", "Drafts accepted", labels=label
            ),
        }
        for size, stats in sorted(self.stats().items()):
            m, key = stats.metrics, [str(size)]
            values = {
                "rounds": stats.num_rounds,
                "requests": stats.num_requests,
                "k": stats.num_steps,
                "tau": m.accept_length,
                "steps": m.num_verify_steps,
                "drafts": m.num_drafted_tokens,
                "accepted": m.num_accepted_tokens,
            }
            for name, value in values.items():
                families[name].add_metric(key, value)
        yield from families.values()
