"""An output is decoded as the continuation of its prompt (engine text, serve's TextStream, the
generate CLI's stream): SentencePiece-style tokenizers drop the word-start space of a decode's
first token, so decoding the output alone turned "Once upon" + " a time" into "Once upona time"
(seen on the bundled stories260K model through `serve`)."""

from __future__ import annotations

import pytest

from specdraft.engine.requests import decode_continuation
from specdraft.serve.text_stream import TextStream
from specdraft.stories260k import (
    TOKENIZER_FILE,
    build_tokenizer,
    bundled_dir,
    read_llama2c_tokenizer,
)


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer(read_llama2c_tokenizer(bundled_dir() / TOKENIZER_FILE))


def split(tokenizer, prompt: str, full: str) -> tuple[list[int], list[int]]:
    ids = tokenizer(full)["input_ids"]
    prompt_ids = tokenizer(prompt)["input_ids"]
    assert ids[: len(prompt_ids)] == prompt_ids
    return prompt_ids, ids[len(prompt_ids) :]


def test_the_continuation_keeps_its_leading_space(tokenizer):
    prompt_ids, output_ids = split(tokenizer, "Once upon", "Once upon a time, there was a cat.")
    assert tokenizer.decode(output_ids) == "a time, there was a cat."  # the bug: the space is gone
    assert decode_continuation(tokenizer, prompt_ids, output_ids) == " a time, there was a cat."
    assert decode_continuation(tokenizer, prompt_ids, []) == ""
    assert (
        decode_continuation(tokenizer, [], output_ids) == "a time, there was a cat."
    )  # no prompt: as it was


def test_text_stream_releases_the_continuation_with_its_space(tokenizer):
    prompt_ids, output_ids = split(tokenizer, "Once upon", "Once upon a time, there was a cat.")
    stream = TextStream(tokenizer, (".",), prompt_ids)
    pieces = [stream.push([token]) for token in output_ids]
    text = "".join(pieces) + stream.finish()
    assert text == " a time, there was a cat"  # cut before the stop string, first piece " a"
    assert pieces[0].startswith(" ")


def test_a_split_character_falls_back_to_the_output_alone(tokenizer):
    """The prompt's last ids end inside a multi-byte character (byte fallback): their decoded
    text is no prefix of the whole; the output is then decoded alone."""
    ids = tokenizer("Once upon a time ünder")["input_ids"]
    byte_ids = [i for i in ids if tokenizer.convert_ids_to_tokens(i).startswith("<0x")]
    if len(byte_ids) < 2:
        pytest.skip("ü is a piece of its own in this vocabulary")
    cut = ids.index(byte_ids[0]) + 1  # between the two bytes of ü
    prompt_ids, output_ids = ids[:cut], ids[cut:]
    assert decode_continuation(tokenizer, prompt_ids, output_ids) == tokenizer.decode(output_ids)
