"""Server URLs as bench, doctor and regenerate take them: a base URL (`check_url`, `base_url`)
to which paths such as /v1/models, /v1/completions, /generate and /metrics are appended; a
URL that names no server base URL is a `BadURL`."""

from __future__ import annotations

import httpx

from specdraft.errors import SpecdraftError

# OpenAI / SGLang endpoint paths: a server URL ending in one (http://host:8000/v1/completions) is
# refused (`check_url`); bench and doctor take the base URL and append the paths they need.
API_PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/models", "/generate")


class BadURL(SpecdraftError, ValueError):
    """A server URL that names no server base URL (no http(s)://, no host, an endpoint path)."""


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
