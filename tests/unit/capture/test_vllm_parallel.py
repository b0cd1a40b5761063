"""Data-parallel capture (`capture.vllm_parallel`) without vLLM: FakeVllmCapture in each rank's
spawned process; the store written over 2 ranks against the one written in this process."""

from __future__ import annotations

import io
import json
import sys
import types

import pytest
import torch
from rich.console import Console

from specdraft.capture.store import INDEX, CaptureError, StoreSettings
from specdraft.capture.vllm import HeadTarget
from specdraft.capture.vllm_parallel import DataParallelCapture, assign, rank_environments
from specdraft.capture.write import ShardJob, in_process, write_store
from specdraft.data.render import Sample
from tests.support.fake_vllm import FakeVllmCapture

SETTINGS = StoreSettings((1, 2, 3), torch.float32, max_length=32, shard_tokens=40)
TWO_RANKS = [{}, {}]


def make_samples() -> list[Sample]:
    g = torch.Generator().manual_seed(0)
    sizes = torch.randint(5, 20, (24,), generator=g).tolist()
    return [
        Sample(torch.randint(1, 85, (n,), generator=g).tolist(), [0, 0] + [1] * (n - 2))
        for n in sizes
    ]


def shard_files(path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.glob("shard-*.safetensors"))}


@pytest.fixture(scope="module")
def world(chat_target_dir, tmp_path_factory):
    """(head, samples, root, the store written here by one engine)."""
    head, samples = HeadTarget(chat_target_dir), make_samples()
    root = tmp_path_factory.mktemp("dp")
    engine = FakeVllmCapture(head.hidden_size)
    write_store(head, samples, root / "one", SETTINGS, run_shards=in_process(engine.capture_shard))
    return head, samples, root, root / "one"


def capture_dp(world, out: str, engine, console=None):
    head, samples, root, _ = world
    return write_store(
        head,
        samples,
        root / out,
        SETTINGS,
        console=console,
        run_shards=DataParallelCapture(engine, TWO_RANKS).run,
    )


def test_shards_are_dealt_round_robin_over_the_ranks():
    jobs = [ShardJob(s, 0, []) for s in (0, 2, 3, 5, 6, 7, 9)]  # a resume: shards 1, 4, 8 kept
    ranks = assign(jobs, 3)
    assert [[j.shard for j in mine] for mine in ranks] == [[0, 5, 9], [2, 6], [3, 7]]
    assert assign(jobs[:1], 3)[1:] == [[], []]


def test_a_failing_rank_stops_the_capture_in_one_line_and_a_rerun_finishes_the_store(world):
    """Rank 1 fails on its second shard: its reason in one line, rank 0 stopped, the shards
    reported so far listed. The same command then captures only the missing shards, over both
    ranks (the progress bar counts their tokens), into the store one engine writes: same shard
    files byte for byte, same index.json (written here alone)."""
    head, samples, root, one = world
    index = json.loads((one / INDEX).read_text())
    assert index["num_shards"] >= 5
    second_of_rank_1 = index["shards"][3]["first_sample"]  # shards 1, 3, ... go to rank 1
    failing = FakeVllmCapture(head.hidden_size, fail_on=samples[second_of_rank_1].input_ids)
    with pytest.raises(CaptureError) as err:
        capture_dp(world, "two", failing)
    assert str(err.value) == (
        "data-parallel rank 1 of 2: vLLM ran out of KV-cache blocks (engine core stopped)"
    )
    kept = json.loads((root / "two" / INDEX).read_text())
    assert 1 in [e["shard"] for e in kept["shards"]] and 3 not in [
        e["shard"] for e in kept["shards"]
    ]
    assert not kept["complete"] and len(shard_files(root / "two")) >= len(kept["shards"])

    buf = io.StringIO()
    result = capture_dp(
        world, "two", FakeVllmCapture(head.hidden_size), Console(file=buf, width=200)
    )
    assert result.num_reused == len(kept["shards"])
    missing = sum(e["num_tokens"] for e in index["shards"]) - sum(
        e["num_tokens"] for e in kept["shards"]
    )
    assert f"{missing}/{missing} tokens" in buf.getvalue().strip().splitlines()[-1]
    assert (root / "two" / INDEX).read_bytes() == (one / INDEX).read_bytes()
    assert shard_files(root / "two") == shard_files(one)


def test_a_rank_that_dies_without_a_word_stops_the_capture(world):
    """One rank, one shard; its process exits (code 9) before reporting: one line, no hang."""
    head, samples, root, one = world
    dying = FakeVllmCapture(head.hidden_size, fail_on=samples[0].input_ids, die=True)
    with pytest.raises(
        CaptureError,
        match=r"^data-parallel rank 0 of 1: its process exited with code 9, 1 of its "
        r"shards not captured \(killed\? out of memory\?\); re-run the same command",
    ):
        DataParallelCapture(dying, [{}]).run(
            [ShardJob(0, 0, samples[:2])], root, SETTINGS, print, print
        )


@pytest.fixture
def platform(monkeypatch):
    """A stand-in `vllm.platforms.current_platform` (vLLM is not installed in the core suite)."""
    current = types.SimpleNamespace(cpu=False, device_control_env_var="CUDA_VISIBLE_DEVICES")
    current.is_cpu = lambda: current.cpu
    module = types.ModuleType("vllm.platforms")
    module.current_platform = current
    monkeypatch.setitem(sys.modules, "vllm", types.ModuleType("vllm"))
    monkeypatch.setitem(sys.modules, "vllm.platforms", module)
    return current


def test_each_rank_gets_its_own_gpus(platform, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3,4,5,6,7")
    assert rank_environments(2, 4) == [
        {"CUDA_VISIBLE_DEVICES": "0,1,2,3"},
        {"CUDA_VISIBLE_DEVICES": "4,5,6,7"},
    ]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5,6")
    with pytest.raises(
        CaptureError,
        match=r"^--data-parallel-size 2 x --tensor-parallel-size 2 needs 4 "
        r"devices; 3 are visible \(CUDA_VISIBLE_DEVICES='3,5,6'\)$",
    ):
        rank_environments(2, 2)


def test_each_rank_gets_its_own_cpu_cores_on_vllms_cpu_build(platform, monkeypatch):
    platform.cpu = True
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {8, 9, 10, 11, 12, 13, 14, 15})
    assert rank_environments(2, 2) == [
        {"OMP_NUM_THREADS": "4", "VLLM_CPU_OMP_THREADS_BIND": "8,9|10,11"},
        {"OMP_NUM_THREADS": "4", "VLLM_CPU_OMP_THREADS_BIND": "12,13|14,15"},
    ]
    with pytest.raises(
        CaptureError, match="needs 16 CPU cores for vLLM's CPU build; this process may use 8"
    ):
        rank_environments(4, 4)
