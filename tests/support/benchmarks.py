"""Running a benchmark script's --tiny mode in a subprocess and reading its JSON result; importing
a benchmark script as a module (`load_benchmark`)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

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


def load_benchmark(name: str) -> ModuleType:
    """benchmarks/<name>.py imported as the module `name`, its helpers importable beside it as
    when it runs as a script."""
    script = ROOT / "benchmarks" / f"{name}.py"
    sys.path.insert(0, str(script.parent))
    spec = importlib.util.spec_from_file_location(name, script)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module
