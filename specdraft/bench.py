"""Benchmark a serving engine with speculation against the same engine without it.

`run_bench` sends the same prompts to a server (specdraft, vLLM, SGLang or any OpenAI-compatible
one) and to an optional baseline server, streaming, at each concurrency of a sweep, `repeats`
times per level. After warm-up requests to each server, each level is measured on both servers
before the next level starts, its runs alternating between them (speculative run 1, baseline
run 1, speculative run 2, ...), so load drift on the machine reaches both servers alike. It
reports:
- output tokens/s per run (completion tokens / wall time of the run), with its mean, standard
  deviation and range over the runs; TTFT and TPOT over the requests of all runs (mean, p50,
  p99; TPOT = (latency - TTFT) / (tokens - 1) per request);
- accept length tau and per-position acceptance p_k from raw counter deltas around each level:
  specdraft's and vLLM's /metrics (`<prefix>spec_decode_num_drafts`, `..._num_draft_tokens`,
  `..._num_accepted_tokens`, `..._num_accepted_tokens_per_pos{position}`, vLLM
  `v1/spec_decode/metrics.py`): tau = 1 + accepted / drafts, p_k = accepted at position k-1 /
  drafts, and tau = 1 + sum p_k is checked (M1). SGLang: the native `/generate` endpoint's
  `meta_info` per request: tau = completion_tokens / spec_verify_ct (SGLang's definition; it
  counts the prefill's token, and SGLang exposes no per-position counts);
- speedup = mean tokens/s with speculation / mean tokens/s of the baseline at the same
  concurrency, its standard deviation (propagated from the runs' spreads), a verdict per level
  (wins / ties / loses: the speedup must clear 1 by more than both the tie band and that
  deviation; marked inconclusive where either server's runs spread more than NOISY_SPREAD of
  their mean, `noisy_runs`, with a line naming the numbers, `noise_note`), and the crossover:
  the first concurrency at which speculation stops winning (FC-13; `find_crossover`, a pure
  function of the points). Without a baseline the report says
  "no baseline: speedup not measured": speculation is never called a win without one
  (DESIGN.md invariant 6). With one run per level the speedups are printed without verdict or
  crossover (no spread to judge them by: `NO_VERDICT`). A baseline that speculates itself (its
  own speculative counters or usage show drafts accepted) gets a one-line warning
  (`baseline_warning`): the comparison is then speculation vs speculation. The mirror: a
  measured server whose own signals show no speculation (specdraft / vLLM spec counters exposed
  but still, specdraft usage with no drafted tokens, SGLang spec_verify_ct 0, or accept length 1)
  gets a one-line warning too (`speculation_warning`); a server without such signals gets none.
bench.json keeps the fields of single-run reports (`tokens_per_s` is now the mean over runs,
`speedups[].speedup` the ratio of means) and adds `num_runs`, `tokens_per_s_std`,
`tokens_per_s_runs`, `speedups[].speedup_std`, `speedups[].verdict` (null with one run; the
verdict of the means), `speedups[].noise` (null unless the runs are too noisy to judge) and
`baseline_warning` (null unless the baseline speculates), `speculation_warning` (null unless
the measured server shows no speculation), `failed_requests_warning` (null unless some request
failed) and per level `no_spec_signal`. A level with a failed request on either server has no
valid speedup: its row says "invalid: N errors" (bench.json: `speedups[].num_errors`, verdict
"invalid: N errors", `valid` false and `speedup` / `speedup_std` / `noise` null; every valid
entry has `valid` true), it sets no verdict or crossover (the crossover sentence then speaks of
"every valid concurrency" and names the levels left out), and `failed_requests_warning` names it.
Each server's tokens/s cell at such a level reads "invalid (N of M failed)", and throughput.png
and tpot.png leave that point out (`plot_data`).
An interrupted sweep (Ctrl-C) keeps what it measured: `run_bench` fills a `Sweep` level by level,
a level once it is finished on every server, and `partial_report` turns those levels into a
report (every level completed before the interrupt) whose bench.json has
`partial` true, `interrupted_at_concurrency` and `concurrency_not_measured` (complete reports:
false, null, []) and whose bench.md starts with a line naming the levels not measured.
Requests use temperature 0 and ignore_eos (vLLM / SGLang / specdraft extension) by default, so
both servers generate max_tokens tokens for every prompt.
Each server is waited for (`wait_for_server`): while nothing accepts connections at its URL (a
server started with `&` and still loading), bench retries for up to `BenchConfig.wait_s` seconds,
then fails with one line naming the URL, the wait and the fix.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any

import httpx
import numpy as np

BUILTIN = "builtin"
NO_BASELINE = "no baseline: speedup not measured"
ALL_INVALID = "every concurrency measured had failed requests, so no speedup is valid"
METRIC_PREFIX = {"specdraft": "specdraft:", "vllm": "vllm:"}
COUNTERS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens")
# Two runs are the fewest with a spread (a sample standard deviation); a verdict must clear that
# spread, so a shaky two-run spread turns a level into a tie, never into a false win.
MIN_VERDICT_REPEATS = 2
NO_VERDICT = (f"no verdict: one run per level has no run-to-run spread to tell a win from noise; "
              f"a verdict needs --repeats {MIN_VERDICT_REPEATS} or more (the default 3 gives a steadier spread)")
# A server whose per-run tokens/s spread more than this fraction of their mean (sample sd / mean)
# measured a busy machine more than itself: a verdict at that level is inconclusive.
NOISY_SPREAD = 0.25
# OpenAI / SGLang endpoint paths: a server URL ending in one (http://host:8000/v1/completions) is
# refused (`check_url`); bench and doctor take the base URL and append the paths they need.
API_PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/models", "/generate")
# Seconds to wait for a server that refuses connections (still starting) before giving up.
SERVER_WAIT_S = 120.0
SERVER_POLL_S = 0.5


@dataclass(frozen=True)
class BenchConfig:
    """What to benchmark. url / baseline_url: server base URLs (http://host:port; trailing
    slashes and a trailing /v1 dropped, `check_url`); prompts:
    "builtin" or a JSONL file (rows {"prompt": text} or JSON strings, whatever the file's
    name; plain text is refused); concurrency: requests in flight, one level each; num_prompts: requests per
    run of a level (prompts cycled); repeats: runs per level (mean and spread of tokens/s;
    verdicts need MIN_VERDICT_REPEATS);
    max_tokens: per request; tie_band: speedups within 1 +- tie_band are ties, not wins (the
    crossover); wait_s: how long to wait for a server that refuses connections (still
    starting) before failing (`wait_for_server`; 0: try once). Raises ValueError for a bad value."""

    url: str
    baseline_url: str | None = None
    prompts: str = BUILTIN
    concurrency: tuple[int, ...] = (1, 4, 16)
    max_tokens: int = 128
    num_prompts: int = 32
    temperature: float = 0.0
    ignore_eos: bool = True
    warmup: int = 1
    timeout_s: float = 600.0
    tie_band: float = 0.05
    repeats: int = 3
    wait_s: float = SERVER_WAIT_S

    def __post_init__(self) -> None:
        for name in ("url", "baseline_url"):
            if getattr(self, name) is not None:  # kept as base URLs (`check_url`)
                object.__setattr__(self, name, check_url(getattr(self, name), name))
        if not self.concurrency or any(c < 1 for c in self.concurrency):
            raise ValueError(f"concurrency {list(self.concurrency)}: give positive integers, e.g. 1,4,16")
        for name in ("max_tokens", "num_prompts", "repeats"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} {getattr(self, name)}: must be >= 1")
        if (self.temperature < 0 or self.warmup < 0 or self.timeout_s <= 0 or not 0 <= self.tie_band < 1
                or self.wait_s < 0):
            raise ValueError("temperature, warmup and wait_s must be >= 0, timeout_s > 0, tie_band in [0, 1)")


def check_url(url: str, name: str = "url") -> str:
    """A server base URL as bench and doctor take it: http:// or https://, else ValueError (one
    line naming the option `name` and the fix), as is a URL with no host or one whose path ends
    in an endpoint (`API_PATHS`, e.g. http://host:8000/v1/completions: the error names the base
    URL http://host:8000 to give instead). Returns the base URL (`base_url`: without trailing
    slashes and one trailing /v1 segment, as regenerate takes --endpoint: http://host:8000/v1/ is
    http://host:8000), to which paths such as /v1/models and /metrics are appended."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() not in ("http", "https"):
        example = f"http://{rest}" if sep else f"http://{url}"
        raise ValueError(f"{name} {url!r}: must start with http:// or https:// (e.g. {example})")
    base = base_url(url)
    host, _, path = base.partition("://")[2].partition("/")
    if not host:
        raise ValueError(f"{name} {url!r}: no host; give the server's URL, e.g. http://127.0.0.1:8000")
    endpoint = next((p for p in API_PATHS if f"/{path}".endswith(p)), None)
    if endpoint:
        raise ValueError(f"{name} {url!r} ends in the endpoint {endpoint} (bench and doctor add the paths they "
                         f"need); give the server's base URL {base_url(base.removesuffix(endpoint))}")
    return base


def base_url(url: str) -> str:
    """`url` without trailing slashes and one trailing /v1 path segment (the OpenAI API root that
    vLLM, SGLang and OpenAI clients are given): "http://h:8000/v1/" -> "http://h:8000"; a host
    named v1 is kept ("http://v1" stays)."""
    scheme, sep, rest = url.partition("://")
    rest = rest.rstrip("/")
    if "/" in rest and rest.endswith("/v1"):  # a path segment, not the host
        rest = rest.removesuffix("/v1").rstrip("/")
    return scheme + sep + rest


PROMPT_ROW = '{"prompt": "<text>"} or a JSON string'


def load_prompts(source: str) -> list[str]:
    """Prompts from "builtin" (specdraft/assets/bench_prompts.jsonl: short stories and code) or
    a JSONL file (any name) of {"prompt": text} rows or JSON strings. Raises ValueError naming
    the file and line of a bad row (plain text included), or for no prompts."""
    if source == BUILTIN:
        text, name = (resources.files("specdraft.assets") / "bench_prompts.jsonl").read_text(), "builtin"
    else:
        path = Path(source)
        if not path.is_file():
            raise ValueError(f"{source}: prompt file not found (give a JSONL file or 'builtin')")
        text, name = path.read_text(), str(path)
    prompts = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        prompts.append(prompt_of_row(line, name, number))
    if not prompts:
        raise ValueError(f"{name}: no prompts")
    return prompts


def prompt_of_row(line: str, name: str, number: int) -> str:
    """The prompt of one JSONL row: {"prompt": text} or a JSON string."""
    try:
        row = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"{name}:{number}: not JSON ({e.msg}); a prompts file is JSONL, one {PROMPT_ROW} "
                         "per line") from None
    prompt = row.get("prompt") if isinstance(row, dict) else row
    if not isinstance(prompt, str) or not prompt:
        raise ValueError(f"{name}:{number}: expected {PROMPT_ROW} per line")
    return prompt


