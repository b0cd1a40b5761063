"""The real-engine tiers' install step (.ci/tier_common.sh): a failing install is retried, and one
that fails every attempt fails CI with its reason instead of passing as "skipped"."""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run_tier_shell(script: str, tmp_path: Path) -> subprocess.CompletedProcess:
    """Run `script` in bash after sourcing tier_common.sh as a tier script does."""
    prelude = (
        f"set -euo pipefail; tier=demo; log={tmp_path / 'install.log'}; start=$(date +%s); "
        f"source {REPO / '.ci' / 'tier_common.sh'}; "
    )
    env = {"PATH": "/usr/bin:/bin", "SPECDRAFT_TIER_RETRY_WAIT": "0"}
    return subprocess.run(
        ["bash", "-c", prelude + script], capture_output=True, text=True, env=env, timeout=60
    )


def test_an_install_that_fails_twice_is_retried_until_it_succeeds(tmp_path):
    count = tmp_path / "count"
    flaky = f"echo x >> {count}; [ $(wc -l < {count}) -ge 3 ]"
    result = run_tier_shell(f"tier_retry bash -c '{flaky}' && echo installed", tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("install attempt") == 2 and "installed" in result.stdout
    assert count.read_text().count("x") == 3


def test_an_install_that_always_fails_fails_the_tier_with_its_reason(tmp_path):
    script = 'tier_retry false || tier_fail "pkg could not be installed"; echo "not reached"'
    result = run_tier_shell(script, tmp_path)
    assert result.returncode == 1
    assert result.stdout.count("install attempt") == 2 and "not reached" not in result.stdout
    assert (
        "demo tier: FAILED after" in result.stderr and "pkg could not be installed" in result.stderr
    )
    assert "skipped" not in result.stdout + result.stderr


def test_no_tier_script_turns_an_install_failure_into_a_pass():
    for name in ("vllm_tier.sh", "speculators_tier.sh", "sglang_tier.sh", "tier_common.sh"):
        assert "tier_skip" not in (REPO / ".ci" / name).read_text(), name
