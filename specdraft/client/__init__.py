"""A client of OpenAI-compatible servers (specdraft, vLLM, SGLang, any other). The names other
modules import from `specdraft.client` are listed in `__all__`; the modules (DESIGN.md §7):

- `urls`: a server is named by its base URL (`check_url`, `base_url`); paths such as /v1/models,
  /v1/completions, /generate and /metrics are appended to it;
- `servers`: finding a server's kind, model and reported setting (`detect_server`), waiting for one still
  starting (`wait_for_server`);
- `requests`: streamed requests, timed (`send`, `run_requests`, `RequestRecord`);
- `counts`: the speculative counters it exposes (`scrape`, `counter_delta`, `SpecCounts`,
  `sglang_counts`).

Errors a user sees are `ClientError`s and `BadURL`s (`SpecdraftError`s): one line naming the URL.
"""

from __future__ import annotations

from specdraft.client.counts import (
    SpecCounts,
    counter_delta,
    scrape,
    scrape_counters,
    sglang_counts,
)
from specdraft.client.requests import RequestRecord, run_requests, send
from specdraft.client.servers import (
    SERVER_WAIT_S,
    SPECULATIVE_SETTING_KEY,
    ClientError,
    Server,
    ServerUnreachable,
    detect_server,
    wait_for_server,
)
from specdraft.client.urls import MAX_PORT, BadURL, base_url, check_port, check_url

__all__ = [
    "MAX_PORT",
    "SERVER_WAIT_S",
    "SPECULATIVE_SETTING_KEY",
    "BadURL",
    "ClientError",
    "RequestRecord",
    "Server",
    "ServerUnreachable",
    "SpecCounts",
    "base_url",
    "check_port",
    "check_url",
    "counter_delta",
    "detect_server",
    "run_requests",
    "scrape",
    "scrape_counters",
    "send",
    "sglang_counts",
    "wait_for_server",
]