# ---- speculative counts -----------------------------------------------------------------------
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
        return {**asdict(self), "accept_length": self.accept_length,
                "acceptance_per_position": self.acceptance_per_position,
                "tau_from_positions": self.tau_from_positions}


def scrape_counters(text: str, prefix: str) -> dict[str, Any]:
    """The speculative counters in a Prometheus exposition: {"num_drafts", "num_draft_tokens",
    "num_accepted_tokens": float (summed over label sets), "per_pos": {position: float}}."""
    from prometheus_client.parser import text_string_to_metric_families

    values: dict[str, Any] = {name: 0.0 for name in COUNTERS}
    values["per_pos"] = {}
    values["exposed"] = False  # whether the exposition has any speculative counter at all
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
    return SpecCounts(source, drafts, after["num_accepted_tokens"] - before["num_accepted_tokens"],
                      after["num_draft_tokens"] - before["num_draft_tokens"], per_pos)


# ---- requests ---------------------------------------------------------------------------------
@dataclass
class RequestRecord:
    """One request: TTFT (first text), latency, completion tokens, usage / meta_info or error."""

    ttft_s: float | None
    latency_s: float
    num_tokens: int
    usage: dict[str, Any] | None = None
    error: str | None = None


@dataclass(frozen=True)
class Server:
    """A server under test: base URL, kind (specdraft | vllm | sglang | openai), served model."""

    url: str
    kind: str
    model: str


class ServerUnreachable(RuntimeError):
    """Nothing accepted a connection at the URL (refused or connect timeout): no server there,
    or one still starting. `cause`: the connection error's text."""

    def __init__(self, message: str, cause: str) -> None:
        super().__init__(message)
        self.cause = cause


