"""specdraft.engine.eagle: FastDraft computes what Eagle3Draft computes (logits, hidden
state, the K/V it writes into the cache), for a first step over several positions after a
cached past and for a tree step of two frontier rows under a scratch mask; float64, float32 and
bfloat16 (to each dtype's rounding); for every combination of the norm flags (`NORM_FLAGS`);
with yarn's cos/sin factor (GPT-OSS's rope)."""

from __future__ import annotations

import pytest
import torch

from specdraft.draft import KV
from specdraft.draft_config import DraftConfig
from specdraft.engine.eagle import DraftCache, FastDraft
from tests.support.drafts import FLAG_COMBINATIONS, flag_id, seeded_draft, tiny_draft
from tests.support.tiny_models import GPT_OSS_ROPE, tiny_config

PAST, T = 5, 3
TOL = {torch.float64: 1e-12, torch.float32: 1e-5, torch.bfloat16: 2e-2}


def _setup(dtype: torch.dtype, flags: dict[str, bool]):
    """A seeded drafter (GQA: 4 heads, 2 KV heads) with the norm `flags`, its FastDraft, a cache
    holding PAST first-step entries, and PAST + T ids / aux states."""
    model = tiny_draft(dtype=dtype, **flags).eval()
    cfg = model.cfg
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, cfg.vocab_size, (PAST + T,), generator=gen)
    aux = torch.randn(PAST + T, cfg.n_aux * cfg.target_hidden_size, generator=gen).to(dtype)
    cache = DraftCache(cfg.num_key_value_heads, cfg.head_dim, 16, dtype, "cpu")
    head = model(ids[None, :PAST], aux[None, :PAST], torch.arange(PAST)[None], first_step=True)
    cache.append(head.kv)
    return model, FastDraft(model), cache, ids, aux


def _assert_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    torch.testing.assert_close(actual, expected, rtol=TOL[dtype], atol=TOL[dtype])


FLAGS = pytest.mark.parametrize("flags", FLAG_COMBINATIONS, ids=flag_id)


@FLAGS
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@torch.no_grad()
def test_first_step_after_a_cached_past_matches_the_drafter(dtype, flags):
    model, fast, cache, ids, aux = _setup(dtype, flags)
    positions = torch.arange(PAST, PAST + T)
    ref = model(
        ids[None, PAST:],
        aux[None, PAST:],
        positions[None],
        first_step=True,
        past_kv=cache.view(PAST),
    )
    logits, hidden = fast(ids[PAST:], aux[PAST:], positions, True, cache, PAST)
    _assert_close(logits, ref.logits[0], dtype)
    _assert_close(hidden, ref.hidden[0], dtype)
    written = cache.view(PAST + T)
    _assert_close(written.k[:, :, PAST:], ref.kv.k, dtype)
    _assert_close(written.v[:, :, PAST:], ref.kv.v, dtype)
    assert cache.length == PAST  # written, not committed


@FLAGS
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@torch.no_grad()
def test_tree_step_under_a_scratch_mask_matches_the_drafter(dtype, flags):
    """Two frontier rows after two scratch entries: row i sees the committed entries, scratch
    entry i (its parent) and itself."""
    model, fast, cache, ids, _ = _setup(dtype, flags)
    cfg = model.cfg
    gen = torch.Generator().manual_seed(1)
    scratch = KV(
        *(
            torch.randn(1, cfg.num_key_value_heads, 2, cfg.head_dim, generator=gen).to(dtype)
            for _ in range(2)
        )
    )
    cache.write(scratch, PAST)
    hidden_in = torch.randn(2, cfg.hidden_size, generator=gen).to(dtype)
    eye = torch.eye(2, dtype=torch.bool)
    mask = torch.cat([torch.ones(2, PAST, dtype=torch.bool), eye, eye], dim=1)  # [2, PAST + 2 + 2]
    positions = torch.full((2,), PAST + 1)
    ref = model(
        ids[None, :2],
        hidden_in[None],
        positions[None],
        first_step=False,
        attn_mask=mask[None, None],
        past_kv=cache.view(PAST + 2),
    )
    logits, hidden = fast(ids[:2], hidden_in, positions, False, cache, PAST + 2, mask)
    _assert_close(logits, ref.logits[0], dtype)
    _assert_close(hidden, ref.hidden[0], dtype)
    _assert_close(cache.view(PAST + 4).k[:, :, PAST + 2 :], ref.kv.k, dtype)


def test_graph_keys_cover_every_step_a_setting_runs_after_its_first_round():
    from specdraft.engine.draft_round import draft_graph_keys
    from specdraft.engine.kernels import fused_decode

    first = [
        (t, True, False) for t in range(1, 5)
    ]  # a verify accepts 0..3 drafts, plus the bonus token
    assert draft_graph_keys(3, 1) == first + [(1, False, False)]  # chain steps: one row, no mask
    assert draft_graph_keys(3, 4) == first + [
        (4, False, True)
    ]  # tree steps: topk rows under a mask
    assert draft_graph_keys(1, 1) == [(1, True, False), (2, True, False)]  # no later steps
    assert draft_graph_keys(70, 1)[-2] == (
        fused_decode.MAX_TOKENS,
        True,
        False,
    )  # at most MAX_TOKENS positions


@torch.no_grad()
def test_engine_fast_draft_applies_the_yarn_factor():
    """FastDraft (the engine's drafter) folds yarn's factor into its q|k weights: the same logits
    and K as the drafter (without it, q·k would be off by the factor squared)."""
    target = tiny_config(
        "llama", num_layers=4, rope_parameters=GPT_OSS_ROPE, max_position_embeddings=131072
    )
    model = seeded_draft(DraftConfig.from_target(target, (1, 2, 3), 64), 0).eval()
    cfg = model.cfg
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, cfg.vocab_size, (4,), generator=gen)
    aux = torch.randn(4, cfg.n_aux * cfg.target_hidden_size, generator=gen)
    ref = model(ids[None], aux[None], torch.arange(4)[None], first_step=True)
    cache = DraftCache(cfg.num_key_value_heads, cfg.head_dim, 8, torch.float32, "cpu")
    logits, _ = FastDraft(model)(ids, aux, torch.arange(4), True, cache, 0)
    torch.testing.assert_close(logits, ref.logits[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(cache.view(4).k, ref.kv.k, rtol=1e-5, atol=1e-5)
