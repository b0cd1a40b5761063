"""`engine.batch_target`: B sequences at their own cache rows and lengths in one target forward
(per-row slots and masks), each row equal to its own batch-1 forward."""

from __future__ import annotations

import torch

from specdraft.engine.batch_target import batch_causal_mask
from specdraft.engine.fast_model import causal_mask
from tests.support.engine_helpers import one_thread, random_prompts, tiny_setup  # noqa: F401


def test_rows_keep_their_own_cache_in_one_forward():
    """FastTarget.forward with per-row cache slots [B, T] equals each row's batch-1 forward."""
    target = tiny_setup("llama").target
    seqs = random_prompts(3, 12, seed=5)
    lengths = [4, 9, 6]  # cached slots per row; then 3 new tokens each
    single = []
    for seq, n in zip(seqs, lengths):
        target.setup_cache(1, 16)
        ids = torch.tensor([seq[: n + 3]])
        out = target(ids, torch.arange(n + 3)[None], torch.arange(n + 3), causal_mask(0, n + 3, 16))
        single.append(out.logits[0, n:])
    target.setup_cache(3, 16)
    for row in (2, 1, 0):  # each row prefilled at row 0, then moved to its row
        seq, n = seqs[row], lengths[row]
        target(
            torch.tensor([seq[:n]]), torch.arange(n)[None], torch.arange(n), causal_mask(0, n, n)
        )
        target.copy_slots(0, torch.arange(n), row, 0)
    starts = torch.tensor(lengths)
    slots = starts[:, None] + torch.arange(3)
    ids = torch.tensor([seq[n : n + 3] for seq, n in zip(seqs, lengths)])
    out = target(ids, slots, slots, batch_causal_mask(starts, 3, 12))
    for row in range(3):
        torch.testing.assert_close(out.logits[row], single[row], atol=1e-5, rtol=0)
