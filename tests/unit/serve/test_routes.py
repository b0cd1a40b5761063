"""specdraft.serve.routes through FastAPI's TestClient (the tiny seeded target, a briefly trained
drafter): a list of prompts with n choices each (vLLM's numbering, each choice the single
request's output, usage over all), echo, logprobs in vLLM's completion and chat shapes (streamed
chunks adding up to the body), penalties served as the engine verifies them, a body over the
limit refused with 413 before anything reads it, /health answering while a big prompt is
tokenized, and a request of more sequences than the queue holds refused in one line."""

from __future__ import annotations

import json
import threading

import pytest
import torch
from fastapi.testclient import TestClient

from specdraft.engine.spec_config import SpecConfig
from specdraft.serve.server import create_app
from tests.support.engine_helpers import one_thread, target_pass, tiny_setup  # noqa: F401
from tests.support.serve_helpers import engine, own_target, text_prompts, word_tokenizer

NUM_NEW = 8


def app_of(tokenizer=None, **kwargs):
    """A speculative app (3-step chain) over `tokenizer` (default: the word tokenizer)."""
    setup, tok = tiny_setup("llama"), tokenizer or word_tokenizer()
    eng = engine(own_target(setup), setup.trained, SpecConfig.chain(3), word_tokenizer())
    return create_app(eng, tok, "tiny", end_ids=(), **kwargs)


@pytest.fixture(scope="module")
def client():
    with TestClient(app_of()) as c:
        yield c


def completion(client, **body) -> dict:
    response = client.post(
        "/v1/completions", json={"temperature": 0, "max_tokens": NUM_NEW, **body}
    )
    assert response.status_code == 200, response.text
    return response.json()