def detect_server(url: str, timeout_s: float = 30.0, connect_timeout_s: float | None = None) -> Server:
    """Find the server's kind (from its /metrics prefix, else SGLang's /get_model_info) and the
    model it serves (/v1/models). url: as `check_url` takes it (a trailing /v1 is dropped: the
    paths here include it). connect_timeout_s: for opening connections (default timeout_s).
    Raises ServerUnreachable (a RuntimeError) when nothing accepts the connection, RuntimeError
    when the server does not answer /v1/models, or for a URL `check_url` refuses."""
    try:
        url = check_url(url)
    except ValueError as e:  # e.g. a URL without http://
        raise RuntimeError(str(e)) from None
    timeout = httpx.Timeout(timeout_s, connect=timeout_s if connect_timeout_s is None else connect_timeout_s)
    with httpx.Client(base_url=url, timeout=timeout) as client:
        try:
            listing = client.get("/v1/models")
            listing.raise_for_status()
            model = listing.json()["data"][0]["id"]
        except (httpx.ConnectError, httpx.ConnectTimeout) as e:
            raise ServerUnreachable(f"{url}: no OpenAI-compatible /v1/models ({e})", str(e)) from None
        except (httpx.HTTPError, KeyError, IndexError, ValueError) as e:
            raise RuntimeError(f"{url}: no OpenAI-compatible /v1/models ({e})") from None
        metrics = client.get("/metrics")
        text = metrics.text if metrics.status_code == 200 else ""
        for kind, prefix in (*METRIC_PREFIX.items(), ("sglang", "sglang:")):
            if prefix in text:
                return Server(url, kind, model)
        if client.get("/get_model_info").status_code == 200:
            return Server(url, "sglang", model)
    return Server(url, "openai", model)


def wait_for_server(url: str, wait_s: float = SERVER_WAIT_S, timeout_s: float = 30.0, option: str = "--url",
                    poll_s: float = SERVER_POLL_S, on_wait: Callable[[str], None] | None = None) -> Server:
    """`detect_server`, retried every poll_s seconds while nothing accepts connections at `url`
    (a server started in the background and still loading), for at most wait_s seconds (0: one
    try). on_wait: told once, in one line, when the first try is refused. Raises RuntimeError when
    the connection is still refused after wait_s: one line naming the URL, the wait and the fix
    (`option`: the flag that gave the URL); other failures (a server that answers, but not
    /v1/models) are raised at once."""
    start = time.monotonic()
    deadline, told = start + wait_s, on_wait is None
    while True:
        left = deadline - time.monotonic()
        try:  # an unanswered connect must not outlast the wait
            return detect_server(url, timeout_s, min(timeout_s, max(left, poll_s)))
        except ServerUnreachable as e:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError(f"{url}: no server answered ({e.cause}) after waiting "
                                   f"{time.monotonic() - start:.0f} s; is the server running? start it "
                                   f"(e.g. specdraft serve ... &) or pass the right {option}") from None
            if not told:
                told = True
                on_wait(f"{url}: not accepting connections yet ({e.cause}); waiting up to {wait_s:.0f} s "
                        "for it to start")
            time.sleep(min(poll_s, left))


def request_body(server: Server, prompt: str, cfg: BenchConfig) -> tuple[str, dict[str, Any]]:
    """(path, JSON body): SGLang's native /generate, else streamed /v1/completions with usage."""
    if server.kind == "sglang":
        params = {"temperature": cfg.temperature, "max_new_tokens": cfg.max_tokens,
                  "ignore_eos": cfg.ignore_eos}
        return "/generate", {"text": prompt, "sampling_params": params, "stream": True}
    body = {"model": server.model, "prompt": prompt, "max_tokens": cfg.max_tokens,
            "temperature": cfg.temperature, "stream": True, "stream_options": {"include_usage": True}}
    if server.kind != "openai" and cfg.ignore_eos:
        body["ignore_eos"] = True
    return "/v1/completions", body


async def send(client: httpx.AsyncClient, server: Server, prompt: str, cfg: BenchConfig) -> RequestRecord:
    """Stream one request; time the first text and the end."""
    path, body = request_body(server, prompt, cfg)
    start, first, chunks, last = time.perf_counter(), None, 0, {}
    try:
        async with client.stream("POST", path, json=body) as response:
            if response.status_code != 200:
                detail = (await response.aread()).decode(errors="replace")[:300]
                return RequestRecord(None, time.perf_counter() - start, 0, error=f"HTTP {response.status_code}: {detail}")
            async for line in response.aiter_lines():
                if not line.startswith("data:") or line.strip() == "data: [DONE]":
                    continue
                event = json.loads(line[5:])
                if "error" in event:
                    return RequestRecord(None, time.perf_counter() - start, 0, error=str(event["error"]))
                text = event.get("text", "") if server.kind == "sglang" else "".join(
                    c.get("text") or "" for c in event.get("choices", []))
                if text and first is None:
                    first = time.perf_counter()
                chunks += bool(text)
                last = event.get("meta_info") or event.get("usage") or last
    except (httpx.HTTPError, json.JSONDecodeError) as e:
        return RequestRecord(None, time.perf_counter() - start, 0, error=f"{type(e).__name__}: {e}")
    tokens = int(last.get("completion_tokens", chunks))
    return RequestRecord(first and first - start, time.perf_counter() - start, tokens, last or None)


async def run_requests(server: Server, prompts: list[str], concurrency: int,
                       cfg: BenchConfig) -> tuple[list[RequestRecord], float]:
    """Send all prompts with `concurrency` in flight; (records, wall seconds)."""
    limits = httpx.Limits(max_connections=concurrency + 1)
    async with httpx.AsyncClient(base_url=server.url, timeout=cfg.timeout_s, limits=limits) as client:
        gate = asyncio.Semaphore(concurrency)

        async def one(prompt: str) -> RequestRecord:
            async with gate:
                return await send(client, server, prompt, cfg)

        start = time.perf_counter()
        records = await asyncio.gather(*(one(p) for p in prompts))
        return list(records), time.perf_counter() - start


# ---- one server -------------------------------------------------------------------------------
@dataclass
class Stats:
    """mean, p50 and p99 of a sample (seconds); None for an empty sample."""

    mean: float | None
    p50: float | None
    p99: float | None

    @classmethod
    def of(cls, values: list[float]) -> Stats:
        """Stats of `values`."""
        if not values:
            return cls(None, None, None)
        a = np.asarray(values, dtype=float)
        return cls(float(a.mean()), float(np.percentile(a, 50)), float(np.percentile(a, 99)))


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """(mean, sample standard deviation) of a non-empty sample; the deviation of one value is 0."""
    a = np.asarray(values, dtype=float)
    return float(a.mean()), float(a.std(ddof=1)) if len(a) > 1 else 0.0


