"""Finding a server: `detect_server` finds the kind (from the /metrics prefix, else SGLang's
/get_model_info) and the served model with the setting specdraft serve reports (/v1/models);
`wait_for_server` retries it while nothing
accepts connections (a server still starting). Errors a user sees are `ClientError`s."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from specdraft.client.urls import check_url
from specdraft.errors import SpecdraftError

# Seconds to wait for a server that refuses connections (still starting) before giving up.
SERVER_WAIT_S = 120.0
SERVER_POLL_S = 0.5
METRIC_PREFIX = {"specdraft": "specdraft:", "vllm": "vllm:"}
# The key of specdraft serve's /v1/models card that holds the speculative setting it runs
# ({"num_steps", "topk", "num_draft_tokens"}, null without speculation); other servers have none.
SPECULATIVE_SETTING_KEY = "speculative_setting"


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


@dataclass(frozen=True)
class Server:
    """A server under test: base URL, kind (specdraft | vllm | sglang | openai), served model,
    and the speculative setting its /v1/models card reports (`SPECULATIVE_SETTING_KEY`: specdraft
    serve's num_steps / topk / num_draft_tokens; None when the card names none)."""

    url: str
    kind: str
    model: str
    speculative: dict[str, int] | None = None


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
        card = _model_card(client, url)
        try:
            return Server(url, _kind(client), card["id"], card.get(SPECULATIVE_SETTING_KEY))
        except httpx.HTTPError as e:
            raise ClientError(f"{url}: {type(e).__name__}: {first_line(e)}") from None


def _model_card(client: httpx.Client, url: str) -> dict:
    """The id and reported setting of the first model of the server's /v1/models (detect_server's
    errors)."""
    try:
        listing = client.get("/v1/models")
        listing.raise_for_status()
        card = listing.json()["data"][0]
        return {"id": card["id"], SPECULATIVE_SETTING_KEY: card.get(SPECULATIVE_SETTING_KEY)}
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
