"""specdraft.serve.server on loopback (real uvicorn on a free port) with the tiny seeded targets.

Every endpoint; completions and chat, streamed and not, equal the target's greedy output at
T = 0; malformed requests get 400 with OpenAI's error body; an oversize prompt is refused
before generation; 16 concurrent requests equal single-request outputs; a full queue gets 429;
a client disconnect stops its generation and frees the worker; /metrics counters give the
same accept length as the responses' usage.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from specdraft.client import counter_delta, detect_server, scrape, scrape_counters
from specdraft.engine.spec_config import SpecConfig
from specdraft.serve.server import build_app, serve_in_thread
from tests.support.cli import cli_args
from tests.support.engine_helpers import greedy_sequences, one_thread, tiny_setup  # noqa: F401
from tests.support.serve_helpers import (
    NUM_NEW,
    engine,
    greedy_text,
    open_stream,
    own_target,
    running,
    saved_pair,
    slow_target,
    spec_server,
    text_prompts,
    word_tokenizer,
)


@pytest.fixture(scope="module")
def server():
    """A speculative server (briefly trained drafter, 3-step chain) for the module."""
    with spec_server(log_every=4) as srv:
        yield srv


def completion(client: httpx.Client, **body) -> httpx.Response:
    return client.post("/v1/completions", json={"temperature": 0, "max_tokens": NUM_NEW, **body})


def stream_events(client: httpx.Client, path: str, body: dict) -> list:
    with client.stream("POST", path, json={**body, "stream": True}) as response:
        assert response.status_code == 200
        lines = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def spec_counters(client: httpx.Client) -> dict:
    return scrape_counters(client.get("/metrics").text, "specdraft:")


def test_models_health_and_metrics_endpoints(server):
    client = httpx.Client(base_url=server.url, timeout=30)
    models = client.get("/v1/models").json()
    assert models["object"] == "list" and [m["id"] for m in models["data"]] == ["tiny"]
    assert models["data"][0]["max_model_len"] == 128  # the cache: no slots kept for a round
    # the setting it runs, which doctor's draft_depth_pays_off reads (`client.Server.speculative`)
    setting = {"num_steps": 3, "topk": 1, "num_draft_tokens": 4}
    assert models["data"][0]["speculative_setting"] == setting
    assert detect_server(server.url).speculative == setting
    assert client.get("/health").json() == {"status": "ok", "running": 0, "waiting": 0}
    names = {f.name for f in text_string_to_metric_families(client.get("/metrics").text)}
    for name in (
        "num_drafts",
        "num_draft_tokens",
        "num_accepted_tokens",
        "num_accepted_tokens_per_pos",
    ):
        assert f"specdraft:spec_decode_{name}" in names
    assert {"specdraft:time_per_output_token_seconds", "specdraft:request_success"} <= names
    assert client.get("/nope").status_code == 404


def vllm_samples(client: httpx.Client) -> dict[tuple[str, tuple], float]:
    """{(sample name, sorted labels): value} of the vllm:spec_decode_* counters (without _created)."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(client.get("/metrics").text)
        for s in f.samples
        if s.name.startswith("vllm:spec_decode_") and s.name.endswith("_total")
    }


def test_metrics_carry_vllms_names_and_labels_and_bench_reads_one_set(server):
    """vLLM's four spec-decode counters with its labels (model_name = the served name, engine;
    position on the per-position one) move as specdraft's do; bench's scraper
    (`client.detect_server` + `scrape`) reads one set: its counts equal the request's usage."""
    client = httpx.Client(base_url=server.url, timeout=30)
    labels = (("engine", "0"), ("model_name", "tiny"))
    before, seen = vllm_samples(client), scrape(detect_server(server.url), 30)
    usage = completion(client, prompt=text_prompts(1, 8, seed=6)[0]).json()["usage"]
    after, now = vllm_samples(client), scrape(detect_server(server.url), 30)
    expected = {
        ("vllm:spec_decode_num_drafts_total", labels): usage["num_drafts"],
        ("vllm:spec_decode_num_draft_tokens_total", labels): usage["num_draft_tokens"],
        ("vllm:spec_decode_num_accepted_tokens_total", labels): usage["num_accepted_tokens"],
    }
    expected |= {
        ("vllm:spec_decode_num_accepted_tokens_per_pos_total", (*labels, ("position", str(k)))): n
        for k, n in enumerate(usage["num_accepted_tokens_per_pos"])
    }
    assert set(after) == set(expected)
    assert {key: after[key] - before.get(key, 0.0) for key in after} == expected
    counts = counter_delta(seen, now, "specdraft /metrics")
    assert (
        counts.num_drafts,
        counts.num_draft_tokens,
        counts.num_accepted_tokens,
        counts.accepted_per_pos,
    ) == (
        usage["num_drafts"],
        usage["num_draft_tokens"],
        usage["num_accepted_tokens"],
        usage["num_accepted_tokens_per_pos"],
    )