def noisy_runs(runs_by_server: dict[str, Sequence[float]], limit: float = NOISY_SPREAD) -> str | None:
    """The servers whose per-run tokens/s spread more than `limit` of their mean (sample sd /
    mean), as "speculative 452 ± 597 tok/s (sd/mean 1.32)" joined by "; "; None when every
    server's runs are steady (one run has no spread)."""
    noisy = []
    for name, runs in runs_by_server.items():
        mean, std = mean_std(runs)
        if mean > 0 and std / mean > limit:
            noisy.append(f"{name} {mean:.0f} ± {std:.0f} tok/s (sd/mean {std / mean:.2f})")
    return "; ".join(noisy) or None


@dataclass
class LevelResult:
    """One server at one concurrency, over `num_runs` runs of the same requests.

    num_requests, num_errors, duration_s, num_output_tokens: totals over the runs;
    tokens_per_s: mean over the runs of (completion tokens / wall seconds of the run), with
    tokens_per_s_std (sample standard deviation, 0 for one run) and every run's value in
    tokens_per_s_runs; TTFT, TPOT: over the requests of all runs; spec: counts over all runs."""

    concurrency: int
    num_requests: int
    num_errors: int
    duration_s: float
    num_output_tokens: int
    tokens_per_s: float
    ttft_s: Stats
    tpot_s: Stats
    spec: SpecCounts | None
    usage_accept_length: float | None = None  # from specdraft's per-response usage
    first_error: str | None = None
    num_runs: int = 1
    tokens_per_s_std: float = 0.0
    tokens_per_s_runs: list[float] = field(default_factory=list)
    no_spec_signal: str | None = None  # the server's own signal that it did not speculate here

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        d = asdict(self)
        d["spec"] = self.spec.to_dict() if self.spec else None
        return d


@dataclass
class ServerRun:
    """All levels of one server."""

    url: str
    kind: str
    model: str
    levels: list[LevelResult] = field(default_factory=list)

    @classmethod
    def of(cls, server: Server) -> ServerRun:
        """A run of `server` with no level measured yet."""
        return cls(server.url, server.kind, server.model)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {"url": self.url, "kind": self.kind, "model": self.model,
                "levels": [level.to_dict() for level in self.levels]}


def scrape(server: Server, timeout_s: float) -> dict[str, Any] | None:
    """The server's speculative counters now (None for kinds without Prometheus counters)."""
    prefix = METRIC_PREFIX.get(server.kind)
    if prefix is None:
        return None
    response = httpx.get(server.url + "/metrics", timeout=timeout_s)
    response.raise_for_status()
    return scrape_counters(response.text, prefix)


def level_result(server: Server, concurrency: int, runs: list[tuple[list[RequestRecord], float]],
                 before: dict[str, Any] | None, after: dict[str, Any] | None) -> LevelResult:
    """Aggregate the runs (records, wall seconds) of one level; before / after: the server's
    counters (`scrape`) around the level (None for kinds without them). Raises RuntimeError
    when every request failed."""
    records = [r for run, _ in runs for r in run]
    ok = [r for r in records if r.error is None]
    if not ok:
        raise RuntimeError(f"{server.url}: every request failed at concurrency {concurrency}: "
                           f"{records[0].error}")
    tpot = [(r.latency_s - r.ttft_s) / (r.num_tokens - 1) for r in ok if r.ttft_s is not None and r.num_tokens > 1]
    tokens = sum(r.num_tokens for r in ok)
    per_run = [sum(r.num_tokens for r in run if r.error is None) / duration for run, duration in runs]
    tps, tps_std = mean_std(per_run)
    spec = counter_delta(before, after, f"{server.kind} /metrics") if before is not None else None
    if server.kind == "sglang":
        spec = sglang_counts(ok)
    usage = [r.usage for r in ok if r.usage and "num_drafts" in r.usage]
    drafts = sum(u["num_drafts"] for u in usage)
    usage_tau = 1 + sum(u["num_accepted_tokens"] for u in usage) / drafts if drafts else None
    errors = [r.error for r in records if r.error is not None]
    no_spec = None
    if server.kind == "sglang" and spec is None and any(r.usage and "spec_verify_ct" in r.usage for r in ok):
        no_spec = "sglang meta_info (spec_verify_ct 0)"
    elif usage and spec is None and not sum(u.get("num_draft_tokens") or 0 for u in usage):
        no_spec = "usage (no drafted tokens)"
    elif spec is None and before is not None and before["exposed"]:
        no_spec = f"{server.kind} /metrics (speculative counters did not move)"
    return LevelResult(concurrency, len(records), len(errors), sum(d for _, d in runs), tokens, tps,
                       Stats.of([r.ttft_s for r in ok if r.ttft_s is not None]), Stats.of(tpot), spec,
                       usage_tau, errors[0] if errors else None, len(runs), tps_std, per_run, no_spec)


def sglang_counts(records: list[RequestRecord]) -> SpecCounts | None:
    """tau from SGLang's meta_info: completion_tokens / spec_verify_ct summed over requests."""
    metas = [r.usage for r in records if r.usage and r.usage.get("spec_verify_ct")]
    if not metas:
        return None
    verify = sum(int(m["spec_verify_ct"]) for m in metas)
    completion = sum(int(m["completion_tokens"]) for m in metas)
    return SpecCounts("sglang meta_info (completion_tokens / spec_verify_ct)", verify, completion - verify)


def warm_up(server: Server, batch: list[str], cfg: BenchConfig) -> None:
    """Send the first `cfg.warmup` prompts of `batch` to `server`, one at a time, untimed (first
    requests pay for compilation and caches)."""
    if cfg.warmup:
        asyncio.run(run_requests(server, batch[:cfg.warmup], 1, cfg))


def measure_level(servers: Sequence[Server], batch: list[str], concurrency: int,
                  cfg: BenchConfig) -> list[LevelResult]:
    """One concurrency level on every server of `servers` (the speculative one, then the
    baseline), its `cfg.repeats` runs interleaved: run 1 on each server in turn, then run 2,
    and so on, so load drift on the machine during the level reaches every server alike. Each
    server's counters are read before and after the whole level (`scrape`: a server counts
    only its own requests). Returns one LevelResult per server, in order; raises RuntimeError
    (`level_result`) when every request to a server failed."""
    before = [scrape(server, cfg.timeout_s) for server in servers]
    runs: list[list[tuple[list[RequestRecord], float]]] = [[] for _ in servers]
    for _ in range(cfg.repeats):
        for server, server_runs in zip(servers, runs):
            server_runs.append(asyncio.run(run_requests(server, batch, concurrency, cfg)))
    after = [scrape(server, cfg.timeout_s) for server in servers]
    return [level_result(server, concurrency, server_runs, b, a)
            for server, server_runs, b, a in zip(servers, runs, before, after)]


