"""Bad data input is a SpecdraftError naming the file or value, still a ValueError."""

from __future__ import annotations

import pytest
import torch

from specdraft.data.reasoning import check_mode
from specdraft.data.records import DataError, read_records
from specdraft.data.vocab import DraftVocabSizeError, build_vocab_map
from specdraft.errors import SpecdraftError


def test_a_data_file_that_is_not_utf8_is_named_as_unreadable(tmp_path):
    path = tmp_path / "chats.jsonl"
    path.write_bytes(b'{"messages": [{"role": "user", "content": "\xff\xfe"}]}\n')
    with pytest.raises(DataError, match=r"chats.jsonl: cannot be read \(not UTF-8 text"):
        read_records(path)


def test_an_unknown_reasoning_mode_is_a_data_error():
    with pytest.raises(DataError, match="--reasoning 'maybe'"):
        check_mode("maybe")


def test_a_draft_vocabulary_past_the_usable_one_is_a_specdraft_error():
    with pytest.raises(DraftVocabSizeError, match="draft_vocab_size 9 must be in 1..8") as caught:
        build_vocab_map(torch.ones(8, dtype=torch.long), 9)
    assert isinstance(caught.value, SpecdraftError) and isinstance(caught.value, ValueError)
