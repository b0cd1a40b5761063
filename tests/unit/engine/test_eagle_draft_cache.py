"""specdraft.engine.eagle.DraftCache: append, views without copies, scratch writes, rollback, bounds."""

from __future__ import annotations

import pytest
import torch

from specdraft.draft import KV
from specdraft.engine.eagle import DraftCache


def _kv(length: int, value: float) -> KV:
    return KV(torch.full((1, 2, length, 4), value), torch.full((1, 2, length, 4), -value))


def test_append_view_rollback():
    cache = DraftCache(2, 4, 10, torch.float32, "cpu")
    cache.append(_kv(3, 1.0))
    cache.append(_kv(2, 2.0))
    assert cache.length == 5
    view = cache.view(5)
    assert view.k.shape == (1, 2, 5, 4) and view.k.data_ptr() == cache.k.data_ptr()
    assert view.k[0, 0, :, 0].tolist() == [1, 1, 1, 2, 2] and view.v[0, 0, 4, 0] == -2
    cache.write(_kv(2, 7.0), cache.length)  # scratch past the committed entries
    assert cache.length == 5 and cache.view(7).k[0, 0, 5:, 0].tolist() == [7, 7]
    cache.rollback(3)
    cache.append(_kv(1, 4.0))
    assert cache.length == 4 and cache.view(4).k[0, 0, :, 0].tolist() == [1, 1, 1, 4]


def test_bounds_are_errors():
    cache = DraftCache(2, 4, 4, torch.float32, "cpu")
    cache.append(_kv(3, 1.0))
    with pytest.raises(ValueError, match="exceeds its size 4"):
        cache.append(_kv(2, 1.0))
    with pytest.raises(ValueError, match="exceeds its size 4"):
        cache.view(5)
    with pytest.raises(ValueError, match=r"must be in 0\.\.3"):
        cache.rollback(4)
    with pytest.raises(ValueError, match="commit of 2 entries at 3 exceeds its size 4"):
        cache.commit(2)


def test_commit_keeps_entries_written_past_the_committed_ones():
    """A first draft step writes its K/V in place (FastDraft), then commits them."""
    cache = DraftCache(2, 4, 10, torch.float32, "cpu")
    cache.append(_kv(2, 1.0))
    cache.write(_kv(3, 5.0), cache.length)
    cache.commit(3)
    assert cache.length == 5 and cache.view(5).k[0, 0, :, 0].tolist() == [1, 1, 5, 5, 5]