def test_completion_equals_greedy_with_usage_and_metrics(server):
    client = httpx.Client(base_url=server.url, timeout=30)
    prompt = text_prompts(1, 8, seed=1)[0]
    before = spec_counters(client)
    body = completion(client, prompt=prompt).json()
    after = spec_counters(client)
    assert body["object"] == "text_completion" and body["model"] == "tiny"
    assert body["choices"][0]["text"] == greedy_text(prompt)
    assert body["choices"][0]["finish_reason"] == "length"
    usage = body["usage"]
    assert (usage["prompt_tokens"], usage["completion_tokens"], usage["total_tokens"]) == (
        8,
        NUM_NEW,
        8 + NUM_NEW,
    )
    assert usage["num_draft_tokens"] == 3 * usage["num_drafts"]
    assert usage["accept_length"] == pytest.approx(
        1 + usage["num_accepted_tokens"] / usage["num_drafts"]
    )
    assert usage["accept_length"] == pytest.approx(1 + sum(usage["acceptance_per_position"]))
    assert sum(usage["num_accepted_tokens_per_pos"]) == usage["num_accepted_tokens"]
    # the counters moved by exactly this request's raw counts: same tau as usage (M1)
    drafts = after["num_drafts"] - before["num_drafts"]
    accepted = after["num_accepted_tokens"] - before["num_accepted_tokens"]
    per_pos = [after["per_pos"][k] - before["per_pos"][k] for k in range(3)]
    assert (drafts, accepted, per_pos) == (
        usage["num_drafts"],
        usage["num_accepted_tokens"],
        usage["num_accepted_tokens_per_pos"],
    )
    assert 1 + accepted / drafts == pytest.approx(usage["accept_length"])
    ids = word_tokenizer()(prompt)["input_ids"]
    by_ids = completion(client, prompt=ids).json()
    assert by_ids["choices"][0]["text"] == greedy_text(prompt)


def test_streaming_completion_and_chat(server):
    client = httpx.Client(base_url=server.url, timeout=30)
    prompt = text_prompts(1, 8, seed=2)[0]
    events = stream_events(
        client,
        "/v1/completions",
        {
            "prompt": prompt,
            "temperature": 0,
            "max_tokens": NUM_NEW,
            "stream_options": {"include_usage": True},
        },
    )
    assert "".join(e["choices"][0]["text"] for e in events if e["choices"]) == greedy_text(prompt)
    assert events[-2]["choices"][0]["finish_reason"] == "length"
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == NUM_NEW
    tok = word_tokenizer()
    messages = [{"role": "user", "content": prompt}]
    chat_ids = tok(
        tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True),
        add_special_tokens=False,
    )["input_ids"]
    expected = greedy_text("", 5, ids=chat_ids)
    body = client.post(
        "/v1/chat/completions", json={"messages": messages, "temperature": 0, "max_tokens": 5}
    ).json()
    assert body["object"] == "chat.completion" and body["choices"][0]["message"] == {
        "role": "assistant",
        "content": expected,
    }
    assert body["usage"]["prompt_tokens"] == len(chat_ids)
    parts = [{"type": "text", "text": prompt}]
    events = stream_events(
        client,
        "/v1/chat/completions",
        {
            "messages": [{"role": "user", "content": parts}],
            "temperature": 0,
            "max_completion_tokens": 5,
        },
    )
    assert (
        events[0]["object"] == "chat.completion.chunk"
        and events[0]["choices"][0]["delta"]["role"] == "assistant"
    )
    assert "".join(e["choices"][0]["delta"].get("content", "") for e in events) == expected
    assert events[-1]["choices"][0]["finish_reason"] == "length"


