"""bench waits for a server still starting (`serve ... &` then `bench` at once: the user's trial
failed with "[Errno 111] Connection refused"), within a bound, and fails with one line naming the
URL, the wait and the fix when nothing ever listens. Also: the crossover sentence of each shape
of sweep is true and plain (the user's report said "no crossover: ... does not win ... below
concurrency 4, then wins"), and the speedup table's noise column says "steady" / "noisy"."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from specdraft.bench.config import BenchConfig
from specdraft.bench.report import markdown
from specdraft.bench.stats import SpeedupPoint, find_crossover
from specdraft.bench.sweep import run_bench
from specdraft.client import wait_for_server
from specdraft.serve.server import serve_in_thread
from tests.support.bench import report_of
from tests.support.serve_helpers import fake_vllm_app, write_prompts


def one_level(url, baseline, prompts, wait_s: float, warmup: int = 0) -> BenchConfig:
    """bench at concurrency 1 (2 prompts of 4 tokens, one run) waiting up to wait_s for servers."""
    return BenchConfig(
        url,
        baseline,
        str(prompts),
        (1,),
        max_tokens=4,
        num_prompts=2,
        warmup=warmup,
        repeats=1,
        wait_s=wait_s,
    )


def free_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class FakeClock:
    """A clock for `wait_for_server` that moves only when it sleeps: `now` / `sleep`."""

    def __init__(self) -> None:
        self.t, self.slept = 0.0, []

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.t += seconds


def test_bench_waits_for_a_server_that_starts_listening_late(tmp_path):
    port = free_port()
    started: list = []

    def start_late() -> None:
        time.sleep(1.0)
        started.append(
            serve_in_thread(
                fake_vllm_app(lambda active: 0.001, tokens_per_step=2, num_spec=3), port=port
            )
        )

    thread = threading.Thread(target=start_late, daemon=True)
    thread.start()
    said: list[str] = []
    prompts = write_prompts(tmp_path / "prompts.jsonl", ["w1 w2"])
    try:
        cfg = one_level(f"http://127.0.0.1:{port}", None, prompts, wait_s=30.0)
        report = run_bench(cfg, progress=said.append)
    finally:
        thread.join()
        for server in started:
            server.stop()
    assert report.spec.kind == "vllm" and report.spec.levels[0].num_output_tokens == 2 * 4
    waits = [line for line in said if "waiting up to 30 s" in line]
    assert len(waits) == 1 and f"127.0.0.1:{port}" in waits[0]  # told once, not once per retry


def test_a_url_nothing_listens_on_fails_within_the_wait_naming_url_wait_and_fix():
    """On a given clock (it moves only when wait_for_server sleeps): it retries through the whole
    wait and gives up within one poll after it, however slow this machine is."""
    url = f"http://127.0.0.1:{free_port()}"
    clock = FakeClock()
    with pytest.raises(RuntimeError) as info:
        wait_for_server(url, wait_s=1.0, poll_s=0.1, clock=clock.now, sleep=clock.sleep)
    elapsed = clock.t
    assert 1.0 <= elapsed < 1.1 and len(clock.slept) >= 10
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"{url}: no server answered (")
    assert "after waiting 1 s" in message and "is the server running?" in message
    assert message.endswith("or pass the right --url")


def test_run_bench_names_the_baseline_flag_when_the_baseline_never_starts(tmp_path):
    prompts = write_prompts(tmp_path / "prompts.jsonl", ["w1 w2"])
    baseline = f"http://127.0.0.1:{free_port()}"
    with serve_in_thread(
        fake_vllm_app(lambda active: 0.001, tokens_per_step=2, num_spec=3)
    ) as spec:
        cfg = one_level(spec.url, baseline, prompts, wait_s=0.5)
        with pytest.raises(
            RuntimeError, match=r"after waiting \d s; .*pass the right --baseline-url$"
        ):
            run_bench(cfg)


def test_a_dead_baseline_fails_before_the_measured_server_gets_a_request(tmp_path):
    """Both servers are checked before any measuring: a dead --baseline-url costs the wait, not the
    --url sweep first (the user's trial: a whole sweep, then 120 s, then the error)."""
    prompts = write_prompts(tmp_path / "prompts.jsonl", ["w1 w2"])
    steps: list[int] = []
    said: list[str] = []
    with serve_in_thread(fake_vllm_app(lambda active: steps.append(active) or 0.001, 2, 3)) as spec:
        cfg = one_level(spec.url, f"http://127.0.0.1:{free_port()}", prompts, wait_s=0.5, warmup=1)
        with pytest.raises(RuntimeError, match=r"pass the right --baseline-url$"):
            run_bench(cfg, progress=said.append)
    assert steps == [] and not any("concurrency" in line for line in said), said


def test_a_server_that_answers_but_not_v1_models_fails_at_once(tmp_path):
    from fastapi import FastAPI

    with serve_in_thread(FastAPI()) as server:  # 404 everywhere: no retry, whatever the wait
        clock = FakeClock()
        with pytest.raises(RuntimeError, match="no OpenAI-compatible /v1/models"):
            wait_for_server(server.url, wait_s=30.0, clock=clock.now, sleep=clock.sleep)
        assert clock.slept == []  # failed at the first try


def test_wait_s_must_not_be_negative():
    with pytest.raises(ValueError, match="wait_s must be >= 0"):
        BenchConfig("http://127.0.0.1:1", wait_s=-1.0)


# ---- the crossover sentence of each shape of sweep ---------------------------------------------
def steady(*points: tuple[int, float]) -> list[SpeedupPoint]:
    """Points with a small run-to-run deviation (0.02), as repeated runs give them."""
    return [SpeedupPoint(c, s, 0.02) for c, s in points]


BAND = "by more than 5% and its run-to-run deviation"


def test_crossover_when_speculation_wins_everywhere():
    cross = find_crossover(steady((1, 1.8), (4, 1.4), (16, 1.2)), tie_band=0.05)
    assert cross.concurrency is None
    assert cross.text == (
        f"no crossover: speculation wins {BAND} at every concurrency measured "
        "(up to 16, speedup 1.20x ± 0.02 there)"
    )


def test_crossover_when_speculation_loses_everywhere():
    cross = find_crossover(steady((1, 0.8), (4, 0.7), (16, 0.6)), tie_band=0.05)
    assert cross.concurrency is None
    assert cross.text == (
        "no crossover: speculation loses at every concurrency measured "
        "(best speedup 0.80x ± 0.02 at concurrency 1)"
    )
    ties = find_crossover(
        steady((1, 0.8), (4, 1.01)), tie_band=0.05
    )  # a loss and a tie: no win anywhere
    assert ties.text == (
        f"no crossover: speculation does not win {BAND} at any concurrency measured "
        "(best speedup 1.01x ± 0.02 at concurrency 4)"
    )


def test_crossover_when_speculation_wins_then_stops():
    cross = find_crossover(steady((1, 1.8), (4, 1.3), (16, 0.9)), tie_band=0.05)
    assert cross.concurrency == 16
    assert cross.text == (
        f"crossover: speculation stops winning {BAND} between concurrency 4 "
        "(speedup 1.30x ± 0.02) and 16 (speedup 0.90x ± 0.02)"
    )
    again = find_crossover(steady((1, 1.8), (4, 1.0), (16, 1.3)), tie_band=0.05)  # and wins again
    assert again.concurrency == 4 and again.text.endswith("; it wins again at concurrency 16")


def test_crossover_when_speculation_does_not_win_then_wins():
    """The user's report: ties at concurrency 1, wins from 4 on. Before: "no crossover: speculation
    does not win by more than 5% and its run-to-run deviation below concurrency 4, then wins"."""
    cross = find_crossover(steady((1, 1.02), (4, 1.3), (16, 1.5)), tie_band=0.05)
    assert cross.concurrency is None
    assert cross.text == (
        "speculation wins from concurrency 4 on (speedup 1.30x ± 0.02 there); below "
        f"concurrency 4 it does not win {BAND}; no crossover: it does not stop winning up "
        "to concurrency 16, the highest measured"
    )
    assert "then wins" not in cross.text


def test_the_noise_column_says_steady_noisy_or_one_run():
    points = [
        SpeedupPoint(1, 1.5, 0.02),
        SpeedupPoint(4, 1.1, 0.4, "speculative 452 ± 597 tok/s (sd/mean 1.32)"),
    ]
    text = markdown(report_of(points, repeats=3))
    assert "| concurrency | speedup (ratio of means) | sd | verdict | run-to-run noise |" in text
    assert "| 1 | 1.50x | 0.02 | wins | steady |" in text
    assert "| 4 | 1.10x | 0.40 | ties | noisy: verdict inconclusive |" in text
    one = markdown(report_of([SpeedupPoint(1, 1.5)], repeats=1))
    assert "| 1 | 1.50x | - | - | one run: no spread |" in one


def test_doctor_waits_for_its_server_as_bench_does(capsys):
    """`serve ... &` then `doctor --server` at once: doctor waits too (it used to connect once)."""
    from specdraft.doctor.online import ServerError, connect

    port = free_port()
    started: list = []
    thread = threading.Thread(
        target=lambda: (
            time.sleep(1.0),
            started.append(
                serve_in_thread(
                    fake_vllm_app(lambda active: 0.001, tokens_per_step=2, num_spec=3), port=port
                )
            ),
        ),
        daemon=True,
    )
    thread.start()
    try:
        server = connect(f"http://127.0.0.1:{port}", wait_s=30.0)
    finally:
        thread.join()
        for s in started:
            s.stop()
    assert server.kind == "vllm" and "waiting up to 30 s" in capsys.readouterr().err
    with pytest.raises(ServerError, match=r"after waiting 1 s.*--server"):
        connect(f"http://127.0.0.1:{free_port()}", wait_s=1.0)
