"""`doctor --samples mt-bench|gsm8k`: a bundled suite's first turns as prompts for the live
server's acceptance and render parity; the offline checks skip (no target outputs to replay)."""

from __future__ import annotations

import pytest

from specdraft.doctor import run_doctor
from specdraft.engine.spec_config import SpecConfig
from specdraft.serve.server import build_app, serve_in_thread
from tests.support.doctor_helpers import served_world
from tests.support.engine_helpers import one_thread  # noqa: F401 (fixture)
from tests.support.serve_helpers import word_tokenizer


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return served_world(tmp_path_factory.mktemp("suite"), word_tokenizer())


def test_samples_suite_name_prompts_the_server_and_skips_offline(world):
    draft, target, _ = world
    server = serve_in_thread(
        build_app(str(target), str(draft), SpecConfig(3, 1, 4), max_seq_len=256)
    )
    try:
        report = run_doctor(
            draft, target=target, samples="gsm8k", server=server.url, max_samples=4, max_length=96
        )
    finally:
        server.stop()
    online = report.finding("online_acceptance")
    assert online.verdict != "skip" and "online p_k [" in online.evidence, online
    offline = report.finding("offline_acceptance_matches_training")
    assert offline.verdict == "skip" and "--samples gsm8k holds prompts only" in str(offline), (
        offline
    )
    with pytest.raises(ValueError, match="a suite \\(gsm8k, humaneval, mt-bench\\)"):
        run_doctor(draft, target=target, samples="no-such-suite")


def test_the_readme_and_the_help_name_the_suites_doctor_takes_as_samples():
    """One truth: doctor's error for a missing --samples offers the suites, so the README's
    sentence on `doctor --samples` and the --server help name them too (the README said doctor
    takes no prompts alone)."""
    from pathlib import Path

    from typer.testing import CliRunner

    from specdraft.bench.suites import suite_names
    from specdraft.cli import app

    readme = " ".join((Path(__file__).parents[3] / "README.md").read_text().split())
    said = readme[readme.index("`doctor --samples` takes") :][:400]
    server_help = " ".join(
        CliRunner()
        .invoke(app, ["doctor", "--help"], env={"COLUMNS": "200", "NO_COLOR": "1"})
        .output.split()
    )
    server_help = server_help[server_help.index("--server <str>") :][:300]
    for name in suite_names():
        assert f"`{name}`" in said, said
    assert "or a suite's prompts" in server_help, server_help