def level_line(role: str, server: Server, level: LevelResult) -> str:
    """The progress line of one server's level: "speculative http://h:8000 (vllm) concurrency 4:
    812.3 ± 4.1 (806.0-816.2) tok/s, tau 2.310" (role: "speculative" or "baseline")."""
    tau = f", tau {level.spec.accept_length:.3f}" if level.spec else ""
    tps = (f"invalid: {level.num_errors} of {level.num_requests} requests FAILED" if level.num_errors
           else f"{tps_cell(level)} tok/s")
    return f"{role} {server.url} ({server.kind}) concurrency {level.concurrency}: {tps}{tau}"


# ---- comparison and report --------------------------------------------------------------------
@dataclass(frozen=True)
class SpeedupPoint:
    """Speculation against the baseline at one concurrency. speedup: mean tokens/s with
    speculation / mean tokens/s of the baseline; speedup_std: its standard deviation from the
    runs' spreads (first order: the relative variances add; 0 with one run each); noise:
    `noisy_runs` of both servers' runs (None when steady: else no verdict there is conclusive)."""

    concurrency: int
    speedup: float
    speedup_std: float = 0.0
    noise: str | None = None
    num_errors: int = 0  # failed requests on both servers at this level: the speedup is then invalid

    @classmethod
    def of(cls, concurrency: int, spec_runs: Sequence[float], baseline_runs: Sequence[float],
           num_errors: int = 0) -> SpeedupPoint:
        """The point of the per-run tokens/s of both servers at `concurrency`."""
        (spec_mean, spec_std), (base_mean, base_std) = mean_std(spec_runs), mean_std(baseline_runs)
        speedup = spec_mean / base_mean
        relative = math.hypot(spec_std / spec_mean if spec_mean else 0.0, base_std / base_mean)
        noise = noisy_runs({"speculative": spec_runs, "baseline": baseline_runs})
        return cls(concurrency, speedup, speedup * relative, noise, num_errors)

    def text(self) -> str:
        """"1.23x", or "1.23x ± 0.04" when the runs spread."""
        return f"{self.speedup:.2f}x" + (f" ± {self.speedup_std:.2f}" if self.speedup_std else "")


def verdict(point: SpeedupPoint, tie_band: float = 0.0) -> str:
    """"wins", "loses" or "ties" at one point: speculation wins (loses) only when its mean
    tokens/s is above (below) the baseline's by more than tie_band and by more than the
    speedup's standard deviation; anything closer is run-to-run noise."""
    margin = max(tie_band, point.speedup_std)
    if point.speedup > 1.0 + margin:
        return "wins"
    return "loses" if point.speedup < 1.0 - margin else "ties"


@dataclass
class Crossover:
    """Where speculation stops winning: the first concurrency with no win after a win (None
    when no win is followed by a non-win: it wins everywhere, never wins, only starts winning
    at some concurrency and keeps winning, or there is no baseline). text: the plain sentence."""

    concurrency: int | None
    text: str


def margin_text(tie_band: float, noisy: bool) -> str:
    """" by more than 5% and its run-to-run deviation" (the parts that apply)."""
    parts = [f"{tie_band:.0%}"] * bool(tie_band) + ["its run-to-run deviation"] * noisy
    return f" by more than {' and '.join(parts)}" if parts else ""


def find_crossover(points: list[SpeedupPoint], tie_band: float = 0.0, invalid: Sequence[int] = ()) -> Crossover:
    """Crossover of the points (sorted here by concurrency), judged by `verdict`: speculation
    stops winning at the first point after a win that is no win (a tie or a loss). The text
    says which case holds: wins at every concurrency, loses at every one, wins at none,
    wins only from some concurrency on (no crossover), or stops winning between two
    concurrencies (naming any later concurrency where it wins again). invalid: concurrencies
    measured but left out of `points` (failed requests): the text then speaks of "every valid
    concurrency" and names them."""
    points = sorted(points, key=lambda p: p.concurrency)
    if not points:
        return Crossover(None, NO_BASELINE)
    crossover = _crossover(points, tie_band, "valid concurrency" if invalid else "concurrency measured",
                           "valid" if invalid else "measured")
    if invalid:
        left_out = ", ".join(map(str, sorted(invalid)))
        crossover.text += f" (left out, failed requests: concurrency {left_out})"
    return crossover


def _crossover(points: list[SpeedupPoint], tie_band: float, measured: str, highest: str) -> Crossover:
    """`find_crossover` of sorted, non-empty points; measured: "concurrency measured" or "valid
    concurrency"; highest: "measured" or "valid"."""
    verdicts = [verdict(p, tie_band) for p in points]
    wins = [v == "wins" for v in verdicts]
    band = margin_text(tie_band, any(p.speedup_std > 0 for p in points))
    if all(wins):
        last = points[-1]
        return Crossover(None, f"no crossover: speculation wins{band} at every {measured} "
                               f"(up to {last.concurrency}, speedup {last.text()} there)")
    if not any(wins):
        best = max(points, key=lambda p: p.speedup)
        how = (f"loses at every {measured}" if all(v == "loses" for v in verdicts)
               else f"does not win{band} at any {measured}")
        return Crossover(None, f"no crossover: speculation {how} "
                               f"(best speedup {best.text()} at concurrency {best.concurrency})")
    i = next((i for i in range(1, len(points)) if wins[i - 1] and not wins[i]), None)
    if i is None:  # no win is followed by a non-win: speculation starts winning and keeps winning
        first = points[wins.index(True)]
        return Crossover(None, f"speculation wins from concurrency {first.concurrency} on (speedup "
                               f"{first.text()} there); below concurrency {first.concurrency} it does "
                               f"not win{band}; no crossover: it does not stop winning up to concurrency "
                               f"{points[-1].concurrency}, the highest {highest}")
    a, b = points[i - 1], points[i]
    again = [p.concurrency for p, w in zip(points[i + 1:], wins[i + 1:]) if w]
    resumes = f"; it wins again at concurrency {', '.join(map(str, again))}" if again else ""
    return Crossover(b.concurrency, f"crossover: speculation stops winning{band} between concurrency "
                                    f"{a.concurrency} (speedup {a.text()}) and {b.concurrency} "
                                    f"(speedup {b.text()}){resumes}")


