"""The SGLang tier: SGLang's own loader, draft forward and target capture, in-process on the CPU,
against specdraft's exports (the venv of one pinned SGLang version: .ci/sglang_tier.sh).

Collected only under a Python where the `sglang` package is installed; anywhere else, the core
suite included, pytest does not collect these modules (and sglang is never imported). The
stand-ins and SGLANG_USE_CPU_ENGINE go in before the first sglang import (`engine.prepare`).
"""

from __future__ import annotations

import importlib.util
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

collect_ignore_glob = [] if importlib.util.find_spec("sglang") else ["test_*.py"]

if not collect_ignore_glob:
    from tests.sglang_tier import engine

    engine.prepare()
