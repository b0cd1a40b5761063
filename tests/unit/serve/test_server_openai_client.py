"""The official `openai` client against specdraft serve (loopback, the tiny seeded target and a
briefly trained drafter): completions and chat, streamed and not, stop strings, models.retrieve,
and refusals raised as the client's typed exceptions (BadRequestError, NotFoundError)."""

from __future__ import annotations

import openai
import pytest

from tests.support.serve_helpers import (
    NUM_NEW,
    greedy_text,
    spec_server,
    text_prompts,
    word_tokenizer,
)


@pytest.fixture(scope="module")
def client():
    with spec_server() as srv:
        with openai.OpenAI(
            base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=30
        ) as c:
            yield c


def chat_expected(prompt: str, num_new: int) -> str:
    tok = word_tokenizer()
    ids = tok(
        tok.apply_chat_template(
            [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
        ),
        add_special_tokens=False,
    )["input_ids"]
    return greedy_text("", num_new, ids=ids)


def test_completions_streamed_and_not_equal_greedy_and_stop_cuts(client):
    prompt = text_prompts(1, 8, seed=11)[0]
    full = greedy_text(prompt)
    out = client.completions.create(model="tiny", prompt=prompt, max_tokens=NUM_NEW, temperature=0)
    assert out.choices[0].text == full and out.choices[0].finish_reason == "length"
    assert (out.usage.prompt_tokens, out.usage.completion_tokens) == (8, NUM_NEW)
    chunks = client.completions.create(
        model="tiny", prompt=prompt, max_tokens=NUM_NEW, temperature=0, stream=True
    )
    assert "".join(c.choices[0].text for c in chunks) == full
    stop = " ".join(full.split()[3:5])
    cut = client.completions.create(
        model="tiny", prompt=prompt, max_tokens=NUM_NEW, temperature=0, stop=[stop]
    )
    assert cut.choices[0].text == full[: full.find(stop)] and cut.choices[0].finish_reason == "stop"


def test_chat_streamed_and_not_equal_greedy(client):
    prompt = text_prompts(1, 6, seed=12)[0]
    expected = chat_expected(prompt, 6)
    messages = [{"role": "user", "content": prompt}]
    out = client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=6, temperature=0
    )
    assert out.choices[0].message.role == "assistant" and out.choices[0].message.content == expected
    chunks = list(
        client.chat.completions.create(
            model="tiny",
            messages=messages,
            max_completion_tokens=6,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == expected
    assert chunks[-1].usage.completion_tokens == 6


def test_models_retrieve_and_list(client):
    model = client.models.retrieve("tiny")
    assert (model.id, model.object, model.owned_by) == ("tiny", "model", "specdraft")
    assert [m.id for m in client.models.list()] == ["tiny"]


def test_refusals_are_the_clients_typed_exceptions(client):
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(model="tiny", prompt="w1 w2", max_tokens=4, logit_bias={"5": 100})
    assert refused.value.status_code == 400 and refused.value.param == "logit_bias"
    assert refused.value.code == "unsupported" and "'logit_bias'" in refused.value.message
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "w1"}], presence_penalty=3.0
        )
    assert refused.value.param == "presence_penalty"
    with pytest.raises(openai.NotFoundError) as missing:
        client.models.retrieve("gpt-4")
    assert missing.value.status_code == 404 and missing.value.code == "model_not_found"
    assert "'gpt-4' does not exist" in missing.value.message
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-4", prompt="w1", max_tokens=2)


def test_a_list_of_prompts_n_echo_and_logprobs_through_the_client(client):
    prompts = text_prompts(2, 6, seed=13)
    out = client.completions.create(
        model="tiny", prompt=prompts, n=2, max_tokens=6, temperature=0, logprobs=2
    )
    assert [c.index for c in out.choices] == [0, 1, 2, 3]
    for choice in out.choices:
        assert choice.text == greedy_text(prompts[choice.index // 2], 6)
        lp = choice.logprobs
        assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 6
        assert all(top[t] == v for t, v, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs))
    assert out.usage.prompt_tokens == 12 and out.usage.completion_tokens == 24
    echoed = client.completions.create(
        model="tiny", prompt=prompts[0], max_tokens=6, temperature=0, echo=True
    )
    assert echoed.choices[0].text == prompts[0] + greedy_text(prompts[0], 6)


def test_chat_logprobs_and_penalties_through_the_client(client):
    messages = [{"role": "user", "content": text_prompts(1, 5, seed=14)[0]}]
    out = client.chat.completions.create(
        model="tiny",
        messages=messages,
        max_tokens=6,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
        presence_penalty=0.5,
        frequency_penalty=0.5,
    )
    content = out.choices[0].logprobs.content
    assert len(content) == out.usage.completion_tokens == 6
    assert all(len(e.top_logprobs) == 3 and e.bytes == list(e.token.encode()) for e in content)
    assert "".join(e.token for e in content) == out.choices[0].message.content
