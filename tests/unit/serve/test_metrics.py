"""specdraft.serve.metrics: vLLM's request, token, queue and latency metrics
(`conventions.vllm_serving.REQUEST_METRICS`) under vLLM's names, types and labels beside
specdraft's, counting the same requests: finished by reason, prompt and generated tokens, one
observation per request of each latency (one per verification step of the inter-token latency),
and the running / waiting gauges back at 0."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from specdraft.conventions.vllm_serving import REQUEST_METRICS
from specdraft.engine.spec_config import SpecConfig
from specdraft.serve.server import create_app
from tests.support.engine_helpers import one_thread, tiny_setup  # noqa: F401
from tests.support.serve_helpers import engine, own_target, text_prompts, word_tokenizer

LABELS = {"model_name": "tiny", "engine": "0"}


@pytest.fixture(scope="module")
def scraped():
    """(/metrics families by name, the responses' usages) after 3 requests (one of 2 choices)."""
    setup, tok = tiny_setup("llama"), word_tokenizer()
    eng = engine(own_target(setup), setup.trained, SpecConfig.chain(3), tok)
    with TestClient(create_app(eng, tok, "tiny", end_ids=())) as c:
        prompts = text_prompts(2, 6, seed=51)
        bodies = [
            {"prompt": prompts[0], "max_tokens": 7, "temperature": 0},
            {"prompt": prompts[1], "max_tokens": 5, "temperature": 0.7, "seed": 1, "n": 2},
        ]
        usages = [c.post("/v1/completions", json=b).json()["usage"] for b in bodies]
        text = c.get("/metrics").text
    return {f.name: f for f in text_string_to_metric_families(text)}, usages


def samples(family, suffix: str = "") -> list:
    return [s for s in family.samples if s.name == family.name + suffix]


def test_every_vllm_request_metric_is_there_with_vllms_type_and_labels(scraped):
    families, _ = scraped
    for metric in REQUEST_METRICS:
        family = families["vllm:" + metric.name]
        assert family.type == metric.kind, metric.name
        assert "specdraft:" + metric.name in families
        for s in family.samples:
            assert {k: s.labels[k] for k in LABELS} == LABELS, (metric.name, s.labels)


def test_vllm_names_count_the_same_requests_and_tokens(scraped):
    families, usages = scraped
    num_sequences = 3  # the second request ran two choices
    success = samples(families["vllm:request_success"], "_total")
    assert [(s.labels["finished_reason"], s.value) for s in success] == [("length", 3.0)]
    prompt = samples(families["vllm:prompt_tokens"], "_total")[0].value
    assert prompt == 6 * num_sequences  # per sequence, as vLLM's engine counts prefills
    generated = samples(families["vllm:generation_tokens"], "_total")[0].value
    assert generated == sum(u["completion_tokens"] for u in usages) == 7 + 5 + 5
    for name in (
        "time_to_first_token_seconds",
        "e2e_request_latency_seconds",
        "request_queue_time_seconds",
        "request_prefill_time_seconds",
        "request_decode_time_seconds",
        "request_time_per_output_token_seconds",
    ):
        assert samples(families["vllm:" + name], "_count")[0].value == num_sequences, name
    steps = sum(u["num_drafts"] for u in usages)
    itl = families["vllm:inter_token_latency_seconds"]
    assert samples(itl, "_count")[0].value == steps
    for gauge in ("num_requests_running", "num_requests_waiting"):
        assert samples(families["vllm:" + gauge])[0].value == 0
    mine = samples(families["specdraft:request_success"], "_total")
    assert [s.value for s in mine] == [3.0]
