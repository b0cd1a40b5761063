"""TTT loss pieces: target logits from last_hidden, masks, counts, weights and rates."""

from __future__ import annotations

import pytest
import torch

from specdraft.targets import load_target
from specdraft.train.loss import (
    shift_left,
    step_weights,
    supervised_counts,
    target_logits,
    ttt_attention_mask,
    ttt_loss,
    ttt_unroll,
    weighted_loss,
)
from specdraft.train.metrics import TTTMetrics
from tests.support.drafts import ttt_draft
from tests.support.tiny_models import tiny_config

STEPS = 3


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_target_logits_from_last_hidden_equal_the_targets(arch):
    target = load_target(tiny_config(arch, num_layers=3), seed=1)
    ids = torch.randint(0, 128, (2, 11), generator=torch.Generator().manual_seed(0))
    out = target.forward(ids, aux_layers=[1])
    logits = target_logits(
        out.last_hidden, target.final_norm.weight, target.lm_head.weight, target.config.rms_norm_eps
    )
    assert logits.dtype == torch.float32
    torch.testing.assert_close(logits, out.logits, rtol=1e-6, atol=1e-6)


def test_target_logits_refuses_mismatched_head():
    with pytest.raises(ValueError, match="do not fit hidden width 8"):
        target_logits(torch.zeros(1, 2, 8), torch.ones(8), torch.zeros(5, 4), 1e-6)


def test_ttt_attention_mask_is_causal_then_diagonal():
    mask = ttt_attention_mask(3, 2)
    assert mask.shape == (1, 1, 3, 9)
    causal = [[1, 0, 0], [1, 1, 0], [1, 1, 1]]
    diag = [[1, 0, 0], [0, 1, 0], [0, 0, 1]]
    expected = torch.tensor([c + d + d for c, d in zip(causal, diag)], dtype=torch.bool)
    assert torch.equal(mask[0, 0], expected)


def test_shift_left_fills_past_the_end():
    x = torch.arange(5)[None]
    assert shift_left(x, 2, -1).tolist() == [[2, 3, 4, -1, -1]]
    assert shift_left(x, 7, -1).tolist() == [[-1] * 5]


def batch(seed: int, vocab: int = 48, t_len: int = 12):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (2, t_len), generator=g)
    aux = torch.randn(2, t_len, 48, generator=g, dtype=torch.float64)
    logits = 3 * torch.randn(2, t_len, vocab, generator=g, dtype=torch.float64)
    loss_mask = torch.rand(2, t_len, generator=g) < 0.7
    return ids, aux, logits, loss_mask


def test_counts_match_a_position_loop():
    """correct/total/cond counts against a plain loop over (b, t, k) with the documented rules."""
    draft = ttt_draft(2, vocab=48, draft_vocab=30)
    draft.d2t.copy_(
        torch.arange(30) // 2
    )  # draft id i -> target id i + i // 2 (0, 1, 3, 4, 6, ...)
    draft.t2d.zero_()
    draft.t2d[torch.arange(30) + draft.d2t] = True
    ids, aux, logits, loss_mask = batch(0)
    with torch.no_grad():
        preds = [
            draft.draft_to_target(o.logits.argmax(-1)) for o in ttt_unroll(draft, ids, aux, STEPS)
        ]
    # make step 0 right at most positions: target argmax at t+1 := the draft's step-0 guess at t
    agree = torch.rand(ids.shape, generator=torch.Generator().manual_seed(1)) < 0.8
    for b, t in agree[:, :-1].nonzero().tolist():
        logits[b, t + 1, preds[0][b, t]] += 20
    out = ttt_loss(draft, ids, aux, logits, loss_mask, ttt_steps=STEPS)
    t_len = ids.shape[1]
    correct, total, cond_correct, cond_total = ([0] * STEPS for _ in range(4))
    for b in range(2):
        for t in range(t_len):
            chain = True  # supervised and correct at all earlier steps
            for k in range(STEPS):
                j = t + 1 + k  # target position
                sup = (
                    j + 1 < t_len
                    and bool(loss_mask[b, j + 1])
                    and bool(draft.t2d[logits[b, j].argmax()])
                )
                hit = sup and int(preds[k][b, t]) == int(logits[b, j].argmax())
                total[k] += sup
                correct[k] += hit
                cond_total[k] += chain and sup
                cond_correct[k] += chain and hit
                chain = chain and hit
    assert out.total.tolist() == total and out.correct.tolist() == correct
    assert supervised_counts(draft, logits, loss_mask, STEPS).tolist() == total  # without the draft
    assert out.cond_total.tolist() == cond_total and out.cond_correct.tolist() == cond_correct
    assert sum(correct) > 0 and sum(cond_total[1:]) > 0  # the test exercises every branch


def test_loss_is_weighted_mean_kl_and_ignores_logits_outside_the_draft_vocab():
    draft = ttt_draft(1, vocab=48, draft_vocab=40)  # draft vocab = target ids 0..39
    ids, aux, logits, loss_mask = batch(1)
    logits[..., 5] += 20  # argmax in the draft vocabulary everywhere
    out = ttt_loss(draft, ids, aux, logits, loss_mask, ttt_steps=STEPS, step_weight=0.5)
    expected = sum(0.5**k * out.step_losses[k] for k in range(STEPS))
    torch.testing.assert_close(out.loss.detach(), expected.to(out.loss.dtype))
    assert bool((out.step_losses > 0).all())
    changed = logits.clone()
    changed[..., 40:] -= 2.0  # p renormalised over the draft vocabulary: no effect
    again = ttt_loss(draft, ids, aux, changed, loss_mask, ttt_steps=STEPS, step_weight=0.5)
    torch.testing.assert_close(again.step_loss_sums, out.step_loss_sums)
    out.loss.backward()
    assert draft.fc.weight.grad is not None and draft.embed_tokens.weight.grad is None


def test_ttt_loss_refuses_bad_inputs():
    draft = ttt_draft(0)
    ids, aux, logits, loss_mask = batch(0)
    with pytest.raises(ValueError, match="at least 1"):
        ttt_loss(draft, ids, aux, logits, loss_mask, ttt_steps=0)
    with pytest.raises(ValueError, match="shapes disagree"):
        ttt_loss(draft, ids, aux, logits[:, :-1], loss_mask)


def test_weighted_loss_normalises_by_given_counts():
    sums = torch.tensor([4.0, 3.0, 0.0])
    loss = weighted_loss(sums, torch.tensor([2, 3, 0]), 0.8)
    assert float(loss) == pytest.approx(4 / 2 + 0.8 * 3 / 3)
    assert step_weights(3, 0.8) == pytest.approx([1.0, 0.8, 0.64])


def test_metrics_rates_and_tau_from_raw_counts():
    m = TTTMetrics.zeros(3)
    m.correct += torch.tensor([8, 6, 3])
    m.total += torch.tensor([10, 10, 10])
    m.cond_correct += torch.tensor([8, 6, 2])
    m.cond_total += torch.tensor([10, 8, 4])
    assert m.accuracy() == [0.8, 0.6, 0.3]
    assert m.alpha() == [0.8, 0.75, 0.5]
    assert m.tau() == pytest.approx(1 + 0.8 + 0.8 * 0.75 + 0.8 * 0.75 * 0.5)
    assert TTTMetrics.zeros(2).alpha() == [0.0, 0.0] and TTTMetrics.zeros(2).tau() == 1.0
    summary = m.to_dict()
    assert summary["cond_total"] == [10, 8, 4] and summary["tau"] == pytest.approx(m.tau())
