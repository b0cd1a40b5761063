"""specdraft.data: reading, chat-template rendering, loss masks, vocabulary counts, data hash."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tokenizers import processors

from specdraft.data.labels import token_counts
from specdraft.data.records import DataError, read_records
from specdraft.data.render import (
    Sample,
    data_hash,
    load_dataset,
    render_chat,
    render_text,
    template_hash,
    tokenizer_fingerprint,
)
from tests.support.tiny_tokenizer import CHAT, TEMPLATE, save_tiny_tokenizer, tiny_chat_tokenizer  # noqa: F401


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def tokens(tok, sample: Sample, masked: bool) -> list[str]:
    return [
        t
        for t, m in zip(tok.convert_ids_to_tokens(sample.input_ids), sample.loss_mask)
        if m == masked
    ]


def test_chat_mask_is_exactly_the_assistant_turns():
    tok = tiny_chat_tokenizer()
    (s,) = render_chat(tok, CHAT)
    assert s.input_ids == tok.apply_chat_template(CHAT, tokenize=True)["input_ids"]
    assert tokens(tok, s, True) == [
        "i",
        "am",
        "fine",
        ",",
        "thanks",
        ".",
        "<|end|>",
        "paris",
        ".",
        "<|end|>",
    ]
    assert "<|assistant|>" in tokens(tok, s, False)


def test_openai_and_sharegpt_give_the_same_samples(tmp_path):
    tok = tiny_chat_tokenizer()
    names = {"system": "system", "user": "human", "assistant": "gpt"}
    share = {"conversations": [{"from": names[m["role"]], "value": m["content"]} for m in CHAT]}
    a = load_dataset(write_jsonl(tmp_path / "a.jsonl", [{"messages": CHAT}]), tok)
    b = load_dataset(write_jsonl(tmp_path / "b.jsonl", [share]), tok)
    assert a.samples == b.samples and a.render_info.template_hash == template_hash(tok)


def test_plain_text_documents_supervise_all_but_the_first_token(tmp_path):
    tok = tiny_chat_tokenizer()
    path = tmp_path / "docs.txt"
    path.write_text("once upon a time\nthere was a cat .\n\n\nthe dog sat on the mat .\n")
    data = load_dataset(path, tok, chat=False)
    assert len(data.samples) == 2 and not data.render_info.chat
    first = data.samples[0]
    assert first.input_ids[0] == tok.bos_token_id
    assert first.loss_mask == [0] + [1] * (len(first.input_ids) - 1)


def test_prompt_completion_supervises_the_completion_only():
    tok = tiny_chat_tokenizer()
    s = render_text(tok, "a little cat sat .", prompt="once upon a time ")
    assert tokens(tok, s, True) == ["a", "little", "cat", "sat", "."]
    assert tokens(tok, s, False) == ["<s>", "once", "upon", "a", "time"]
    # A tokenizer that appends EOS: the EOS is a label of the continuation, BOS never is.
    tok.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", special_tokens=[("<s>", 1), ("</s>", 2)]
    )
    s = render_text(tok, "a cat .", prompt="once upon ")
    assert tokens(tok, s, True) == ["a", "cat", ".", "</s>"]
    assert render_text(tok, "a cat .").loss_mask == [0, 1, 1, 1, 1]


def test_save_to_disk_dataset(tmp_path):
    import datasets

    datasets.Dataset.from_list([{"messages": CHAT}]).save_to_disk(str(tmp_path / "ds"))
    data = load_dataset(tmp_path / "ds", tiny_chat_tokenizer())
    assert data.samples == render_chat(tiny_chat_tokenizer(), CHAT)


@pytest.mark.parametrize(
    "line, reason",
    [
        ("{not json", "bad JSON"),
        ({"messages": [{"role": "robot", "content": "hi"}]}, "unknown role"),
        ({"messages": [{"role": "user", "content": "hi"}]}, "no assistant turn"),
        ({"messages": []}, "empty conversation"),
        ({"prompt": "x"}, "no 'messages' or 'conversations'"),
    ],
)
def test_bad_line_names_file_line_and_fix(tmp_path, line, reason):
    path = write_jsonl(tmp_path / "d.jsonl", [{"messages": CHAT}, line, {"messages": CHAT}])
    with pytest.raises(DataError, match=reason) as err:
        read_records(path)
    assert f"{path}:2:" in str(err.value) and "fix:" in str(err.value)
    records = read_records(path, skip_bad=True)
    assert len(records.records) == 2 and records.num_skipped == 1


def test_empty_dataset_names_the_file(tmp_path):
    path = write_jsonl(tmp_path / "empty.jsonl", [])
    with pytest.raises(DataError, match=f"{path}.*empty"):
        read_records(path)
    with pytest.raises(DataError, match="empty"):
        read_records(write_jsonl(tmp_path / "bad.jsonl", ["{"]), skip_bad=True)


def test_template_rewriting_history_gives_one_sample_per_turn(tmp_path):
    # Drops every assistant turn except the last one (history rewriting): each turn is trained
    # in the context the server renders for it, the dropped turn absent from the second sample.
    template = (
        "{% for m in messages %}{% if m['role'] != 'assistant' or loop.last %}"
        "<|{{ m['role'] }}|> {{ m['content'] }} <|end|> {% endif %}{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|> {% endif %}"
    )
    tok = tiny_chat_tokenizer(template)
    first, second = render_chat(tok, CHAT)
    assert tokens(tok, first, True) == ["i", "am", "fine", ",", "thanks", ".", "<|end|>"]
    assert tokens(tok, second, True) == ["paris", ".", "<|end|>"]
    assert "fine" not in tok.convert_ids_to_tokens(second.input_ids)
    path = write_jsonl(tmp_path / "d.jsonl", [{"messages": CHAT}, {"messages": CHAT[:3]}])
    assert len(load_dataset(path, tok).samples) == 3


def test_turn_rendered_unlike_its_prompt_is_refused(tmp_path):
    # The generation prompt opens "<|user|>" where the rendered turn opens "<|assistant|>".
    template = (
        "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} <|end|> {% endfor %}"
        "{% if add_generation_prompt %}<|user|> {% endif %}"
    )
    tok = tiny_chat_tokenizer(template)
    with pytest.raises(DataError, match="not prefix-stable"):
        render_chat(tok, CHAT)
    path = write_jsonl(tmp_path / "d.jsonl", [{"messages": CHAT}, {"messages": CHAT[:3]}])
    with pytest.raises(DataError, match=f"{path}:1: .*prefix-stable"):
        load_dataset(path, tok)
    with pytest.raises(DataError, match="no record could be rendered"):
        load_dataset(path, tok, skip_bad=True)


def test_fingerprint_and_template_hash():
    tok = tiny_chat_tokenizer()
    fp = tokenizer_fingerprint(tok)
    assert fp["bos_id"] == 1 and fp["eos_ids"] == [2] and fp["pad_id"] == 3 and fp["length"] == 85
    assert fp == tokenizer_fingerprint(tiny_chat_tokenizer())
    other = tiny_chat_tokenizer(TEMPLATE.replace("<|end|> ", "<|end|>"))
    assert template_hash(other) != template_hash(tok)
    assert tokenizer_fingerprint(other) == fp  # the template is not part of the vocabulary


def test_token_counts_count_labels_only():
    samples = [Sample([1, 5, 6, 6, 7], [0, 0, 1, 1, 1]), Sample([1, 7, 9], [0, 1, 0])]
    counts = token_counts(samples, vocab_size=10)
    assert counts.dtype == torch.long and counts.tolist() == [0, 0, 0, 0, 0, 0, 2, 2, 0, 0]
    with pytest.raises(ValueError, match="outside the target vocabulary"):
        token_counts([Sample([1, 12], [0, 1])], vocab_size=10)


def test_data_hash_covers_ids_mask_and_boundaries():
    a = [Sample([1, 5, 6], [0, 1, 1]), Sample([1, 7], [0, 1])]
    assert data_hash(a) == data_hash([Sample(list(s.input_ids), list(s.loss_mask)) for s in a])
    assert data_hash(a) != data_hash([Sample([1, 5, 6], [0, 0, 1]), a[1]])
    assert data_hash(a) != data_hash([Sample([1, 5], [0, 1]), Sample([6, 1, 7], [1, 0, 1])])
