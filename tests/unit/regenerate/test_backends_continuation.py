"""regenerate with a local chat target decodes each answer as the continuation of its rendered
prompt (`engine.requests.decode_continuation`, as the endpoint path and `serve` do). Decoded
alone, a SentencePiece answer lost its word-start space ("▁a" alone is "a"), so prompt + answer
re-tokenised to other ids than the target generated. The bundled stories260K model and tokenizer
(SentencePiece-style), with a chat template that writes the turns one after another."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from specdraft.data.records import read_records
from specdraft.regenerate.backends import LocalBackend, Sampling
from specdraft.regenerate.run import regenerate
from specdraft.stories260k import convert_stories260k

TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
PROMPTS = ["Once upon", "The little dog", "Lily and Tom went to the"]


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    path = convert_stories260k(tmp_path_factory.mktemp("stories") / "target")
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.chat_template = TEMPLATE
    tokenizer.save_pretrained(path)
    return path


def generated_ids(target, prompt_ids: list[int], num: int) -> list[int]:
    model = AutoModelForCausalLM.from_pretrained(target).eval()
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt_ids]),
            max_new_tokens=num,
            do_sample=False,
            eos_token_id=2,
            pad_token_id=2,
        )
    return out[0, len(prompt_ids) :].tolist()


def test_local_chat_answers_re_tokenise_to_the_generated_ids(target, tmp_path):
    data = tmp_path / "chats.jsonl"
    data.write_text(
        "".join(json.dumps({"messages": [{"role": "user", "content": p}]}) + "\n" for p in PROMPTS)
    )
    out = tmp_path / "out.jsonl"
    records = read_records(data, require_assistant=False)
    regenerate(records, out, LocalBackend(target), Sampling(max_new_tokens=8))
    tokenizer = AutoTokenizer.from_pretrained(target)
    word_starts = 0
    for prompt, line in zip(PROMPTS, out.read_text().splitlines()):
        answer = json.loads(line)["messages"][-1]["content"]
        prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        new_ids = generated_ids(target, prompt_ids, 8)
        assert (
            tokenizer(prompt + answer, add_special_tokens=False)["input_ids"]
            == prompt_ids + new_ids
        )
        if tokenizer.convert_ids_to_tokens(new_ids[0]).startswith(
            "\u2581"
        ):  # the answer starts a word
            word_starts += 1
            assert answer.startswith(" ") and not tokenizer.decode(new_ids).startswith(" ")
    assert word_starts >= 1  # the case that lost its space
