"""specdraft.client: what reaches a user is a SpecdraftError of one line naming the URL (the CLI's
one mapping prints it), a dead server's /metrics included; the URL errors stay ValueErrors."""

from __future__ import annotations

import pytest

from specdraft.client import (
    BadURL,
    ClientError,
    Server,
    ServerUnreachable,
    check_url,
    detect_server,
    scrape,
)
from specdraft.errors import SpecdraftError
from specdraft.serve.server import serve_in_thread


def test_error_classes_keep_their_old_bases():
    assert issubclass(ServerUnreachable, SpecdraftError) and issubclass(
        ServerUnreachable, RuntimeError
    )
    assert issubclass(ClientError, SpecdraftError) and issubclass(ClientError, RuntimeError)
    assert issubclass(BadURL, SpecdraftError) and issubclass(BadURL, ValueError)
    with pytest.raises(BadURL, match="must start with http://"):
        check_url("127.0.0.1:8000")


def broken_metrics_app():
    """An OpenAI-like server whose /metrics answers 500."""
    from fastapi import FastAPI
    from starlette.responses import JSONResponse, PlainTextResponse

    app = FastAPI()

    async def models(request):
        return JSONResponse({"object": "list", "data": [{"id": "m", "object": "model"}]})

    async def metrics(request):
        return PlainTextResponse("boom", status_code=500)

    app.add_route("/v1/models", models, methods=["GET"])
    app.add_route("/metrics", metrics, methods=["GET"])
    return app


def test_a_failing_metrics_endpoint_is_one_line_naming_it():
    with serve_in_thread(broken_metrics_app()) as server:
        assert detect_server(server.url) == Server(
            server.url, "openai", "m"
        )  # no prefix: a plain server
        with pytest.raises(ClientError) as info:
            scrape(Server(server.url, "vllm", "m"), timeout_s=10.0)
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"{server.url}/metrics: HTTPStatusError: ")


def test_a_server_that_went_away_is_a_client_error():
    with serve_in_thread(broken_metrics_app()) as server:
        url = server.url
    with pytest.raises(ClientError, match=f"^{url}/metrics: ConnectError: "):
        scrape(Server(url, "specdraft", "m"), timeout_s=5.0)
