"""DFlash's block-wise training pieces (specdraft/train/dflash_loss.py): anchors, the block mask,
the labels and the weighted loss, on exact values."""

from __future__ import annotations

import math

import torch

from specdraft.train.dflash_loss import (
    Blocks,
    block_acceptance,
    block_inputs,
    block_labels,
    block_mask,
    sample_anchors,
    target_tokens,
    weighted_block_loss,
)


def test_block_mask_each_block_sees_context_before_its_anchor_and_its_own_block():
    blocks = Blocks(torch.tensor([[2, 5, 0]]), torch.tensor([[True, True, False]]))
    mask = block_mask(blocks, seq_len=6, block_size=2)[0, 0].int().tolist()
    # keys: context 0..5, then block 0 (2 keys), block 1, block 2
    assert mask == [
        [1, 1, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0],
        [1, 1, 1, 1, 1, 0, 0, 0, 1, 1, 0, 0],
        [1, 1, 1, 1, 1, 0, 0, 0, 1, 1, 0, 0],
        [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1],  # an unused block: its own keys only
        [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1],
    ]


def test_anchors_are_loss_masked_positions_that_leave_room_for_a_block():
    loss_mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1, 1, 1, 1], [0, 0, 0, 0, 0, 0, 1, 1, 1, 1]])
    blocks = sample_anchors(loss_mask, block_size=4, num_anchors=3, seeds=[7, 8])
    assert blocks.anchors.shape == (2, 3)
    first = blocks.anchors[0].tolist()
    assert first == sorted(first) and set(first) <= {2, 3, 4, 5, 6} and len(set(first)) == 3
    assert blocks.keep.tolist() == [[True, True, True], [True, False, False]]
    assert blocks.anchors[1, 0] == 6  # the only position <= T - 4 in the answer
    # a row's draw is its seed's: the same in another batch, padded to another length
    alone = sample_anchors(loss_mask[:1], 4, 3, seeds=[7])
    assert torch.equal(alone.anchors[0], blocks.anchors[0])
    padded = torch.cat([loss_mask, torch.zeros(2, 5, dtype=loss_mask.dtype)], dim=1)
    assert torch.equal(sample_anchors(padded, 4, 3, seeds=[7, 8]).anchors, blocks.anchors)
    assert not torch.equal(sample_anchors(loss_mask[:1], 4, 3, seeds=[9]).anchors, alone.anchors)


def test_block_inputs_and_labels():
    ids = torch.arange(10, 20)[None]
    loss_mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1, 1, 0, 1]])
    blocks = Blocks(torch.tensor([[2, 7]]), torch.tensor([[True, True]]))
    block_ids, positions = block_inputs(ids, blocks, block_size=3, mask_token_id=99)
    assert block_ids.tolist() == [[12, 99, 99, 17, 99, 99]]
    assert positions.tolist() == [list(range(10)) + [2, 3, 4, 7, 8, 9]]
    labels, supervised = block_labels(ids, loss_mask, blocks, block_size=3)
    assert labels.tolist() == [[[13, 14], [18, 19]]]
    assert supervised.tolist() == [[[True, True], [False, True]]]  # loss_mask[8] = 0


def test_weighted_loss_is_the_decayed_weighted_mean():
    sums = torch.tensor([2.0, 3.0, 4.0], dtype=torch.float64)
    counts = torch.tensor([2, 2, 1])
    assert float(weighted_block_loss(sums, counts, None)) == 9.0 / 5.0
    w = [1.0, math.exp(-1 / 7), math.exp(-2 / 7)]
    expected = (2 * w[0] + 3 * w[1] + 4 * w[2]) / (2 * w[0] + 2 * w[1] + 1 * w[2])
    assert math.isclose(float(weighted_block_loss(sums, counts, 7.0)), expected, rel_tol=1e-6)


def test_target_tokens_are_the_greedy_choice_given_the_tokens_before():
    ids = torch.tensor([[5, 6, 7, 8]])
    logits = torch.zeros(1, 4, 10)
    for t, best in enumerate([3, 6, 9, 1]):  # logits at t choose the token at t + 1
        logits[0, t, best] = 1.0
    assert target_tokens(ids, logits).tolist() == [[5, 3, 6, 9]]


def test_block_acceptance_counts_each_block_as_an_engines_round():
    drafts = torch.tensor([[[1, 2, 3], [1, 9, 3], [4, 4, 4], [7, 7, 7]]])
    greedy = torch.tensor([[[1, 2, 3], [1, 2, 3], [5, 4, 4], [7, 7, 7]]])
    supervised = torch.tensor([[[1, 1, 1], [1, 1, 1], [1, 1, 1], [0, 0, 0]]], dtype=torch.bool)
    rounds, accepted = block_acceptance(drafts, greedy, supervised)
    # block 0 accepts 3 drafts, block 1 one (its second draft is wrong, the third does not count),
    # block 2 none, block 3 is unsupervised (no round)
    assert int(rounds) == 3 and accepted.tolist() == [2, 1, 1]
