"""doctor --samples files: a texts or chats JSONL carries the data_hash training records for it
(`data.render.data_hash` of the whole file rendered), so doctor can tell training data from
held-out samples."""

from __future__ import annotations

import json

from specdraft.data.render import data_hash, load_dataset
from specdraft.doctor.samples import read_samples
from tests.tiny_tokenizer import tiny_chat_tokenizer

TEXTS = ["hello , how are you ?", "i am fine , thanks .", "what is the capital of france ?", "paris ."]


def test_a_texts_file_carries_the_data_hash_training_records_for_it(tmp_path):
    tok = tiny_chat_tokenizer()
    texts = tmp_path / "texts.jsonl"
    texts.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    read = read_samples(texts, lambda: tok, {}, max_samples=2, max_length=4)
    assert len(read.samples) == 2 and all(len(s.input_ids) <= 4 for s in read.samples)
    assert read.data_hash == data_hash(load_dataset(texts, tok, chat=False).samples)  # the whole file, as trained
    rows = tmp_path / "ids.jsonl"
    rows.write_text(json.dumps({"input_ids": [1, 5, 6, 7]}) + "\n")
    assert read_samples(rows, lambda: tok, {}, max_samples=2, max_length=8).data_hash is None
