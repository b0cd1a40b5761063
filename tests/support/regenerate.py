"""A fake OpenAI-compatible endpoint and chat records for regenerate's tests (the endpoint
backend, the CLI)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from specdraft.data.records import read_records
from specdraft.regenerate.backends import EndpointBackend

CHATS = [
    [{"role": "user", "content": "hello"}],
    [
        {"role": "user", "content": "one"},
        {"role": "assistant", "content": "old"},
        {"role": "user", "content": "two"},
        {"role": "assistant", "content": "old"},
    ],
    [{"role": "system", "content": "be helpful"}, {"role": "user", "content": "three"}],
    [{"role": "user", "content": "four"}, {"role": "assistant", "content": "old"}],
    [{"role": "user", "content": "five"}],
]


class FakeServer:
    """An OpenAI-compatible server on 127.0.0.1: replies "re <last user turn>" (chat) or
    " <n> tokens" (completions); `failures[word]` = statuses to answer first for that word."""

    def __init__(self):
        self.requests: list[tuple[str, dict]] = []
        self.failures: dict[str, list[int]] = {}
        self.lock = threading.Lock()
        state = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                status, reply = state.answer(self.path, body)
                data = json.dumps(reply).encode() if status == 200 else b"boom"
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def answer(self, path: str, body: dict) -> tuple[int, dict]:
        if path.endswith("/chat/completions"):
            word = last_user_turn(body)
            reply = {"choices": [{"message": {"role": "assistant", "content": f"re {word}"}}]}
        else:
            word = str(body["prompt"])
            reply = {"choices": [{"text": f" {len(body['prompt'])} tokens"}]}
        with self.lock:
            self.requests.append((path, body))
            pending = self.failures.get(word, [])
            return (pending.pop(0), {}) if pending else (200, reply)


def served(server: FakeServer) -> Iterator[FakeServer]:
    """A fixture's body: yields `server`, then shuts it down."""
    yield server
    server.httpd.shutdown()
    server.httpd.server_close()


def last_user_turn(body: dict) -> str:
    """The content of a chat request's last user message."""
    return [m for m in body["messages"] if m["role"] == "user"][-1]["content"]


@pytest.fixture
def server():
    yield from served(FakeServer())


def chat_records(tmp_path, chats=CHATS):
    path = tmp_path / "chats.jsonl"
    path.write_text("".join(json.dumps({"messages": c}) + "\n" for c in chats))
    return read_records(path, require_assistant=False)


def backend(server, **kw):
    kw = {"concurrency": 2, "max_retries": 2, "backoff_s": 0.01, **kw}
    return EndpointBackend(server.url + "/v1", "tiny", **kw)


def read_out(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]
