"""specdraft.serve.info_routes through FastAPI's TestClient: vLLM's /version, /tokenize (a
completion prompt or chat messages, token strings on request) and /detokenize in vLLM's shapes
with 400s for bad input, and /v1/models reporting as max_model_len the longest request the engine
takes (and takes it)."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from specdraft import __version__
from specdraft.engine.spec_config import SpecConfig
from specdraft.serve.server import build_app, create_app
from tests.support.engine_helpers import MAX_SEQ, one_thread, tiny_setup  # noqa: F401
from tests.support.serve_helpers import engine, own_target, saved_pair, word_tokenizer


@pytest.fixture(scope="module")
def client():
    tok = word_tokenizer()
    eng = engine(own_target(tiny_setup("llama")), None, None, tok)
    with TestClient(create_app(eng, tok, "tiny", end_ids=())) as c:
        yield c


def test_version_in_vllms_shape(client):
    assert client.get("/version").json() == {"version": __version__}


def test_tokenize_a_prompt_and_chat_messages(client):
    body = client.post("/tokenize", json={"model": "tiny", "prompt": "w5 w6 w7"}).json()
    assert body == {"count": 3, "max_model_len": MAX_SEQ, "tokens": [5, 6, 7]}
    strs = client.post("/tokenize", json={"prompt": "w5 w6", "return_token_strs": True}).json()
    assert strs["token_strs"] == ["w5", "w6"]
    messages = [{"role": "user", "content": "w5 w6"}]
    chat = client.post("/tokenize", json={"messages": messages}).json()
    assert chat["tokens"] == [5, 6, 3]  # the template's generation prompt "w3" added
    bare = client.post("/tokenize", json={"messages": messages, "add_generation_prompt": False})
    assert bare.json()["tokens"] == [5, 6]


def test_detokenize_returns_the_text_as_prompt(client):
    assert client.post("/detokenize", json={"tokens": [5, 6, 7]}).json() == {"prompt": "w5 w6 w7"}


@pytest.mark.parametrize(
    "path, body, param",
    [
        ("/tokenize", {}, "prompt"),
        ("/tokenize", {"prompt": 5}, "prompt"),
        ("/tokenize", {"prompt": "w1", "model": "other"}, "model"),
        ("/detokenize", {"tokens": [1, 999]}, "tokens"),
        ("/detokenize", {"tokens": []}, "tokens"),
        ("/detokenize", {}, "tokens"),
    ],
)
def test_bad_tokenizer_requests_get_openai_errors(client, path, body, param):
    response = client.post(path, json=body)
    assert response.status_code in (400, 404)
    assert response.json()["error"]["param"] == param


@pytest.mark.parametrize("spec", [SpecConfig.chain(3), None])
def test_models_report_the_longest_request_the_engine_takes(tmp_path, spec):
    """max_model_len is the model's own, as vLLM reports it: the tiny target's 256 positions
    (the engine's cache as long), with speculation or without, and a request of exactly that
    many tokens is served (its last rounds verify fewer nodes: `round.free_nodes`)."""
    room = 256
    target, draft = saved_pair(tiny_setup("llama"), tmp_path)
    with TestClient(build_app(str(target), str(draft), spec)) as c:
        assert c.get("/v1/models").json()["data"][0]["max_model_len"] == room
        assert c.post("/tokenize", json={"prompt": "w1"}).json()["max_model_len"] == room
        fits = {"prompt": [1] * (room - 2), "max_tokens": 2, "temperature": 0}
        assert c.post("/v1/completions", json=fits).status_code == 200
        over = c.post("/v1/completions", json={**fits, "max_tokens": 3})
        assert over.json()["error"]["code"] == "context_length_exceeded"