def noise_note(points: Sequence[SpeedupPoint]) -> str | None:
    """One line naming the concurrencies whose runs are too noisy to judge (`SpeedupPoint.noise`)
    and the fix; None when every point is steady."""
    noisy = [f"concurrency {p.concurrency}: {p.noise}" for p in points if p.noise]
    if not noisy:
        return None
    return (f"Noisy runs (sd/mean above {NOISY_SPREAD}), so the verdict there and any crossover it sets are "
            f"inconclusive: {'; '.join(noisy)}; re-run on an idle machine, or with more --num-prompts so each "
            "run lasts longer")


def baseline_warning(baseline: ServerRun) -> str | None:
    """The one-line warning when the baseline itself speculates: some level shows speculative
    counts (specdraft / vLLM /metrics counters that moved, SGLang's spec_verify_ct) or a
    specdraft usage accept length above 1. None when there is no such signal (plain decoding,
    or a server that exposes none)."""
    for level in baseline.levels:
        if level.spec is not None:
            tau, source = level.spec.accept_length, level.spec.source
        elif (level.usage_accept_length or 0.0) > 1.0:
            tau, source = level.usage_accept_length, "usage"
        else:
            continue
        return (f"WARNING: the baseline {baseline.url} speculates too (accept length {tau:.2f} from {source} "
                f"at concurrency {level.concurrency}): this compares speculation with speculation, not with "
                "plain decoding; restart the baseline without speculation (specdraft serve --no-spec; "
                "SGLang / vLLM without --speculative-* flags)")
    return None


def speculation_warning(run: ServerRun) -> str | None:
    """The one-line warning when the measured ("speculative") server shows no speculation at
    some level: its own signals say so (`LevelResult.no_spec_signal`: spec counters exposed
    but still, usage without drafted tokens, SGLang spec_verify_ct 0) or its counts give accept
    length 1 (no draft accepted). None for a server without such signals (e.g. plain OpenAI)."""
    for level in run.levels:
        if level.no_spec_signal is not None:
            what = f"no speculation: {level.no_spec_signal}"
        elif level.spec is not None and level.spec.num_accepted_tokens <= 0:
            what = f"accept length 1.00 (no draft accepted) from {level.spec.source}"
        else:
            continue
        return (f"WARNING: the speculative server {run.url} shows {what} at concurrency {level.concurrency}: "
                "its tokens/s and any speedup measure no gain from speculation; start it with a working "
                "drafter (specdraft serve --draft CKPT without --no-spec; SGLang / vLLM with --speculative-* flags)")
    return None


def failed_requests_warning(runs: Sequence[ServerRun]) -> str | None:
    """The one-line warning when some level has failed requests on any server: its tokens/s
    count only the requests that succeeded, so they and any speedup there are invalid. Names
    each such level with its error counts, the first error and the likely causes. None when
    every request succeeded."""
    failed = {}
    for run in runs:
        for level in run.levels:
            if level.num_errors:
                failed.setdefault(level.concurrency, []).append(
                    (f"{level.num_errors} of {level.num_requests} requests failed on {run.url}", level.first_error))
    if not failed:
        return None
    levels = "; ".join(f"concurrency {c}: {', '.join(text for text, _ in parts)}"
                       for c, parts in sorted(failed.items()))
    first = next(error for parts in failed.values() for _, error in parts if error)
    return (f"WARNING: failed requests ({levels}; first error: {first}): tokens/s and speedup at "
            f"{'that level' if len(failed) == 1 else 'those levels'} are invalid; likely the server refused "
            "requests beyond its queue (HTTP 429: raise specdraft serve --max-queue above the concurrency, or "
            "lower --concurrency) or they timed out (raise --timeout)")


@dataclass
class BenchReport:
    """Both runs, speedups per concurrency (None without baseline) and the crossover.
    not_measured: the concurrencies of the sweep left out because it was interrupted before
    they were measured on every server (`partial_report`); empty for a complete sweep."""

    config: BenchConfig
    spec: ServerRun
    baseline: ServerRun | None
    speedups: list[SpeedupPoint] | None
    crossover: Crossover
    not_measured: tuple[int, ...] = ()

    @property
    def partial(self) -> bool:
        """Whether the sweep was interrupted before every level was measured on every server."""
        return bool(self.not_measured)

    @property
    def partial_note(self) -> str | None:
        """The first line of a partial report's markdown: which levels were not measured; None
        for a complete one."""
        if not self.partial:
            return None
        measured = ", ".join(str(lv.concurrency) for lv in self.spec.levels)
        return (f"PARTIAL: bench was interrupted; concurrency {', '.join(map(str, self.not_measured))} not measured "
                f"on every server, so this report covers concurrency {measured} only")

    @property
    def has_verdicts(self) -> bool:
        """Whether the speedups are judged (wins / ties / loses): a baseline and enough runs."""
        return self.speedups is not None and self.config.repeats >= MIN_VERDICT_REPEATS

    @property
    def baseline_warning(self) -> str | None:
        """`baseline_warning` of the baseline run (None without a baseline)."""
        return baseline_warning(self.baseline) if self.baseline else None

    @property
    def speculation_warning(self) -> str | None:
        """`speculation_warning` of the measured server's run."""
        return speculation_warning(self.spec)

    @property
    def failed_requests_warning(self) -> str | None:
        """`failed_requests_warning` of both runs."""
        return failed_requests_warning([run for run in (self.spec, self.baseline) if run is not None])

    @property
    def warnings(self) -> list[str]:
        """Every warning that makes the comparison invalid (failed requests, a measured server
        that does not speculate, a baseline that does)."""
        return [w for w in (self.failed_requests_warning, self.speculation_warning, self.baseline_warning) if w]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        speedups = [{**asdict(p), "verdict": point_verdict(p, self.config.tie_band) if self.has_verdicts
                     or p.num_errors else None, "valid": not p.num_errors} for p in self.speedups or []]
        for d in speedups:  # an invalid level has no speedup: no number to mistake for one
            if not d["valid"]:
                d.update(speedup=None, speedup_std=None, noise=None)
        return {"config": asdict(self.config), "spec": self.spec.to_dict(),
                "baseline": self.baseline.to_dict() if self.baseline else None,
                "speedups": speedups or None, "crossover": asdict(self.crossover),
                "baseline_warning": self.baseline_warning, "speculation_warning": self.speculation_warning,
                "failed_requests_warning": self.failed_requests_warning, "partial": self.partial,
                "interrupted_at_concurrency": self.not_measured[0] if self.partial else None,
                "concurrency_not_measured": list(self.not_measured)}


