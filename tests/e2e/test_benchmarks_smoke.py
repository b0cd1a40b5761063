"""Every benchmark's tiny mode runs: `python benchmarks/X.py --tiny` (or the arguments SMOKE_RUNS
names) exits 0 and prints its result line (a JSON object holding the key SMOKE_RUNS names). Each
runs in its own process on the CPU, in seconds (tiny models; Triton's kernels in its
interpreter); the figures are not checked: the point is that the benchmarks keep running as the
package moves under them."""

from __future__ import annotations

import importlib.util

import pytest

from tests.support.benchmarks import ROOT, last_json_line, run_smoke
from tests.support.cli import cli_options
from tests.support.paths import PYCODE

# benchmark -> (its smoke-run arguments, a key its last JSON line holds)
SMOKE_RUNS = {
    "acceptance_by_position.py": (["--tiny"], "drafters"),
    "engine_speed.py": (["--tiny"], "goal_end_to_end"),
    "triton_kernels.py": (["--tiny"], "attention_16_tokens"),
    "pycode_speed.py": (["--tiny"], "tree5x4_16"),
    "cpu_engine_overhead.py": (["--tiny"], "settings"),
    "train_throughput.py": (["--tiny"], "tokens_per_s"),
    "drafter_memory.py": (["--tiny"], "convert"),
    "capture_throughput.py": (["--tiny"], "transformers"),  # vllm: null where vLLM is not installed
    "hf_target_speed.py": (["--tiny"], "plain_over_hf_generate_median"),  # after the chain3 line
    "side_by_side.py": (["--tiny"], "specdraft"),
    "serve_memory.py": (
        ["--tiny", "--seconds", "3", "--every", "1"],
        "rss_mib",
    ),  # speculators: null where it is not installed
    "shell_target.py": (
        cli_options(check=True, shape="tiny", model=PYCODE, prompts=1, new_tokens=12),
        "max_abs_logits_diff",
    ),
    "batch_speed.py": (
        cli_options(tiny=True, model=PYCODE),
        "summary",
    ),
}
NEEDS_PYCODE = ("shell_target.py", "batch_speed.py")  # shells of pycode-25m

pytestmark = pytest.mark.benchmarks


def test_every_benchmark_has_a_smoke_run():
    """A benchmark is a script in benchmarks/ (helpers such as tiny_pair.py have no __main__)."""
    scripts = {
        p.name
        for p in (ROOT / "benchmarks").glob("*.py")
        if '__name__ == "__main__"' in p.read_text()
    }
    assert scripts == set(SMOKE_RUNS), (
        "a benchmark without a smoke run (or a stale entry): edit SMOKE_RUNS"
    )


@pytest.mark.parametrize("script", sorted(SMOKE_RUNS))
def test_tiny_mode_runs(script):
    if script == "triton_kernels.py" and importlib.util.find_spec("triton") is None:
        pytest.skip("Triton is not installed (the test extra installs it on Linux)")
    if script in NEEDS_PYCODE and not PYCODE.is_dir():
        pytest.skip(f"{PYCODE} is absent: {script} builds a shell of pycode-25m")
    args, key = SMOKE_RUNS[script]
    result = run_smoke(script, args)
    command = f"{script} {' '.join(args)}"
    assert result.returncode == 0, f"{command} exited {result.returncode}:\n{result.stderr[-4000:]}"
    line = last_json_line(result.stdout)
    assert key in line, f"{command}: no {key!r} in {line}"


@pytest.mark.skipif(
    not PYCODE.is_dir(), reason=f"{PYCODE} is absent: the shell check needs pycode-25m"
)
def test_shell_target_dflash_check_runs():
    """shell_target.py's check mode with a DFlash drafter (`--tiny-dflash`: trained in the
    process) exits 0, says it passed and reports the DFlash drafter's block logits."""
    args = cli_options(
        check=True, shape="tiny", model=PYCODE, prompts=1, new_tokens=12, tiny_dflash=True
    )
    result = run_smoke("shell_target.py", args)
    assert result.returncode == 0, f"shell_target.py {' '.join(args)}:\n{result.stderr[-4000:]}"
    line = last_json_line(result.stdout)
    assert "max_abs_block_logits_diff" in line["dflash"], line
    assert "shell check passed" in result.stdout
