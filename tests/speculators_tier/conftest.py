"""The speculators tier: the speculators library (0.9.0) in-process against specdraft's files.

Collected only under a Python where `speculators` imports (the venv .ci/speculators_tier.sh
builds); anywhere else, the core suite included, pytest does not collect these modules.
"""

from __future__ import annotations

import importlib
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _speculators_missing() -> bool:
    try:
        importlib.import_module("speculators")
    except Exception:  # noqa: BLE001 - ImportError, or an install missing one of its imports
        return True
    return False


collect_ignore_glob = ["test_*.py"] if _speculators_missing() else []