def point_verdict(point: SpeedupPoint, tie_band: float) -> str:
    """`verdict`, or "invalid: N errors" for a level with failed requests."""
    return f"invalid: {point.num_errors} errors" if point.num_errors else verdict(point, tie_band)


@dataclass
class Sweep:
    """What `run_bench` has measured so far, filled as it goes: config, then each server's run,
    a level appended to every run once that level's runs are done on every server (each level
    is measured on both servers before the next starts). A caller that passes one keeps the
    finished levels when the sweep is interrupted (Ctrl-C: `partial_report`)."""

    config: BenchConfig | None = None
    spec: ServerRun | None = None
    baseline: ServerRun | None = None


def run_bench(cfg: BenchConfig, progress: Callable[[str], None] | None = None,
              sweep: Sweep | None = None) -> BenchReport:
    """Benchmark cfg.url against cfg.baseline_url (if any) on the same prompts, level by level:
    each concurrency is measured on both servers, its runs alternating between them
    (`measure_level`), before the next starts, so load drift on the machine reaches both alike.
    Both servers are waited for (`wait_for_server`: a dead baseline fails before the sweep) and
    warmed up (`warm_up`) before any timing. progress: told one line per server and level
    (`level_line`) as each level finishes. sweep: filled with the levels as they finish
    (`Sweep`; default: a new one)."""
    sweep = Sweep() if sweep is None else sweep
    sweep.config = cfg
    prompts = load_prompts(cfg.prompts)
    batch = [prompts[i % len(prompts)] for i in range(cfg.num_prompts)]
    servers = {"speculative": wait_for_server(cfg.url, cfg.wait_s, cfg.timeout_s, "--url", on_wait=progress)}
    if cfg.baseline_url:
        servers["baseline"] = wait_for_server(cfg.baseline_url, cfg.wait_s, cfg.timeout_s, "--baseline-url",
                                              on_wait=progress)
    runs = {role: ServerRun.of(server) for role, server in servers.items()}
    sweep.spec, sweep.baseline = runs["speculative"], runs.get("baseline")
    for server in servers.values():
        warm_up(server, batch, cfg)
    for concurrency in cfg.concurrency:
        levels = measure_level(list(servers.values()), batch, concurrency, cfg)
        for run, level in zip(runs.values(), levels):  # finished on every server: kept on Ctrl-C
            run.levels.append(level)
        if progress:
            for (role, server), level in zip(servers.items(), levels):
                progress(level_line(role, server, level))
    return compare(cfg, sweep.spec, sweep.baseline)


def compare(cfg: BenchConfig, spec: ServerRun, baseline: ServerRun | None,
            not_measured: tuple[int, ...] = ()) -> BenchReport:
    """The report of measured runs: speedups at each level (the runs' levels pair up in order)
    and the crossover over the valid ones; not_measured: `BenchReport.not_measured`."""
    if baseline is None:
        return BenchReport(cfg, spec, None, None, find_crossover([], cfg.tie_band), not_measured)
    speedups = [SpeedupPoint.of(a.concurrency, a.tokens_per_s_runs, b.tokens_per_s_runs, a.num_errors + b.num_errors)
                for a, b in zip(spec.levels, baseline.levels)]
    valid = [p for p in speedups if not p.num_errors]
    if cfg.repeats < MIN_VERDICT_REPEATS:
        crossover = Crossover(None, NO_VERDICT)
    elif not valid:
        crossover = Crossover(None, f"no crossover: {ALL_INVALID}")
    else:
        crossover = find_crossover(valid, cfg.tie_band, [p.concurrency for p in speedups if p.num_errors])
    return BenchReport(cfg, spec, baseline, speedups, crossover, not_measured)


def partial_report(sweep: Sweep) -> BenchReport | None:
    """The report of an interrupted sweep: the first levels of `config.concurrency` that every
    compared server finished (`run_bench` measures each level on both servers before the next),
    the rest in `not_measured`. None when no level was finished on every server (or the sweep
    never started)."""
    cfg = sweep.config
    if cfg is None:
        return None
    runs = [sweep.spec, sweep.baseline] if cfg.baseline_url else [sweep.spec]
    done = min(len(run.levels) if run else 0 for run in runs)
    if not done:
        return None
    spec, baseline = (replace(run, levels=run.levels[:done]) if run else None for run in (sweep.spec, sweep.baseline))
    return compare(cfg, spec, baseline, tuple(cfg.concurrency[done:]))


def fmt(value: float | None, scale: float = 1.0, digits: int = 1) -> str:
    """A number for the markdown tables ("-" for None)."""
    return "-" if value is None else f"{value * scale:.{digits}f}"


def tps_cell(level: LevelResult) -> str:
    """Tokens/s of a level: "812.3", or "812.3 ± 4.1 (806.0-816.2)" (mean ± sd (min-max)) over runs;
    "invalid (12 of 16 failed)" with failed requests (the successful ones alone give no valid tokens/s)."""
    if level.num_errors:
        return f"invalid ({level.num_errors} of {level.num_requests} failed)"
    if level.num_runs < 2:
        return f"{level.tokens_per_s:.1f}"
    runs = level.tokens_per_s_runs
    return f"{level.tokens_per_s:.1f} ± {level.tokens_per_s_std:.1f} ({min(runs):.1f}-{max(runs):.1f})"


def spec_cell(level: LevelResult) -> tuple[str, str]:
    """(tau with its M1 check, p_k) cells of a level."""
    s = level.spec
    if s is None:
        return "-", "-"
    tau = f"{s.accept_length:.3f}"
    if s.tau_from_positions is not None:
        agree = abs(s.tau_from_positions - s.accept_length) <= 1e-6 * s.accept_length
        tau += f" (1 + sum of p_k = {s.tau_from_positions:.3f}: {'counters agree' if agree else 'counters DISAGREE'})"
    p = s.acceptance_per_position
    return tau, " ".join(f"{x:.2f}" for x in p) if p is not None else "not exposed"