def test_stop_strings_cut_text_streamed_and_not(server):
    client = httpx.Client(base_url=server.url, timeout=30)
    prompt = text_prompts(1, 8, seed=3)[0]
    full = greedy_text(prompt)
    stop = " ".join(full.split()[4:6])
    body = completion(client, prompt=prompt, stop=[stop]).json()
    assert body["choices"][0] == {
        "index": 0,
        "text": full[: full.find(stop)],
        "logprobs": None,
        "finish_reason": "stop",
    }
    events = stream_events(
        client,
        "/v1/completions",
        {"prompt": prompt, "temperature": 0, "max_tokens": NUM_NEW, "stop": stop},
    )
    assert "".join(e["choices"][0]["text"] for e in events) == full[: full.find(stop)]


BAD_REQUESTS = [
    (b"{not json", None, "invalid_json"),
    (b"[1, 2]", None, "invalid_json"),
    ({"max_tokens": 4}, "prompt", "missing_field"),
    ({"prompt": "w1", "max_tokens": "4"}, "max_tokens", "invalid_type"),
    ({"prompt": "w1", "max_tokens": 0}, "max_tokens", None),
    ({"prompt": "w1", "temperature": -1}, "temperature", None),
    ({"prompt": "w1", "top_p": 0}, "top_p", None),
    ({"prompt": "w1", "stream": "yes"}, "stream", "invalid_type"),
    ({"prompt": "w1", "n": 0}, "n", None),
    ({"prompt": "w1", "logprobs": 21}, "logprobs", None),
    ({"prompt": "w1", "logprobs": True}, "logprobs", "invalid_type"),
    ({"prompt": "w1", "presence_penalty": 2.5}, "presence_penalty", None),
    ({"prompt": "w1", "echo": 1}, "echo", "invalid_type"),
    ({"prompt": "w1", "stop": [1]}, "stop", None),
    ({"prompt": []}, "prompt", "invalid_type"),
    ({"prompt": ["w1", 2]}, "prompt", "invalid_type"),
    ({"prompt": [1, 999]}, "prompt", None),
    ({"prompt": 5}, "prompt", "invalid_type"),
    ({"prompt": ""}, "prompt", None),
]


@pytest.mark.parametrize("body, param, code", BAD_REQUESTS)
def test_malformed_completion_requests_get_400_openai_errors(server, body, param, code):
    client = httpx.Client(base_url=server.url, timeout=30)
    kwargs = {"content": body} if isinstance(body, bytes) else {"json": body}
    response = client.post("/v1/completions", **kwargs)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (
        set(error) == {"message", "type", "param", "code"}
        and error["type"] == "invalid_request_error"
    )
    assert (error["param"], error["code"]) == (param, code) and error["message"]


REFUSED = [
    ("logit_bias", {"5": 100}),
    ("logit_bias", {"999999": 1}),
    ("repetition_penalty", 1.2),
    ("prompt_logprobs", 1),
    ("suffix", " w3"),
    ("min_tokens", 4),
    ("response_format", {"type": "json_object"}),
    ("tools", [{"type": "function", "function": {"name": "f"}}]),
    ("best_of", 3),
    ("stop_token_ids", [3]),
]
NEUTRAL = {
    "logit_bias": {},
    "presence_penalty": 0,
    "frequency_penalty": 0.0,
    "suffix": "",
    "min_tokens": 0,
    "response_format": {"type": "text"},
    "tools": [],
    "n": 1,
    "best_of": 1,
    "echo": False,
    "logprobs": None,
}


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_unimplemented_parameters_are_refused_naming_them_and_their_defaults_accepted(server, path):
    """A field the server does not implement gets 400 naming it (never 200 with the field
    ignored); the values that ask for nothing (OpenAI's defaults) are served as without them."""
    client = httpx.Client(base_url=server.url, timeout=30)
    prompt = text_prompts(1, 8, seed=5)[0]
    base = {"temperature": 0, "max_tokens": NUM_NEW}
    base.update(
        {"prompt": prompt}
        if "chat" not in path
        else {"messages": [{"role": "user", "content": prompt}]}
    )
    for name, value in REFUSED:
        response = client.post(path, json={**base, name: value})
        assert response.status_code == 400, (name, value, response.text)
        error = response.json()["error"]
        assert (error["param"], error["code"], error["type"]) == (
            name,
            "unsupported",
            "invalid_request_error",
        )
        assert f"'{name}' = {json.dumps(value)} is not supported" in error["message"], error
    plain = client.post(path, json=base).json()["choices"][0]
    neutral = client.post(path, json={**base, **NEUTRAL})
    assert neutral.status_code == 200, neutral.text
    assert neutral.json()["choices"][0] == plain


