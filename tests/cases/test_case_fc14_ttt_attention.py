"""FC-14: the TTT attention mask must give later unroll steps exactly the engine's keys.

The reference is a naive recursion that builds, for every base position t and step k, the
explicit list of keys the engine has in its cache (step-0 keys at positions <= t, then the
keys of steps 1..k-1 drafted from t) and runs the draft one query at a time, in float64.
"""

from __future__ import annotations

import pytest
import torch

from specdraft.draft import KV, Eagle3Draft
from specdraft.train.loss import flex_by_default, ttt_loss, ttt_unroll
from tests.support.drafts import ttt_draft, ttt_inputs

STEPS = 4


def naive_unroll(
    draft: Eagle3Draft, ids: torch.Tensor, aux: torch.Tensor, steps: int
) -> list[torch.Tensor]:
    """Per-step logits [1, T, Vd], one query at a time with an explicit engine cache."""
    t_len = ids.shape[1]
    padded = torch.cat([ids, ids.new_zeros(1, steps + 1)], 1)  # same fill as the vectorized path
    kv0: list[KV] = []
    hidden = {}  # (k, t) -> [1, 1, H]
    kvs = {}  # (k, t) -> KV of one position
    logits = [
        torch.zeros(1, t_len, draft.cfg.draft_vocab_size, dtype=aux.dtype) for _ in range(steps)
    ]
    for t in range(t_len):
        out = draft(
            padded[:, t + 1 : t + 2],
            aux[:, t : t + 1],
            torch.tensor([[t]]),
            first_step=True,
            past_kv=KV.cat(kv0) if kv0 else None,
        )
        kv0.append(out.kv)
        hidden[0, t], logits[0][:, t] = out.hidden, out.logits[:, 0]
    for t in range(t_len):
        for k in range(1, steps):
            cache = kv0[: t + 1] + [kvs[j, t] for j in range(1, k)]
            out = draft(
                padded[:, t + 1 + k : t + 2 + k],
                hidden[k - 1, t],
                torch.tensor([[t + k]]),
                first_step=False,
                past_kv=KV.cat(cache),
            )
            kvs[k, t], hidden[k, t], logits[k][:, t] = out.kv, out.hidden, out.logits[:, 0]
    return logits


@pytest.mark.parametrize("flex", [False, True], ids=["sdpa", "flex"])
@pytest.mark.parametrize("seed", [0, 1])
def test_case_fc14_vectorized_ttt_equals_naive_recursion(seed, flex):
    """Both attention paths of the unroll: SDPA with the dense mask, flex with the block mask
    (the CUDA default; eager here)."""
    draft = ttt_draft(seed)
    ids, aux = ttt_inputs(seed)
    with torch.no_grad():
        fast = [o.logits for o in ttt_unroll(draft, ids, aux, STEPS, flex=flex)]
        slow = naive_unroll(draft, ids, aux, STEPS)
    for k in range(STEPS):
        torch.testing.assert_close(fast[k], slow[k], rtol=0, atol=1e-10, msg=f"step {k}")


def test_flex_is_the_default_only_where_it_compiles_and_trains():
    """CUDA with head_dim >= 16 (the compiled kernel's minimum); never on the CPU (no backward),
    so stories260K's head_dim 8 drafter trains with SDPA on a GPU."""
    assert flex_by_default(torch.device("cuda"), 128) and flex_by_default(torch.device("cuda"), 16)
    assert not flex_by_default(torch.device("cuda"), 8)
    assert not flex_by_default(torch.device("cpu"), 128)


def test_case_fc14_causal_mask_at_later_steps_is_caught(monkeypatch):
    """A wrong mask (causal over every earlier step's keys) must fail the same comparison."""
    import specdraft.train.loss as loss

    def all_causal(seq_len, step, device="cpu"):
        causal = torch.ones(seq_len, seq_len, dtype=torch.bool, device=device).tril()
        return torch.cat([causal] * (step + 1), dim=1)[None, None]

    draft = ttt_draft(0)
    ids, aux = ttt_inputs(0)
    monkeypatch.setattr(loss, "ttt_attention_mask", all_causal)
    with torch.no_grad():
        fast = [o.logits for o in ttt_unroll(draft, ids, aux, STEPS)]
        slow = naive_unroll(draft, ids, aux, STEPS)
    torch.testing.assert_close(fast[0], slow[0], rtol=0, atol=1e-10)  # step 0 is causal anyway
    assert (fast[1] - slow[1]).abs().max() > 1e-3


def test_case_fc07_loss_runs_on_exactly_the_supervised_positions():
    """Two-turn chat: prompt 0..3, answer 4..6, prompt 7..9, answer 10..12 (loss_mask = answers)."""
    draft = ttt_draft(0)
    t_len = 13
    ids, aux = ttt_inputs(3, t_len)
    loss_mask = torch.zeros(1, t_len, dtype=torch.bool)
    loss_mask[0, 4:7] = loss_mask[0, 10:13] = True
    logits = torch.randn(
        1, t_len, 48, generator=torch.Generator().manual_seed(5), dtype=torch.float64
    )
    out = ttt_loss(draft, ids, aux, logits, loss_mask, ttt_steps=STEPS)
    outputs = ttt_unroll(draft, ids, aux, STEPS)
    p = logits.softmax(-1)
    for k in range(STEPS):
        expected = [t for t in range(t_len) if t + 2 + k < t_len and loss_mask[0, t + 2 + k]]
        assert out.total[k] == len(expected)
        # the reference sum: KL(p_{t+1+k} || q) over the expected base positions only
        q_log = outputs[k].logits[0].log_softmax(-1)
        ref = sum((p[0, t + 1 + k] * (p[0, t + 1 + k].log() - q_log[t])).sum() for t in expected)
        torch.testing.assert_close(
            out.step_loss_sums[k].double(), torch.as_tensor(ref).double(), rtol=1e-5, atol=1e-6
        )
    # the first assistant token (index 4) is predicted at step 0 from base 2: input token x_3 is
    # the last prompt token and the target distribution is the target's at position 3
    first = next(t for t in range(t_len) if loss_mask[0, t + 2])
    assert first == 2 and ids[0, first + 1] == ids[0, 3]


def test_case_fc07_target_argmax_outside_draft_vocab_is_not_supervised():
    draft = ttt_draft(0, vocab=48, draft_vocab=40)  # d2t = 0: draft vocab = target ids 0..39
    ids, aux = ttt_inputs(4)
    logits = torch.zeros(1, 9, 48, dtype=torch.float64)
    logits[0, :, 45] = 5.0  # argmax outside the draft vocabulary everywhere ...
    logits[0, 4, 45], logits[0, 4, 7] = 0.0, 5.0  # ... except at target position 4
    loss_mask = torch.ones(1, 9, dtype=torch.bool)
    out = ttt_loss(draft, ids, aux, logits, loss_mask, ttt_steps=STEPS)
    # target position 4 is base t = 3 - k at step k
    assert out.total.tolist() == [1, 1, 1, 1]