def markdown(report: BenchReport) -> str:
    """The report as markdown: one table per server, then speedups and the crossover."""
    cfg = report.config
    settings = (f"{cfg.repeats} runs of {cfg.num_prompts} requests per level (after {cfg.warmup} warm-up "
                f"request{'s' if cfg.warmup != 1 else ''} per server), max_tokens {cfg.max_tokens}, "
                f"temperature {cfg.temperature}, ignore_eos {cfg.ignore_eos}, prompts {cfg.prompts}")
    lines = [report.partial_note, ""] if report.partial else []
    lines += ["# specdraft bench", "", settings, ""]
    for warning in (report.failed_requests_warning, report.speculation_warning):
        lines += [warning, ""] if warning else []
    for title, run in (("speculative", report.spec), ("baseline", report.baseline)):
        if run is None:
            continue
        lines += [f"## {title}: {run.url} ({run.kind}, model {run.model})", "",
                  "| concurrency | tok/s mean ± sd (min-max) | TTFT ms mean / p50 / p99 | TPOT ms mean / p50 / p99 "
                  "| tau | p_k | errors |",
                  "|---|---|---|---|---|---|---|"]
        for lv in run.levels:
            tau, p = spec_cell(lv)
            ttft = " / ".join(fmt(v, 1e3) for v in (lv.ttft_s.mean, lv.ttft_s.p50, lv.ttft_s.p99))
            tpot = " / ".join(fmt(v, 1e3, 2) for v in (lv.tpot_s.mean, lv.tpot_s.p50, lv.tpot_s.p99))
            lines.append(f"| {lv.concurrency} | {tps_cell(lv)} | {ttft} | {tpot} | {tau} | {p} | {lv.num_errors} |")
        lines.append("")
    lines += ["## speedup (tokens/s with speculation / baseline, same prompts)", ""]
    if report.baseline_warning:
        lines += [report.baseline_warning, ""]
    if report.speedups is None:
        lines += [NO_BASELINE, ""]  # the crossover says nothing more
    else:
        lines += ["| concurrency | speedup (ratio of means) | sd | verdict | run-to-run noise |",
                  "|---|---|---|---|---|"]
        judged = report.has_verdicts  # one run: no sd, no verdict ("-"), no spread to call steady or noisy
        lines += [speedup_row(p, judged, cfg.tie_band) for p in report.speedups]
        note = noise_note([p for p in report.speedups if not p.num_errors])
        lines += ["", note] if note else []
        lines += ["", report.crossover.text, ""]
    return "\n".join(lines)


def speedup_row(point: SpeedupPoint, judged: bool, tie_band: float) -> str:
    """One row of the speedup table; a level with failed requests shows no number, only
    "invalid: N errors" (its tokens/s count the successful requests alone)."""
    if point.num_errors:
        return f"| {point.concurrency} | invalid: {point.num_errors} errors | - | - | - |"
    return (f"| {point.concurrency} | {point.speedup:.2f}x | {f'{point.speedup_std:.2f}' if judged else '-'} | "
            f"{verdict(point, tie_band) if judged else '-'} | {noise_cell(point, judged)} |")


def noise_cell(point: SpeedupPoint, judged: bool) -> str:
    """The run-to-run noise cell of a speedup row: "noisy: verdict inconclusive" when either
    server's runs spread more than NOISY_SPREAD of their mean, "steady" when both are within it,
    "one run: no spread" without repeats (nothing to judge)."""
    if point.noise:
        return "noisy: verdict inconclusive"
    return "steady" if judged else "one run: no spread"


Series = tuple[list[int], list[float], list[float]]  # concurrencies, values, their sd


def plot_data(report: BenchReport) -> dict[str, tuple[str, dict[str, Series]]]:
    """What throughput.png and tpot.png draw: per file its y label and, per server ("speculative",
    "baseline"), the points. Both leave out a level with failed requests: its tokens/s and TPOT
    count the successful requests alone, which ran with fewer requests in flight than the level
    names (invalid, `tps_cell`)."""
    runs = [("speculative", report.spec), ("baseline", report.baseline)]
    series = {"throughput.png": ("output tokens/s (mean ± sd)", lambda lv: (lv.tokens_per_s, lv.tokens_per_s_std)),
              "tpot.png": ("TPOT p50 (ms)", lambda lv: ((lv.tpot_s.p50 or 0.0) * 1e3, 0.0))}
    data = {}
    for name, (label, value) in series.items():
        data[name] = (label, {})
        for title, run in runs:
            if run is not None:
                levels = [lv for lv in run.levels if not lv.num_errors]
                data[name][1][title] = ([lv.concurrency for lv in levels], [value(lv)[0] for lv in levels],
                                        [value(lv)[1] for lv in levels])
    return data


def plot(report: BenchReport, out_dir: Path) -> list[Path]:
    """throughput.png, tpot.png and (with a baseline) speedup.png against concurrency."""
    from matplotlib.figure import Figure

    runs = [report.spec, report.baseline]
    ticks = sorted({lv.concurrency for run in runs if run is not None for lv in run.levels})
    paths = []
    for name, (label, lines) in plot_data(report).items():
        fig = Figure(figsize=(5, 3.5))
        ax = fig.add_subplot()
        for title, (x, y, err) in lines.items():
            if x:
                ax.errorbar(x, y, yerr=err, fmt="o-", capsize=3, label=title)
        paths.append(save_figure(fig, ax, label, out_dir / name, ticks))
    points = [p for p in report.speedups or [] if not p.num_errors]  # an invalid speedup is not drawn
    if points:
        fig = Figure(figsize=(5, 3.5))
        ax = fig.add_subplot()
        ax.errorbar([p.concurrency for p in points], [p.speedup for p in points],
                    yerr=[p.speedup_std for p in points], fmt="o-", capsize=3, label="speedup (± sd)")
        ax.axhline(1.0, color="gray", linestyle="--", label="no speculation")
        paths.append(save_figure(fig, ax, "speedup (x)", out_dir / "speedup.png", ticks))
    return paths


def save_figure(fig: Any, ax: Any, ylabel: str, path: Path, ticks: list[int]) -> Path:
    """Label, log-x with the measured concurrencies `ticks`, legend, save atomically."""
    ax.set_xscale("log", base=2)
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.minorticks_off()
    ax.set_xlabel("concurrency")
    ax.set_ylabel(ylabel)
    if ax.get_legend_handles_labels()[0]:  # a figure with every point left out has nothing to name
        ax.legend()
    fig.tight_layout()
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=100)
    os.replace(tmp, path)
    return path


def write_report(report: BenchReport, out_dir: str | Path) -> list[Path]:
    """bench.json, bench.md and the plots in out_dir (created; each file written atomically; a
    partial report, `partial_report`, the same way, marked as such in both)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, text in (("bench.json", json.dumps(report.to_dict(), indent=2)), ("bench.md", markdown(report))):
        tmp = out / f".{name}.tmp"
        tmp.write_text(text)
        os.replace(tmp, out / name)
        paths.append(out / name)
    return paths + plot(report, out)