def test_malformed_chat_requests_and_unknown_model(server):
    client = httpx.Client(base_url=server.url, timeout=30)
    for body, param in (
        ({}, "messages"),
        ({"messages": "hi"}, "messages"),
        ({"messages": []}, "messages"),
        ({"messages": [{"content": "w1"}]}, "messages[0]"),
        ({"messages": [{"role": "user", "content": 3}]}, "messages[0]"),
        (
            {"messages": [{"role": "user", "content": "w1"}], "max_completion_tokens": "x"},
            "max_completion_tokens",
        ),
    ):
        response = client.post("/v1/chat/completions", json=body)
        assert response.status_code == 400 and response.json()["error"]["param"] == param, body
    response = completion(client, prompt="w1", model="gpt-4")
    error = response.json()["error"]
    assert response.status_code == 404 and (error["type"], error["code"]) == (
        "invalid_request_error",
        "model_not_found",
    )


def test_oversize_prompt_is_refused_before_generating(server):
    client = httpx.Client(base_url=server.url, timeout=30)
    before = client.get("/metrics").text
    response = completion(client, prompt=" ".join(["w5"] * 120), max_tokens=10)
    assert response.status_code == 400
    error = response.json()["error"]
    assert (
        error["code"] == "context_length_exceeded" and "120 + max_new_tokens 10" in error["message"]
    )
    chat = client.post(
        "/v1/chat/completions", json={"messages": [{"role": "user", "content": "w5 " * 130}]}
    )
    assert chat.status_code == 400 and chat.json()["error"]["code"] == "context_length_exceeded"
    assert spec_counters(client) == scrape_counters(before, "specdraft:")  # nothing generated
    room = (
        client.get("/v1/models").json()["data"][0]["max_model_len"] - 120
    )  # the one rule /v1/models shows
    assert f"ask for at most {room} new tokens," in error["message"]
    assert completion(client, prompt=" ".join(["w5"] * 120), max_tokens=room).status_code == 200


def test_sixteen_concurrent_requests_equal_single_request_outputs(server):
    prompts = text_prompts(16, 8, seed=4)
    client = httpx.Client(base_url=server.url, timeout=60)
    single = [completion(client, prompt=p).json()["choices"][0]["text"] for p in prompts]

    async def one(aclient: httpx.AsyncClient, i: int, prompt: str) -> str:
        body = {"prompt": prompt, "temperature": 0, "max_tokens": NUM_NEW}
        if i % 2:
            body["stream"] = True
            async with aclient.stream("POST", "/v1/completions", json=body) as response:
                texts = [
                    json.loads(line[6:])["choices"][0]["text"]
                    async for line in response.aiter_lines()
                    if line.startswith("data: {")
                ]
            return "".join(texts)
        return (await aclient.post("/v1/completions", json=body)).json()["choices"][0]["text"]

    async def main() -> list[str]:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as aclient:
            return await asyncio.gather(*(one(aclient, i, p) for i, p in enumerate(prompts)))

    assert asyncio.run(main()) == single
    assert single[:3] == [greedy_text(p) for p in prompts[:3]]


def wait_health(client: httpx.Client, **state) -> None:
    deadline = time.monotonic() + 10
    while any(client.get("/health").json()[k] != v for k, v in state.items()):
        assert time.monotonic() < deadline, f"server never reached {state}"
        time.sleep(0.01)


def metric(client: httpx.Client, name: str) -> float:
    for family in text_string_to_metric_families(client.get("/metrics").text):
        for sample in family.samples:
            if sample.name == name:
                return sample.value
    raise KeyError(name)


