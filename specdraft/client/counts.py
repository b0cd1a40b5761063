"""The speculative counters a server exposes: `scrape` reads specdraft's and vLLM's /metrics
(`<prefix>spec_decode_num_drafts`, `..._num_draft_tokens`, `..._num_accepted_tokens`,
`..._num_accepted_tokens_per_pos{position}`, vLLM `v1/spec_decode/metrics.py`); `counter_delta`
turns two scrapes into `SpecCounts`; `sglang_counts` reads SGLang's per-request meta_info
instead (tau = completion_tokens / spec_verify_ct, SGLang's definition; it exposes no
per-position counts)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import httpx

from specdraft.client.requests import RequestRecord
from specdraft.client.servers import METRIC_PREFIX, ClientError, Server, first_line

COUNTERS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens")


@dataclass
class SpecCounts:
    """Raw speculative counts over one level (counter deltas or per-request sums).

    num_drafts: verification steps; num_draft_tokens: drafts verified (None when the server
    does not say); accepted_per_pos: accepted drafts per depth (None when not exposed)."""

    source: str
    num_drafts: float
    num_accepted_tokens: float
    num_draft_tokens: float | None = None
    accepted_per_pos: list[float] | None = None

    @property
    def accept_length(self) -> float:
        """tau = 1 + accepted / drafts (emitted tokens per verification)."""
        return 1.0 + self.num_accepted_tokens / self.num_drafts

    @property
    def acceptance_per_position(self) -> list[float] | None:
        """p_k = accepted at depth k / drafts."""
        if self.accepted_per_pos is None:
            return None
        return [a / self.num_drafts for a in self.accepted_per_pos]

    @property
    def tau_from_positions(self) -> float | None:
        """1 + sum p_k (M1: equals accept_length when the counters agree)."""
        p = self.acceptance_per_position
        return None if p is None else 1.0 + sum(p)

    def to_dict(self) -> dict[str, Any]:
        """Raw counts plus tau, p_k and 1 + sum p_k."""
        return {
            **asdict(self),
            "accept_length": self.accept_length,
            "acceptance_per_position": self.acceptance_per_position,
            "tau_from_positions": self.tau_from_positions,
        }


def scrape_counters(text: str, prefix: str) -> dict[str, Any]:
    """The speculative counters in a Prometheus exposition: {"num_drafts", "num_draft_tokens",
    "num_accepted_tokens": float (summed over label sets), "per_pos": {position: float},
    "exposed": whether any speculative counter is there at all}."""
    from prometheus_client.parser import text_string_to_metric_families

    values: dict[str, Any] = {name: 0.0 for name in COUNTERS}
    values["per_pos"] = {}
    values["exposed"] = False
    base = prefix + "spec_decode_"
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name.removesuffix("_total")
            if not name.startswith(base) or sample.name.endswith("_created"):
                continue
            key = name.removeprefix(base)
            values["exposed"] = True
            if key == "num_accepted_tokens_per_pos":
                pos = int(sample.labels["position"])
                values["per_pos"][pos] = values["per_pos"].get(pos, 0.0) + sample.value
            elif key in COUNTERS:
                values[key] += sample.value
    return values


def counter_delta(before: dict[str, Any], after: dict[str, Any], source: str) -> SpecCounts | None:
    """SpecCounts from two scrapes; None when no verification step happened in between."""
    drafts = after["num_drafts"] - before["num_drafts"]
    if drafts <= 0:
        return None
    positions = sorted(after["per_pos"])
    per_pos = [after["per_pos"][k] - before["per_pos"].get(k, 0.0) for k in positions] or None
    return SpecCounts(
        source,
        drafts,
        after["num_accepted_tokens"] - before["num_accepted_tokens"],
        after["num_draft_tokens"] - before["num_draft_tokens"],
        per_pos,
    )


def scrape(server: Server, timeout_s: float) -> dict[str, Any] | None:
    """The server's speculative counters now (`scrape_counters`; None for kinds without
    Prometheus counters). Raises ClientError naming the URL when /metrics cannot be read."""
    prefix = METRIC_PREFIX.get(server.kind)
    if prefix is None:
        return None
    try:
        response = httpx.get(server.url + "/metrics", timeout=timeout_s)
        response.raise_for_status()
    except httpx.HTTPError as e:
        raise ClientError(f"{server.url}/metrics: {type(e).__name__}: {first_line(e)}") from None
    return scrape_counters(response.text, prefix)


def sglang_counts(records: list[RequestRecord]) -> SpecCounts | None:
    """tau from SGLang's meta_info: completion_tokens / spec_verify_ct summed over requests."""
    metas = [r.usage for r in records if r.usage and r.usage.get("spec_verify_ct")]
    if not metas:
        return None
    verify = sum(int(m["spec_verify_ct"]) for m in metas)
    completion = sum(int(m["completion_tokens"]) for m in metas)
    return SpecCounts(
        "sglang meta_info (completion_tokens / spec_verify_ct)", verify, completion - verify
    )
