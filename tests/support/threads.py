"""The one-thread fixture of the tests that run tiny models in this process."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def one_thread():
    """Run a test on one torch intra-op thread, restoring the count after it: tiny models gain
    nothing from more, and on a shared 2-core machine OpenMP spinning makes runs 10-20x slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