def test_disconnect_mid_stream_frees_the_worker():
    setup = tiny_setup("llama")
    tok = word_tokenizer()
    target = slow_target(setup.target, 0.005)  # >= 1 s for 200 tokens
    forwards, forward = [], target.forward
    target.forward = lambda *args, **kwargs: forwards.append(1) or forward(*args, **kwargs)
    slow = engine(target, None, None, tok, max_seq_len=256)
    with running(slow, tok) as srv:
        client = httpx.Client(base_url=srv.url, timeout=30)
        sock = open_stream(srv.url, "w1 w2 w3", 200)
        sock.close()
        body = completion(client, prompt="w4 w5", max_tokens=4).json()
        assert body["usage"]["completion_tokens"] == 4
        # counted, not timed: the disconnected request stopped long before its 200 tokens
        assert len(forwards) < 100, (
            f"{len(forwards)} target forwards: the disconnected one kept running"
        )
        assert metric(client, "specdraft:request_cancelled_total") == 1
        assert metric(client, "specdraft:generation_tokens_total") == 4


def test_full_queue_gets_429_and_recovers():
    setup = tiny_setup("llama")
    tok = word_tokenizer()
    slow = engine(slow_target(setup.target, 0.005), None, None, tok, max_seq_len=256)
    with running(slow, tok, max_queue=1) as srv:
        client = httpx.Client(base_url=srv.url, timeout=30)
        sock = open_stream(srv.url, "w1 w2 w3", 200)  # running
        wait_health(client, running=1)
        waiting: list = []
        other = httpx.Client(base_url=srv.url, timeout=30)
        thread = threading.Thread(
            target=lambda: waiting.append(completion(other, prompt="w7", max_tokens=3))
        )
        thread.start()
        wait_health(client, waiting=1)
        response = completion(client, prompt="w8", max_tokens=3)
        assert response.status_code == 429 and response.json()["error"]["code"] == "queue_full"
        sock.close()  # frees the worker: the waiting request runs
        thread.join(10)
        assert (
            waiting[0].status_code == 200 and waiting[0].json()["usage"]["completion_tokens"] == 3
        )
        assert completion(client, prompt="w8", max_tokens=3).status_code == 200
        assert metric(client, "specdraft:request_rejected_total") == 1


def send_request(url: str, body: dict) -> socket.socket:
    """A raw /v1/completions request, sent; returns the socket without reading the answer."""
    host, port = url.removeprefix("http://").split(":")
    data = json.dumps(body).encode()
    sock = socket.create_connection((host, int(port)), timeout=10)
    sock.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(data), data)
    )
    return sock


def test_a_queued_request_whose_client_left_counts_as_cancelled():
    """arrivals = success + cancelled + rejected: a waiting request whose client disconnected
    before the worker took it was dropped without counting."""
    setup = tiny_setup("llama")
    tok = word_tokenizer()
    slow = engine(slow_target(setup.target, 0.02), None, None, tok, max_seq_len=256)  # 4 s / 200
    with running(slow, tok, max_queue=2) as srv:
        client = httpx.Client(base_url=srv.url, timeout=30)
        busy = open_stream(srv.url, "w1 w2 w3", 200)  # running
        wait_health(client, running=1)
        queued = send_request(srv.url, {"prompt": "w7", "max_tokens": 3, "temperature": 0})
        wait_health(client, waiting=1)
        queued.close()
        time.sleep(4 * 0.25)  # the server polls a waiting client every 0.25 s (DISCONNECT_POLL_S)
        busy.close()
        assert completion(client, prompt="w8", max_tokens=3).status_code == 200
        wait_health(client, running=0, waiting=0)
        success = metric(client, "specdraft:request_success_total")
        cancelled = metric(client, "specdraft:request_cancelled_total")
        assert (success, cancelled, metric(client, "specdraft:request_rejected_total")) == (1, 2, 0)


def test_plain_server_usage_and_log_line(caplog):
    setup = tiny_setup("llama")
    tok = word_tokenizer()
    prompt = text_prompts(1, 8, seed=5)[0]
    with (
        caplog.at_level(logging.INFO, logger="specdraft.serve"),
        running(engine(own_target(setup), None, None, tok), tok, log_every=5) as srv,
    ):
        client = httpx.Client(base_url=srv.url, timeout=30)
        body = completion(client, prompt=prompt).json()
        assert body["choices"][0]["text"] == greedy_text(prompt)
        assert body["usage"]["accept_length"] == 1.0 and body["usage"]["num_draft_tokens"] == 0
        assert spec_counters(client)["num_drafts"] == 0  # no speculation: spec counters stay still
    lines = [r.getMessage() for r in caplog.records if "verification steps" in r.getMessage()]
    assert (
        len(lines) == 2 and "accept len 1.00" in lines[0] and "gen throughput (token/s)" in lines[0]
    )


