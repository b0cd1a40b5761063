"""A client of OpenAI-compatible servers (specdraft, vLLM, SGLang, any other): URL rules,
finding and waiting for a server, streamed requests, and the speculative counters it exposes.

- URLs: a server is named by its base URL (`check_url`, `base_url`); paths such as /v1/models,
  /v1/completions, /generate and /metrics are appended to it.
- Servers: `detect_server` finds the kind (from the /metrics prefix, else SGLang's
  /get_model_info) and the served model (/v1/models); `wait_for_server` retries it while nothing
  accepts connections (a server still starting).
- Requests: `send` / `run_requests` stream /v1/completions (SGLang: the native /generate) and
  time the first text and the end of each request (`RequestRecord`).
- Counters: `scrape` reads specdraft's and vLLM's /metrics (`<prefix>spec_decode_num_drafts`,
  `..._num_draft_tokens`, `..._num_accepted_tokens`, `..._num_accepted_tokens_per_pos{position}`,
  vLLM `v1/spec_decode/metrics.py`); `counter_delta` turns two scrapes into `SpecCounts`;
  `sglang_counts` reads SGLang's per-request meta_info instead (tau = completion_tokens /
  spec_verify_ct, SGLang's definition; it exposes no per-position counts).
Errors a user sees are `ClientError`s (a `SpecdraftError`): one line naming the URL.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import httpx

from specdraft.errors import SpecdraftError

# OpenAI / SGLang endpoint paths: a server URL ending in one (http://host:8000/v1/completions) is
# refused (`check_url`); bench and doctor take the base URL and append the paths they need.
API_PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/models", "/generate")
# Seconds to wait for a server that refuses connections (still starting) before giving up.
SERVER_WAIT_S = 120.0
SERVER_POLL_S = 0.5
METRIC_PREFIX = {"specdraft": "specdraft:", "vllm": "vllm:"}
COUNTERS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens")


class BadURL(SpecdraftError, ValueError):
    """A server URL that names no server base URL (no http(s)://, no host, an endpoint path)."""


class ClientError(SpecdraftError, RuntimeError):
    """A server that does not answer as an OpenAI-compatible one, or an HTTP failure talking to
    it: one line naming the URL."""


class ServerUnreachable(ClientError):
    """Nothing accepted a connection at the URL (refused or connect timeout): no server there,
    or one still starting. `cause`: the connection error's text."""

    def __init__(self, message: str, cause: str) -> None:
        super().__init__(message)
        self.cause = cause


def first_line(e: Exception) -> str:
    """The first line of an error's text (httpx's status errors add a second, a link)."""
    text = str(e)
    return text.splitlines()[0] if text else text


# ---- URLs -------------------------------------------------------------------------------------
def check_url(url: str, name: str = "url") -> str:
    """A server base URL as bench and doctor take it: http:// or https://, else BadURL (a
    ValueError: one line naming the option `name` and the fix), as is a URL with no host or one
    whose path ends in an endpoint (`API_PATHS`, e.g. http://host:8000/v1/completions: the error
    names the base URL http://host:8000 to give instead). Returns the base URL (`base_url`:
    without trailing slashes and one trailing /v1 segment, as regenerate takes --endpoint:
    http://host:8000/v1/ is http://host:8000), to which paths such as /v1/models are appended."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() not in ("http", "https"):
        example = f"http://{rest}" if sep else f"http://{url}"
        raise BadURL(f"{name} {url!r}: must start with http:// or https:// (e.g. {example})")
    base = base_url(url)
    host, _, path = base.partition("://")[2].partition("/")
    if not host:
        raise BadURL(f"{name} {url!r}: no host; give the server's URL, e.g. http://127.0.0.1:8000")
    endpoint = next((p for p in API_PATHS if f"/{path}".endswith(p)), None)
    if endpoint:
        raise BadURL(
            f"{name} {url!r} ends in the endpoint {endpoint} (bench and doctor add the paths they "
            f"need); give the server's base URL {base_url(base.removesuffix(endpoint))}"
        )
    return base


MAX_PORT = 65535


def check_port(url: str) -> None:
    """BadURL when `url` does not parse (httpx) or names a port outside 1..65535, naming the fix
    (a usage error for an unparsable port instead of a traceback, or a connection error for 99999)."""
    try:
        port = httpx.URL(url).port
    except httpx.InvalidURL as e:
        hint = (
            f"; give a port in 1..{MAX_PORT}, e.g. http://127.0.0.1:8000"
            if "port" in str(e)
            else ""
        )
        raise BadURL(f"{url!r}: {e}{hint}") from None
    if port is not None and not 1 <= port <= MAX_PORT:
        raise BadURL(f"{url!r}: port {port} is not in 1..{MAX_PORT}")


def base_url(url: str) -> str:
    """`url` without trailing slashes and one trailing /v1 path segment (the OpenAI API root that
    vLLM, SGLang and OpenAI clients are given): "http://h:8000/v1/" -> "http://h:8000"; a host
    named v1 is kept ("http://v1" stays)."""
    scheme, sep, rest = url.partition("://")
    rest = rest.rstrip("/")
    if "/" in rest and rest.endswith("/v1"):  # a path segment, not the host
        rest = rest.removesuffix("/v1").rstrip("/")
    return scheme + sep + rest


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


# ---- servers ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Server:
    """A server under test: base URL, kind (specdraft | vllm | sglang | openai), served model."""

    url: str
    kind: str
    model: str


def detect_server(
    url: str, timeout_s: float = 30.0, connect_timeout_s: float | None = None
) -> Server:
    """Find the server's kind (from its /metrics prefix, else SGLang's /get_model_info) and the
    model it serves (/v1/models). url: as `check_url` takes it (a trailing /v1 is dropped: the
    paths here include it). connect_timeout_s: for opening connections (default timeout_s).
    Raises ServerUnreachable when nothing accepts the connection, ClientError (a RuntimeError)
    when the server does not answer /v1/models or fails later, or for a URL `check_url` refuses."""
    try:
        url = check_url(url)
    except ValueError as e:  # e.g. a URL without http://
        raise ClientError(str(e)) from None
    timeout = httpx.Timeout(
        timeout_s, connect=timeout_s if connect_timeout_s is None else connect_timeout_s
    )
    with httpx.Client(base_url=url, timeout=timeout) as client:
        model = _served_model(client, url)
        try:
            return Server(url, _kind(client), model)
        except httpx.HTTPError as e:
            raise ClientError(f"{url}: {type(e).__name__}: {first_line(e)}") from None


def _served_model(client: httpx.Client, url: str) -> str:
    """The first model of the server's /v1/models (detect_server's errors)."""
    try:
        listing = client.get("/v1/models")
        listing.raise_for_status()
        return listing.json()["data"][0]["id"]
    except (httpx.ConnectError, httpx.ConnectTimeout) as e:
        raise ServerUnreachable(
            f"{url}: no OpenAI-compatible /v1/models ({first_line(e)})", first_line(e)
        ) from None
    except (httpx.HTTPError, KeyError, IndexError, ValueError) as e:
        raise ClientError(f"{url}: no OpenAI-compatible /v1/models ({first_line(e)})") from None


def _kind(client: httpx.Client) -> str:
    """specdraft / vllm / sglang from the /metrics prefix, sglang from /get_model_info, else openai."""
    metrics = client.get("/metrics")
    text = metrics.text if metrics.status_code == 200 else ""
    for kind, prefix in (*METRIC_PREFIX.items(), ("sglang", "sglang:")):
        if prefix in text:
            return kind
    return "sglang" if client.get("/get_model_info").status_code == 200 else "openai"


def wait_for_server(
    url: str,
    wait_s: float = SERVER_WAIT_S,
    timeout_s: float = 30.0,
    option: str = "--url",
    poll_s: float = SERVER_POLL_S,
    on_wait: Callable[[str], None] | None = None,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Server:
    """`detect_server`, retried every poll_s seconds while nothing accepts connections at `url`
    (a server started in the background and still loading), for at most wait_s seconds (0: one
    try). on_wait: told once, in one line, when the first try is refused. Raises ServerUnreachable
    when the connection is still refused after wait_s: one line naming the URL, the wait and the
    fix (`option`: the flag that gave the URL); other failures (a server that answers, but not
    /v1/models) are raised at once. clock / sleep: seconds now and the pause between tries."""
    start = clock()
    deadline, told = start + wait_s, on_wait is None
    while True:
        left = deadline - clock()
        try:  # an unanswered connect must not outlast the wait
            return detect_server(url, timeout_s, min(timeout_s, max(left, poll_s)))
        except ServerUnreachable as e:
            left = deadline - clock()
            if left <= 0:
                raise ServerUnreachable(
                    f"{url}: no server answered ({e.cause}) after waiting "
                    f"{clock() - start:.0f} s; is the server running? start it "
                    f"(e.g. specdraft serve ... &) or pass the right {option}",
                    e.cause,
                ) from None
            if not told:
                told = True
                on_wait(
                    f"{url}: not accepting connections yet ({e.cause}); waiting up to {wait_s:.0f} s "
                    "for it to start"
                )
            sleep(min(poll_s, left))


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


# ---- requests ---------------------------------------------------------------------------------
@dataclass
class RequestRecord:
    """One request: TTFT (first text), latency, completion tokens, usage / meta_info or error,
    and the streamed answer text (a chat's content, without its reasoning)."""

    ttft_s: float | None
    latency_s: float
    num_tokens: int
    usage: dict[str, Any] | None = None
    error: str | None = None
    text: str = ""


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


def request_body(server: Server, prompt: str | list[dict], cfg: Any) -> tuple[str, dict[str, Any]]:
    """(path, JSON body): a chat (a list of messages) as streamed /v1/chat/completions on every
    kind; text as SGLang's native /generate, else streamed /v1/completions; usage included.
    cfg: the sampling settings (`max_tokens`, `temperature`, `ignore_eos`: bench's BenchConfig)."""
    if isinstance(prompt, list):
        body = {
            "model": server.model,
            "messages": prompt,
            "max_tokens": cfg.max_tokens,
            "temperature": cfg.temperature,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if server.kind != "openai" and cfg.ignore_eos:
            body["ignore_eos"] = True
        return "/v1/chat/completions", body
    if server.kind == "sglang":
        params = {
            "temperature": cfg.temperature,
            "max_new_tokens": cfg.max_tokens,
            "ignore_eos": cfg.ignore_eos,
        }
        return "/generate", {"text": prompt, "sampling_params": params, "stream": True}
    body = {
        "model": server.model,
        "prompt": prompt,
        "max_tokens": cfg.max_tokens,
        "temperature": cfg.temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if server.kind != "openai" and cfg.ignore_eos:
        body["ignore_eos"] = True
    return "/v1/completions", body


def _event_text(event: dict[str, Any], native: bool) -> tuple[str, str]:
    """(answer text, reasoning text) of one streamed event: SGLang /generate's `text`, a
    completion's `choices[].text`, or a chat delta's `content` and reasoning (vLLM's
    `reasoning`, SGLang's `reasoning_content`: `conventions.REASONING_RESPONSE_FIELDS`)."""
    from specdraft.conventions.engines import REASONING_RESPONSE_FIELDS

    if native:
        return event.get("text", ""), ""
    text = reasoning = ""
    for c in event.get("choices", []):
        delta = c.get("delta") or {}
        text += c.get("text") or delta.get("content") or ""
        reasoning += "".join(delta.get(k) or "" for k in REASONING_RESPONSE_FIELDS)
    return text, reasoning


def error_message(body: str) -> str:
    """The message of an OpenAI-style error body (`{"error": {"message": ...}}`, what vLLM,
    SGLang and specdraft answer), else the body's first 300 characters."""
    try:
        message = json.loads(body)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return body[:300]
    return message if isinstance(message, str) else body[:300]


async def send(
    client: httpx.AsyncClient,
    server: Server,
    prompt: str | list[dict],
    cfg: Any,
    clock: Callable[[], float] = time.perf_counter,
) -> RequestRecord:
    """Stream one request (`request_body`); time the first text and the end on `clock` (seconds
    now). A failure (HTTP status, error event, connection) is the record's `error`, never raised."""
    path, body = request_body(server, prompt, cfg)
    start, first, chunks, last, pieces = clock(), None, 0, {}, []
    try:
        async with client.stream("POST", path, json=body) as response:
            if response.status_code != 200:
                detail = error_message((await response.aread()).decode(errors="replace"))
                return RequestRecord(
                    None, clock() - start, 0, error=f"HTTP {response.status_code}: {detail}"
                )
            async for line in response.aiter_lines():
                if not line.startswith("data:") or line.strip() == "data: [DONE]":
                    continue
                event = json.loads(line[5:])
                if "error" in event:
                    return RequestRecord(None, clock() - start, 0, error=str(event["error"]))
                text, reasoning = _event_text(event, path == "/generate")
                if (text or reasoning) and first is None:
                    first = clock()
                chunks += bool(text or reasoning)
                pieces.append(text)
                last = event.get("meta_info") or event.get("usage") or last
    except (httpx.HTTPError, json.JSONDecodeError) as e:
        return RequestRecord(None, clock() - start, 0, error=f"{type(e).__name__}: {e}")
    tokens = int(last.get("completion_tokens", chunks))
    text = "".join(pieces)
    if path == "/generate":  # SGLang's native stream sends the whole text so far in each event
        text = pieces[-1] if pieces else ""
    return RequestRecord(first and first - start, clock() - start, tokens, last or None, text=text)


async def run_requests(
    server: Server,
    prompts: list[str] | list[list[dict]],
    concurrency: int,
    cfg: Any,
    clock: Callable[[], float] = time.perf_counter,
) -> tuple[list[RequestRecord], float]:
    """Send all prompts with `concurrency` in flight; (records, wall seconds on `clock`). cfg:
    `send`'s, with `timeout_s` per request."""
    limits = httpx.Limits(max_connections=concurrency + 1)
    async with httpx.AsyncClient(
        base_url=server.url, timeout=cfg.timeout_s, limits=limits
    ) as client:
        gate = asyncio.Semaphore(concurrency)

        async def one(prompt: str) -> RequestRecord:
            async with gate:
                return await send(client, server, prompt, cfg, clock)

        start = clock()
        records = await asyncio.gather(*(one(p) for p in prompts))
        return list(records), clock() - start
