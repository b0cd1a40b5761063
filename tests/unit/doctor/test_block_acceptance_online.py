"""doctor --server with a DFlash drafter (`doctor.block_acceptance.block_acceptance_online`)
against `specdraft serve` on loopback: the server running the doctored drafter passes, its
per-position acceptance equal to the drafter alone replaying its rounds; a server running another
(untrained) drafter fails, naming the gap."""

from __future__ import annotations

import pytest

from specdraft.doctor import run_doctor
from specdraft.engine.spec_config import SpecConfig
from specdraft.serve.server import build_app, serve_in_thread
from tests.support.dflash_world import served_dflash_world
from tests.support.engine_helpers import one_thread  # noqa: F401 (fixture)

SPEC = SpecConfig(num_steps=3, topk=1, num_draft_tokens=4)  # the block of 4: 3 drafts a round
CHECK = "block_acceptance_online"


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """(trained drafter, untrained drafter, target dir, samples.jsonl)."""
    root = tmp_path_factory.mktemp("dflash-online")
    trained, target, samples = served_dflash_world(root, 200)
    return trained, served_dflash_world(root, 0)[0], target, samples


def doctor_against(world, served):
    """doctor's online finding for the trained drafter against a server running `served`."""
    trained, _, target, samples = world
    server = serve_in_thread(build_app(str(target), str(served), SPEC, max_seq_len=128))
    try:
        report = run_doctor(
            trained, target=target, samples=samples, server=server.url, max_samples=8
        )
    finally:
        server.stop()
    return report.finding(CHECK)


def rows(evidence: str) -> tuple[str, str]:
    """The online and offline "p_k [...], tau ..." rows of a finding."""
    online = evidence.split("online p_k ")[1].split(";")[0]
    offline = evidence.split("offline p_k ")[1].split(";")[0]
    return online, offline


def test_the_server_running_the_drafter_passes_with_the_replays_counts(world):
    found = doctor_against(world, world[0])
    assert found.verdict == "pass", found
    online, offline = rows(found.evidence)
    assert online == offline, found.evidence  # fp32 on both sides: the same rounds, the same counts
    assert not online.startswith("[0.00"), online  # the trained drafter is accepted
    assert "(specdraft)" in found.evidence and "rounds of 3 drafts" in found.evidence


def test_a_server_running_another_drafter_fails(world):
    found = doctor_against(world, world[1])
    assert found.verdict == "fail", found
    assert "the server accepts far less than this checkpoint offline" in found.evidence
    assert "online p_1 0.0" in found.evidence
    assert "check it serves this checkpoint" in found.fix and "mask token" in found.fix
