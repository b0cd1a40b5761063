"""Running a benchmark script's --tiny mode in a subprocess and reading its JSON result."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


TIMEOUT_S = 300  # a loaded 2-core machine; each takes seconds when idle


def run_smoke(script: str, args: list[str]) -> subprocess.CompletedProcess:
    """`python benchmarks/<script> <args>` from the repository root, importing this checkout."""
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    )
    return subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), *args],
        check=False,
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )


def last_json_line(stdout: str) -> dict:
    """The last stdout line that parses as a JSON object."""
    for line in reversed(stdout.splitlines()):
        try:
            value = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict):
            return value
    raise AssertionError(f"no JSON result line in:\n{stdout}")