def test_build_app_from_directories(tmp_path):
    setup = tiny_setup("llama")
    target, draft = saved_pair(setup, tmp_path)
    app = build_app(str(target), str(draft), SpecConfig(3, 2, 6), max_seq_len=64)
    with serve_in_thread(app) as srv:
        client = httpx.Client(base_url=srv.url, timeout=30)
        assert client.get("/v1/models").json()["data"][0]["id"] == "target"
        prompt = text_prompts(1, 8, seed=6)[0]
        body = completion(client, prompt=prompt).json()
        assert body["choices"][0]["text"] == greedy_text(prompt)
        assert body["usage"]["num_draft_tokens"] == 5 * body["usage"]["num_drafts"]


def test_importing_the_cli_does_not_import_the_server_stack():
    code = (
        "import sys, specdraft.cli, specdraft.serve.server, specdraft.client, specdraft.bench.sweep, "
        "specdraft.bench.report, specdraft.bench.tune; "
        "print(sorted(m for m in ('fastapi', 'uvicorn', 'prometheus_client', 'starlette') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"


def test_serve_on_a_busy_port_is_one_line_before_the_model_loads(monkeypatch):
    from typer.testing import CliRunner

    import specdraft.serve.server
    from specdraft.cli import app

    monkeypatch.setattr(
        specdraft.serve.server, "build_app", lambda *a, **k: pytest.fail("loaded the model")
    )
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        result = CliRunner().invoke(
            app,
            cli_args("serve", target=tiny_setup("llama").target_dir, no_spec=True, port=port),
        )
    assert result.exit_code == 1, result.output
    lines = result.output.strip().splitlines()
    assert (
        len(lines) == 1
        and f"cannot listen on 127.0.0.1:{port}" in lines[0]
        and "pass another --port" in lines[0]
    )


def test_serve_says_what_it_serves_once_loaded(monkeypatch, tmp_path):
    """One line before uvicorn's: the model name clients send, the base URL, and the decoding
    (drafter and its settings, or plain and why)."""
    from types import SimpleNamespace

    from typer.testing import CliRunner

    import specdraft.serve.server
    from specdraft.cli import app
    from specdraft.engine.schedule import BatchSchedule

    served = []
    fake_app = SimpleNamespace(
        state=SimpleNamespace(
            server=SimpleNamespace(
                model_name="tiny",
                worker=SimpleNamespace(
                    scheduler=SimpleNamespace(max_num_seqs=5, schedule=BatchSchedule.constant(4, 5))
                ),
                engine=SimpleNamespace(
                    notes=["num_steps 4 > the drafter's 2 training-time-test steps"],
                    draft=SimpleNamespace(cfg={"fc_norm": True, "norm_output": True}),
                ),
            )
        )
    )
    monkeypatch.setattr(specdraft.serve.server, "build_app", lambda *a, **k: fake_app)
    monkeypatch.setattr(
        specdraft.serve.server, "serve", lambda app_, host, port: served.append((host, port))
    )
    target = str(tiny_setup("llama").target_dir)
    for extra, how in (
        (["--no-spec"], "plain decoding (no --draft)"),
        (["--draft", str(tmp_path), "--no-spec"], "plain decoding (--no-spec)"),
        (
            ["--draft", str(tmp_path), "--num-steps", "4"],
            f"speculative decoding with drafter {tmp_path} (steps 4, topk 1, draft tokens 5)",
        ),
    ):
        result = CliRunner().invoke(
            app, ["serve", "--target", target, "--port", "8123", *extra], env={"COLUMNS": "400"}
        )
        assert result.exit_code == 0, result.output
        assert (
            f"serving model 'tiny' ({target}) at http://127.0.0.1:8123/v1: {how}" in result.output
        )
        assert (
            "note: num_steps 4 > the drafter's 2 training-time-test steps" in result.output
        )  # load_engine's
        assert "drafter: eagle3.1 (fc_norm, norm_output)\n" in result.output  # its method
        assert "sequences: batches of up to 5 (--max-num-seqs)" in result.output
        if "--no-spec" not in extra:  # the K by batch size it runs (--spec-schedule, else constant)
            assert "speculation by batch size: 1-5: K 4" in result.output
    assert served == [("127.0.0.1", 8123)] * 3
