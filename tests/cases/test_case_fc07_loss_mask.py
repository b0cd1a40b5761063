"""FC-07: the loss mask is shifted with the inputs.

Two-turn synthetic chat with known assistant spans. At draft position t, step k, the label is
token t+2+k (DESIGN.md §2); after the shift exactly the positions whose label is an assistant
token are supervised; the first assistant token x_a is the label of draft position a-2 at step 0,
whose target distribution is the target's logits at the last prompt position a-1.
"""

from __future__ import annotations

import pytest
import torch

from specdraft.data.labels import (
    check_has_supervision,
    draft_loss_mask,
    label_position,
    target_logit_position,
)
from specdraft.data.render import render_chat
from tests.support.tiny_tokenizer import tiny_chat_tokenizer, turns

TWO_TURNS = turns("hello", "hi .", "tell me a story", "once upon a time")
# <s> <|user|> hello <|end|> <|assistant|> hi . <|end|> <|user|> tell me a story <|end|>
#  0      1      2      3          4       5  6    7       8      9  10 11  12     13
# <|assistant|> once upon a time <|end|>
#      14        15   16  17 18    19
ASSISTANT_POSITIONS = [5, 6, 7, 15, 16, 17, 18, 19]


def test_case_fc07_rendered_spans_are_known():
    tok = tiny_chat_tokenizer()
    (s,) = render_chat(tok, TWO_TURNS)
    assert len(s.input_ids) == 20
    assert [t for t, m in enumerate(s.loss_mask) if m] == ASSISTANT_POSITIONS
    assert tok.convert_ids_to_tokens(s.input_ids)[4] == "<|assistant|>"


@pytest.mark.parametrize("step", [0, 1, 2])
def test_case_fc07_supervised_iff_label_is_assistant(step):
    (s,) = render_chat(tiny_chat_tokenizer(), TWO_TURNS)
    mask = torch.tensor([s.loss_mask, s.loss_mask[::-1]], dtype=torch.bool)  # batch of 2
    out = draft_loss_mask(mask, step)
    assert out.shape == mask.shape and out.dtype == torch.bool
    T = mask.shape[1]
    for b in range(2):
        expected = [
            label_position(t, step) < T and bool(mask[b, label_position(t, step)]) for t in range(T)
        ]
        assert out[b].tolist() == expected
    supervised = [t for t in range(T) if out[0, t]]
    assert [label_position(t, step) for t in supervised] == [
        p for p in ASSISTANT_POSITIONS if p - 2 - step >= 0
    ]


def test_case_fc07_first_assistant_token_predicted_from_last_prompt_position():
    (s,) = render_chat(tiny_chat_tokenizer(), TWO_TURNS)
    mask = torch.tensor([s.loss_mask], dtype=torch.bool)
    step0 = draft_loss_mask(mask, 0)[0]
    for a in (5, 15):  # first token of each assistant turn
        assert not s.loss_mask[a - 1] and s.loss_mask[a]
        t = a - 2
        assert step0[t] and not step0[t - 1]
        assert label_position(t, 0) == a
        assert target_logit_position(t, 0) == a - 1  # the last prompt position (<|assistant|>)
    # At step k the same label a is reached from draft position a-2-k, target logits at a-1.
    for k in range(3):
        assert draft_loss_mask(mask, k)[0, 15 - 2 - k]
        assert target_logit_position(15 - 2 - k, k) == 14


def test_case_fc07_batch_without_supervision_raises():
    check_has_supervision(torch.tensor([[0, 0, 1]], dtype=torch.bool))
    with pytest.raises(ValueError, match="no supervised token"):
        check_has_supervision(torch.zeros(2, 8, dtype=torch.bool))
    # A label only at positions 0/1 cannot be predicted by any draft position.
    with pytest.raises(ValueError, match="no supervised token"):
        check_has_supervision(torch.tensor([[1, 1, 0, 0]], dtype=torch.bool))
    with pytest.raises(ValueError, match="step"):
        draft_loss_mask(torch.ones(1, 4, dtype=torch.bool), -1)
