"""FC-02: vocab map dropped, zeroed or stored as direct ids (draft vocab 256 < target vocab 512)."""

import pytest
import torch

from specdraft.data.vocab import (
    build_vocab_map,
    draft_to_target_ids,
    target_ids_of_draft_vocab,
    validate_vocab_map,
)

VOCAB, DRAFT_VOCAB = 512, 256


@pytest.fixture
def good_map():
    # Frequent tokens sit high in the vocabulary, as in a real tokenizer's content ids.
    generator = torch.Generator().manual_seed(0)
    counts = torch.randint(0, 5, (VOCAB,), generator=generator)
    counts[200:456] += 100
    return build_vocab_map(counts, DRAFT_VOCAB)


def test_case_fc02_good_map_passes(good_map):
    assert validate_vocab_map(good_map.d2t, good_map.t2d, VOCAB, DRAFT_VOCAB) == []
    assert validate_vocab_map(good_map.d2t, None, VOCAB, DRAFT_VOCAB) == []
    assert target_ids_of_draft_vocab(good_map.d2t).tolist() == list(range(200, 456))


def test_case_fc02_d2t_missing(good_map):
    (problem,) = validate_vocab_map(None, good_map.t2d, VOCAB, DRAFT_VOCAB)
    assert "d2t missing" in problem and "build_vocab_map" in problem
    assert validate_vocab_map(None, None, VOCAB, VOCAB) == []  # same vocab: identity is right


def test_case_fc02_d2t_all_zeros(good_map):
    zeros = torch.zeros(DRAFT_VOCAB, dtype=torch.int64)
    (problem,) = validate_vocab_map(zeros, good_map.t2d, VOCAB, DRAFT_VOCAB)
    assert "all zeros" in problem and "t2d" in problem
    # A zero map is the identity; it is only wrong when t2d says the draft holds other ids.
    first_ids = torch.zeros(VOCAB, dtype=torch.bool)
    first_ids[:DRAFT_VOCAB] = True
    assert validate_vocab_map(zeros, first_ids, VOCAB, DRAFT_VOCAB) == []
    # The wrong map emits wrong target tokens for every draft token: acceptance ~ 0.
    draft_ids = torch.arange(DRAFT_VOCAB)
    agree = draft_to_target_ids(draft_ids, zeros) == draft_to_target_ids(draft_ids, good_map.d2t)
    assert agree.float().mean().item() == 0.0


def test_case_fc02_direct_ids_instead_of_offsets(good_map):
    direct = target_ids_of_draft_vocab(good_map.d2t)  # ids 200..455: offsets overflow the vocab
    for t2d in (good_map.t2d, None):
        (problem,) = validate_vocab_map(direct, t2d, VOCAB, DRAFT_VOCAB)
        assert "direct target ids" in problem and "ids - arange" in problem


def test_case_fc02_direct_ids_that_look_like_offsets():
    # Direct ids 0..255 as offsets give 0, 2, ..., 510: in range and increasing. Only t2d
    # reveals the fault; without it the map is indistinguishable from a legal one.
    direct = torch.arange(DRAFT_VOCAB)
    t2d = torch.zeros(VOCAB, dtype=torch.bool)
    t2d[:DRAFT_VOCAB] = True
    (problem,) = validate_vocab_map(direct, t2d, VOCAB, DRAFT_VOCAB)
    assert "direct target ids" in problem
    assert validate_vocab_map(direct, None, VOCAB, DRAFT_VOCAB) == []


def test_case_fc02_shape_dtype_order_and_t2d(good_map):
    (problem,) = validate_vocab_map(good_map.d2t.int(), good_map.t2d, VOCAB, DRAFT_VOCAB)
    assert "int64" in problem
    (problem,) = validate_vocab_map(good_map.d2t[:-1], good_map.t2d, VOCAB, DRAFT_VOCAB)
    assert "[256]" in problem
    shuffled = good_map.d2t.clone()
    shuffled[[10, 11]] = shuffled[[11, 10]] + torch.tensor([-3, 3])
    problems = validate_vocab_map(shuffled, None, VOCAB, DRAFT_VOCAB)
    assert any("strictly increasing" in p for p in problems)
    flipped = good_map.t2d.clone()
    flipped[200] = False
    problems = validate_vocab_map(good_map.d2t, flipped, VOCAB, DRAFT_VOCAB)
    assert any("t2d marks 255 ids" in p for p in problems)
    assert any("t2d disagrees with d2t" in p for p in problems)
    (problem,) = validate_vocab_map(good_map.d2t, good_map.t2d.long(), VOCAB, DRAFT_VOCAB)
    assert "t2d must be bool" in problem
    assert "exceeds" in validate_vocab_map(None, None, VOCAB, VOCAB + 1)[0]
