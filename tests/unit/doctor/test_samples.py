"""doctor --samples files: a texts or chats JSONL carries the data_hash training records for it
(`data.render.data_hash` of the whole file rendered), so doctor can tell training data from
held-out samples."""

from __future__ import annotations

import json

import pytest

from specdraft.data.render import data_hash, load_dataset
from specdraft.doctor.samples import read_samples
from tests.support.tiny_tokenizer import tiny_chat_tokenizer

TEXTS = [
    "hello , how are you ?",
    "i am fine , thanks .",
    "what is the capital of france ?",
    "paris .",
]


def test_a_texts_file_carries_the_data_hash_training_records_for_it(tmp_path):
    tok = tiny_chat_tokenizer()
    texts = tmp_path / "texts.jsonl"
    texts.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    read = read_samples(texts, lambda: tok, {}, max_samples=2, max_length=4)
    assert len(read.samples) == 2 and all(len(s.input_ids) <= 4 for s in read.samples)
    assert read.data_hash == data_hash(
        load_dataset(texts, tok, chat=False).samples
    )  # the whole file, as trained


def test_input_ids_rows_of_the_training_data_hash_as_it(store, tmp_path):
    """{"input_ids", "loss_mask"} rows holding a store's samples, all of them in order, carry the
    data_hash its index records (they carried none); any other rows carry another."""
    from specdraft.capture.store import CaptureStore

    captured = CaptureStore(store)
    rows = [
        {
            "input_ids": captured[i]["input_ids"].tolist(),
            "loss_mask": captured[i]["loss_mask"].int().tolist(),
        }
        for i in range(len(captured))
    ]
    file = tmp_path / "ids.jsonl"
    file.write_text("".join(json.dumps(r) + "\n" for r in rows))
    read = read_samples(file, lambda: None, {}, max_samples=2, max_length=8)
    assert len(read.samples) == 2 and read.num_records == len(rows) > 2
    assert read.data_hash == captured.meta["data_hash"]  # every row hashed, not the 2 read
    file.write_text("".join(json.dumps(r) + "\n" for r in rows[:-1]))
    assert (
        read_samples(file, lambda: None, {}, max_samples=2, max_length=8).data_hash
        != captured.meta["data_hash"]
    )


def test_prompts_alone_are_refused_in_one_line_saying_what_doctor_needs(tmp_path):
    """bench's {"prompt"} rows hold no continuation to score: one line naming the file, what the
    rows lack and the rows doctor takes (not read_records' generic field error)."""
    from specdraft.data.records import DataError

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in TEXTS))
    with pytest.raises(DataError) as e:
        read_samples(prompts, tiny_chat_tokenizer, {}, max_samples=2, max_length=8)
    assert str(e.value) == (
        f"{prompts}: prompts without what follows them; doctor scores the drafter's guesses "
        'of the target\'s own text, so each row needs it: give {"prompt", "completion"} '
        'rows (the target\'s outputs) or {"text"} rows'
    )


def test_a_chat_prompt_is_tokenized_as_a_server_renders_it():
    """tune --prompts with chat rows: the template with its generation prompt, no second BOS."""
    from specdraft.data.render import prompt_ids

    tok = tiny_chat_tokenizer()
    chat = [{"role": "user", "content": "hello , how are you ?"}]
    rendered = tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    assert prompt_ids(tok, chat) == tok(rendered, add_special_tokens=False)["input_ids"]
    assert prompt_ids(tok, "hello") == tok("hello")["input_ids"]