def streamed(client, path: str, body: dict) -> list[dict]:
    response = client.post(path, json={**body, "stream": True})
    assert response.status_code == 200, response.text
    lines = [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def test_a_list_of_prompts_with_n_choices_each(client):
    prompts = text_prompts(2, 6, seed=41) + [[5, 6, 7]]
    body = completion(client, prompt=prompts, n=2, temperature=0.8, seed=3)
    assert [c["index"] for c in body["choices"]] == list(range(6))
    for i, choice in enumerate(body["choices"]):  # choice i = prompt i // 2, seed 3 + i % 2
        alone = completion(client, prompt=prompts[i // 2], temperature=0.8, seed=3 + i % 2)
        assert choice["text"] == alone["choices"][0]["text"]
    assert body["choices"][0]["text"] != body["choices"][1]["text"]  # distinct samples
    usage = body["usage"]
    assert usage["prompt_tokens"] == 6 + 6 + 3  # each prompt once, as vLLM counts
    assert usage["completion_tokens"] == 6 * NUM_NEW
    steps = sum(  # the speculative counts are the choices' together
        completion(client, prompt=prompts[i // 2], temperature=0.8, seed=3 + i % 2)["usage"][
            "num_drafts"
        ]
        for i in range(6)
    )
    assert usage["num_drafts"] == steps
    chunks = streamed(client, "/v1/completions", {"prompt": prompts, "n": 2, "temperature": 0.8,
                      "seed": 3, "max_tokens": NUM_NEW})  # fmt: skip
    texts = [""] * 6
    for chunk in chunks:
        for c in chunk["choices"]:
            texts[c["index"]] += c["text"]
    assert texts == [c["text"] for c in body["choices"]]


def test_echo_puts_the_prompt_and_its_scores_first(client):
    prompt = text_prompts(1, 5, seed=42)[0]
    plain = completion(client, prompt=prompt)["choices"][0]
    echoed = completion(client, prompt=prompt, echo=True, logprobs=1)["choices"][0]
    assert echoed["text"] == prompt + plain["text"]
    logprobs = echoed["logprobs"]
    assert "".join(logprobs["tokens"][:5]) == prompt and logprobs["token_logprobs"][0] is None
    assert logprobs["top_logprobs"][0] is None and len(logprobs["tokens"]) == 5 + NUM_NEW
    ids = word_tokenizer()(prompt)["input_ids"]
    rows = target_pass(tiny_setup("llama").target, torch.tensor([ids]))[0][0].log_softmax(-1)
    assert logprobs["token_logprobs"][1] == pytest.approx(float(rows[0, ids[1]]), abs=1e-4)
    chunks = streamed(client, "/v1/completions", {"prompt": prompt, "echo": True,
                      "temperature": 0, "max_tokens": NUM_NEW})  # fmt: skip
    assert chunks[0]["choices"][0]["text"] == prompt
    assert "".join(c["choices"][0]["text"] for c in chunks) == echoed["text"]


def test_completion_logprobs_in_vllms_shape_streamed_and_not(client):
    prompt = text_prompts(1, 6, seed=43)[0]
    choice = completion(client, prompt=prompt, logprobs=3)["choices"][0]
    lp = choice["logprobs"]
    assert set(lp) == {"tokens", "token_logprobs", "top_logprobs", "text_offset"}
    # each token's text as it reads after the ones before it (its word-start space kept), so the
    # texts join into the choice's text and each offset indexes it (a trial saw them stripped)
    assert "".join(lp["tokens"]) == choice["text"] and lp["tokens"][0].startswith(" ")
    for token, value, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"]):
        assert top[token] == value and 3 <= len(top) <= 4 and value == max(top.values())  # T=0
    for token, offset in zip(lp["tokens"], lp["text_offset"]):
        assert choice["text"][offset : offset + len(token)] == token
    chunks = streamed(client, "/v1/completions", {"prompt": prompt, "logprobs": 3,
                      "temperature": 0, "max_tokens": NUM_NEW})  # fmt: skip
    merged = {k: [] for k in lp}
    for chunk in chunks:
        for k, v in (chunk["choices"][0]["logprobs"] or {}).items():
            merged[k] += v
    assert merged == lp


def test_chat_logprobs_and_top_logprobs_streamed_and_not(client):
    messages = [{"role": "user", "content": text_prompts(1, 5, seed=44)[0]}]
    body = {"messages": messages, "temperature": 0, "max_tokens": NUM_NEW}
    response = client.post(
        "/v1/chat/completions", json={**body, "logprobs": True, "top_logprobs": 2}
    )
    choice = response.json()["choices"][0]
    content = choice["logprobs"]["content"]
    assert "".join(e["token"] for e in content) == choice["message"]["content"]
    for entry in content:
        assert set(entry) == {"token", "logprob", "bytes", "top_logprobs"}
        assert entry["bytes"] == list(entry["token"].encode())
        top = entry["top_logprobs"]
        assert len(top) == 2 and top[0]["logprob"] >= top[1]["logprob"]
        assert top[0] == {k: entry[k] for k in ("token", "logprob", "bytes")}  # T = 0: argmax
    chunks = streamed(client, "/v1/chat/completions", {**body, "logprobs": True, "top_logprobs": 2})
    merged = [e for c in chunks if c["choices"][0]["logprobs"] for e in c["choices"][0]["logprobs"]["content"]]  # fmt: skip
    assert merged == content
    plain = client.post("/v1/chat/completions", json={**body, "logprobs": False}).json()
    assert plain["choices"][0]["logprobs"] is None
    refused = client.post("/v1/chat/completions", json={**body, "top_logprobs": 2})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "top_logprobs"
    echo = client.post("/v1/chat/completions", json={**body, "echo": True}).json()["error"]
    assert (echo["param"], echo["code"]) == ("echo", "unsupported")


def test_penalties_are_served_as_the_engine_verifies_them(client):
    prompt = [3, 4, 5]
    penalties = {"presence_penalty": -1.5, "frequency_penalty": -0.5}
    served = completion(client, prompt=prompt, max_tokens=16, return_token_ids=True, **penalties)
    plain_app = create_app(
        engine(own_target(tiny_setup("llama"))), word_tokenizer(), "tiny", end_ids=()
    )
    with TestClient(plain_app) as plain:
        expected = completion(
            plain, prompt=prompt, max_tokens=16, return_token_ids=True, **penalties
        )
        unpenalised = completion(plain, prompt=prompt, max_tokens=16, return_token_ids=True)
    ids = served["choices"][0]["token_ids"]
    assert ids == expected["choices"][0]["token_ids"]
    assert ids != unpenalised["choices"][0]["token_ids"]


class GatedTokenizer:
    """The word tokenizer whose encoding of a text longer than `big` characters waits for
    `release` (at most 20 s) and counts its calls: a tokenization that takes long."""

    def __init__(self, big: int) -> None:
        self.inner, self.big, self.calls = word_tokenizer(), big, 0
        self.entered, self.release, self.done = threading.Event(), threading.Event(), False

    def __call__(self, text, **kwargs):
        self.calls += 1
        if len(text) > self.big:
            self.entered.set()
            self.release.wait(20)
            self.done = True
        return self.inner(text, **kwargs)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_a_body_over_the_limit_gets_413_before_anything_reads_it():
    tok = GatedTokenizer(big=10**9)
    with TestClient(app_of(tok)) as c:
        prompt = "w1 " * (5 * 10**6 // 3)  # 5 MB
        response = c.post("/v1/completions", json={"prompt": prompt, "max_tokens": 2})
        assert response.status_code == 413
        error = response.json()["error"]
        assert error["code"] == "request_too_large" and "\n" not in error["message"]
        assert "--max-request-bytes" in error["message"] and "4194304 bytes" in error["message"]
        assert tok.calls == 0  # refused from its Content-Length, never parsed nor tokenized
        chunked = c.post("/tokenize", content=iter([b'{"prompt": "', b"w1 " * 2**21, b'"}']))
        assert chunked.status_code == 413  # no Content-Length: refused once the limit is passed
        assert (
            c.post("/v1/completions", json={"prompt": "w1 w2", "max_tokens": 2}).status_code == 200
        )


def test_health_answers_while_a_big_prompt_is_tokenized():
    tok = GatedTokenizer(big=10**5)
    with TestClient(app_of(tok, max_request_bytes=10**7)) as c:
        prompt = "w1 " * 10**6  # 3 MB, under this server's limit
        answer = {}
        big = threading.Thread(
            target=lambda: answer.update(r=c.post("/v1/completions", json={"prompt": prompt}))
        )
        big.start()
        assert tok.entered.wait(20)
        health = c.get("/health")
        tokenized_meanwhile = tok.done
        tok.release.set()
        big.join(30)
    assert health.status_code == 200 and not tokenized_meanwhile
    assert answer["r"].status_code == 400  # then refused: 3 M tokens do not fit the context
    assert answer["r"].json()["error"]["code"] == "context_length_exceeded"


def test_more_sequences_than_the_queue_holds_are_refused_in_one_line():
    with TestClient(app_of(max_queue=3)) as c:
        response = c.post("/v1/completions", json={"prompt": ["w1", "w2"], "n": 2, "max_tokens": 2})
        assert response.status_code == 400
        error = response.json()["error"]
        assert "needs 4 sequences" in error["message"] and "--max-queue" in error["message"]
        ok = c.post("/v1/completions", json={"prompt": ["w1", "w2", "w3"], "max_tokens": 2})
        assert ok.status_code == 200 and len(ok.json()["choices"]) == 3
