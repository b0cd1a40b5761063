"""`return_token_ids` (vLLM's extension) on specdraft's server: the prompt's and the output's
token ids, the ids the engine ran, in completions and chat, streamed and not (ids held back with
a possible stop string arrive with a later chunk); absent unless asked; a non-bool is a 400."""

from __future__ import annotations

import json

import httpx
import pytest

from specdraft.engine.spec_config import SpecConfig
from tests.support.engine_helpers import greedy_sequences, one_thread, tiny_setup  # noqa: F401
from tests.support.serve_helpers import engine, own_target, running, text_prompts, word_tokenizer

NUM_NEW = 12


@pytest.fixture(scope="module")
def client():
    """A client of a speculative server (briefly trained drafter, 3-step chain)."""
    setup = tiny_setup("llama")
    tok = word_tokenizer()
    with running(engine(own_target(setup), setup.trained, SpecConfig.chain(3), tok), tok) as srv:
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            yield c


def greedy_ids(prompt_ids: list[int], num_new: int = NUM_NEW) -> list[int]:
    return greedy_sequences(tiny_setup("llama").target, [prompt_ids], num_new)[
        0, len(prompt_ids) :
    ].tolist()


def streamed(client: httpx.Client, path: str, body: dict) -> list[dict]:
    with client.stream("POST", path, json={**body, "stream": True}) as response:
        assert response.status_code == 200
        lines = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def test_completion_returns_the_ids_the_engine_ran(client):
    prompt = text_prompts(1, 8, seed=21)[0]
    prompt_ids = word_tokenizer()(prompt)["input_ids"]
    body = {"prompt": prompt, "temperature": 0, "max_tokens": NUM_NEW, "return_token_ids": True}
    choice = client.post("/v1/completions", json=body).json()["choices"][0]
    assert (choice["prompt_token_ids"], choice["token_ids"]) == (prompt_ids, greedy_ids(prompt_ids))
    events = streamed(client, "/v1/completions", body)
    assert events[0]["choices"][0]["prompt_token_ids"] == prompt_ids
    assert all("prompt_token_ids" not in e["choices"][0] for e in events[1:])
    assert sum((e["choices"][0]["token_ids"] for e in events), []) == greedy_ids(prompt_ids)
    plain = client.post("/v1/completions", json={**body, "return_token_ids": False}).json()[
        "choices"
    ][0]
    assert "token_ids" not in plain and "prompt_token_ids" not in plain


def test_ids_held_back_with_a_stop_string_arrive_later(client):
    """Text that may begin a stop string is held back; its ids travel with the next chunk."""
    prompt = text_prompts(1, 8, seed=22)[0]
    prompt_ids = word_tokenizer()(prompt)["input_ids"]
    out = greedy_ids(prompt_ids)
    words = [f"w{i}" for i in out]
    stop = " ".join(words[5:7])  # cut after 6 tokens, a chunk of text held back before it
    body = {
        "prompt": prompt,
        "temperature": 0,
        "max_tokens": NUM_NEW,
        "stop": stop,
        "return_token_ids": True,
    }
    events = streamed(client, "/v1/completions", body)
    text = "".join(e["choices"][0]["text"] for e in events)
    continuation = " " + " ".join(words)  # after the prompt's words
    assert text == continuation[: continuation.find(stop)]
    assert (
        sum((e["choices"][0]["token_ids"] for e in events), []) == out[:7]
    )  # through the stop string
    choice = client.post("/v1/completions", json=body).json()["choices"][0]
    assert choice["text"] == text and choice["token_ids"] == out[:7]


def test_chat_returns_the_rendered_prompt_ids(client):
    tok = word_tokenizer()
    messages = [{"role": "user", "content": text_prompts(1, 6, seed=23)[0]}]
    prompt_ids = tok(
        tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True),
        add_special_tokens=False,
    )["input_ids"]
    body = {"messages": messages, "temperature": 0, "max_tokens": 5, "return_token_ids": True}
    choice = client.post("/v1/chat/completions", json=body).json()["choices"][0]
    assert (choice["prompt_token_ids"], choice["token_ids"]) == (
        prompt_ids,
        greedy_ids(prompt_ids, 5),
    )
    events = streamed(client, "/v1/chat/completions", body)
    assert events[0]["choices"][0]["prompt_token_ids"] == prompt_ids
    assert sum((e["choices"][0]["token_ids"] for e in events), []) == greedy_ids(prompt_ids, 5)


def test_return_token_ids_must_be_a_bool(client):
    response = client.post("/v1/completions", json={"prompt": "w1", "return_token_ids": "yes"})
    assert response.status_code == 400
    assert (response.json()["error"]["param"], response.json()["error"]["code"]) == (
        "return_token_ids",
        "invalid_type",
    )
