"""specdraft.serve.batch_worker: a continuously batching server on loopback (real uvicorn) with
the tiny seeded Llama in fp32. Concurrent streamed and unstreamed requests run in batches and
each equals its single-request greedy output; a client that disconnects mid-stream is aborted
while the others finish; logprobs requests go through the batch-1 path alone; /metrics has the
per-batch-size series; many requests leave the caches and the live tensors as they were; the
batch size defaults from memory and a schedule file short of it is refused naming the file."""

from __future__ import annotations

import asyncio
import gc
import json
import socket
import warnings

import httpx
import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from specdraft.cli import app
from specdraft.engine.schedule import BatchSchedule, ScheduleError
from specdraft.engine.spec_config import SpecConfig
from specdraft.serve.batch_worker import (
    BatchWorker,
    batch_settings,
    default_max_num_seqs,
    kv_bytes_per_sequence,
)
from tests.support.engine_helpers import one_thread, tiny_setup  # noqa: F401
from tests.support.serve_helpers import (
    engine,
    greedy_text,
    open_stream,
    own_target,
    running,
    saved_pair,
    slow_target,
    text_prompts,
    word_tokenizer,
)

NUM_NEW = 12
SLACK = 8  # tensors the worker thread may still hold when the clients have their answers


def spec_engine(target=None, max_seq_len: int = 128):
    """A speculative engine (briefly trained drafter, 3-step chain) on a private tiny target."""
    setup = tiny_setup("llama")
    tok = word_tokenizer()
    return engine(target or own_target(setup), setup.trained, SpecConfig.chain(3), tok, max_seq_len)


async def one(aclient: httpx.AsyncClient, prompt: str, stream: bool, **extra) -> dict:
    """A completion's text (streamed or not) and, unstreamed, its body."""
    body = {"prompt": prompt, "temperature": 0, "max_tokens": NUM_NEW, **extra}
    if not stream:
        answer = (await aclient.post("/v1/completions", json=body)).json()
        return {"text": answer["choices"][0]["text"], "body": answer}
    async with aclient.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
        texts = [
            json.loads(line[6:])["choices"][0]["text"]
            async for line in r.aiter_lines()
            if line.startswith("data: {")
        ]
    return {"text": "".join(texts)}


def concurrently(url: str, requests: list[tuple[str, bool, dict]]) -> list[dict]:
    """Every (prompt, stream, extra fields) request sent at once: their answers in order."""

    async def main() -> list[dict]:
        async with httpx.AsyncClient(base_url=url, timeout=60) as aclient:
            return await asyncio.gather(*(one(aclient, p, s, **e) for p, s, e in requests))

    return asyncio.run(main())


def samples(url: str) -> dict[tuple[str, tuple], float]:
    """/metrics as {(sample name, sorted labels): value}."""
    text = httpx.get(url + "/metrics").text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def by_batch_size(metrics: dict, name: str) -> dict[int, float]:
    """A per-batch-size series: {batch size: value}."""
    return {int(dict(labels)["batch_size"]): v for (n, labels), v in metrics.items() if n == name}


def test_concurrent_requests_run_in_batches_each_equal_to_its_greedy_output():
    tok = word_tokenizer()
    prompts = text_prompts(8, 6, seed=11)
    eng = spec_engine(slow_target(tiny_setup("llama").target, 0.002))
    with running(eng, tok, batching=(4, None)) as srv:
        answers = concurrently(srv.url, [(p, i % 2 == 1, {}) for i, p in enumerate(prompts)])
        metrics = samples(srv.url)
    assert [a["text"] for a in answers] == [greedy_text(p) for p in prompts]
    rounds = by_batch_size(metrics, "specdraft:batch_rounds_total")
    assert max(rounds) > 1 and max(rounds) <= 4  # batched, never past max_num_seqs
    k = by_batch_size(metrics, "specdraft:batch_num_speculative_tokens")
    assert set(k.values()) == {3}
    steps = by_batch_size(metrics, "specdraft:batch_num_verify_steps_total")
    accepted = by_batch_size(metrics, "specdraft:batch_num_accepted_tokens_total")
    tau = by_batch_size(metrics, "specdraft:batch_accept_length")
    for size in rounds:
        assert tau[size] == pytest.approx(1 + accepted[size] / steps[size])
    assert sum(by_batch_size(metrics, "specdraft:batch_requests_total").values()) >= 8
    # the batch's rows are every request's verification steps (vLLM's counter counts the same)
    drafts = metrics[
        ("vllm:spec_decode_num_drafts_total", (("engine", "0"), ("model_name", "tiny")))
    ]
    assert sum(steps.values()) == drafts


def read_stream(sock: socket.socket) -> str:
    """The text of a raw SSE completion stream read to its end."""
    data = b""
    while b"data: [DONE]" not in data:
        chunk = sock.recv(4096)
        assert chunk, "the stream ended before [DONE]"
        data += chunk
    texts = []
    for line in data.split(b"\n"):
        if line.startswith(b"data: {"):
            texts.append(json.loads(line[6:])["choices"][0]["text"])
    return "".join(texts)


def test_a_client_leaving_mid_stream_is_aborted_while_the_others_finish():
    tok = word_tokenizer()
    target = slow_target(tiny_setup("llama").target, 0.005)
    forwards, forward = [], target.forward
    target.forward = lambda *args, **kwargs: forwards.append(1) or forward(*args, **kwargs)
    plain = engine(target, None, None, tok, max_seq_len=256)
    with running(plain, tok, batching=(4, None)) as srv:
        leaving = open_stream(srv.url, "w1 w2 w3", 200)  # its first chunk came: it runs
        staying = [open_stream(srv.url, p, 40, wait=False) for p in ("w4 w5", "w6 w7 w8")]
        leaving.close()
        texts = [read_stream(sock) for sock in staying]
        metrics = samples(srv.url)
    assert texts == [greedy_text(p, 40) for p in ("w4 w5", "w6 w7 w8")]
    # counted, not timed: the batch stopped the 200-token request long before its end
    assert len(forwards) < 150, f"{len(forwards)} forwards: the aborted request kept running"
    assert metrics[("specdraft:request_cancelled_total", ())] == 1
    assert metrics[("specdraft:generation_tokens_total", ())] == 80


def test_logprobs_requests_run_alone_through_the_batch_1_path():
    tok = word_tokenizer()
    prompts = text_prompts(4, 5, seed=12)
    with running(spec_engine(), tok, batching=(4, None)) as srv:
        requests = [(p, False, {"logprobs": 2} if i == 1 else {}) for i, p in enumerate(prompts)]
        answers = concurrently(srv.url, requests)
    assert [a["text"] for a in answers] == [greedy_text(p) for p in prompts]
    logprobs = answers[1]["body"]["choices"][0]["logprobs"]
    assert len(logprobs["tokens"]) == NUM_NEW and len(logprobs["top_logprobs"][0]) == 2
    assert all(lp <= 0 for lp in logprobs["token_logprobs"])


def live_tensors() -> int:
    """Tensors the interpreter holds (after a collection)."""
    gc.collect()
    with warnings.catch_warnings():  # isinstance touches torch's deprecated module attributes
        warnings.simplefilter("ignore")
        return sum(1 for obj in gc.get_objects() if isinstance(obj, torch.Tensor))


def test_many_requests_leave_caches_and_live_tensors_as_they_were():
    tok = word_tokenizer()
    eng = spec_engine()
    with running(eng, tok, batching=(3, None)) as srv:
        worker: BatchWorker = srv.server.config.app.state.server.worker
        wave = [(p, i % 2 == 0, {}) for i, p in enumerate(text_prompts(9, 5, seed=13))]
        concurrently(srv.url, wave)
        kv = eng.target.kv_stack.data_ptr()
        draft_k = worker.scheduler.draft_rows.caches[0]
        before = live_tensors()
        for _ in range(3):
            concurrently(srv.url, wave)
        after = live_tensors()
        assert eng.target.kv_stack.data_ptr() == kv  # no reallocation
        assert worker.scheduler.draft_rows.caches[0] is draft_k
        assert not worker.active and not worker.scheduler.running
    # a finished request leaves nothing: at most the last round's few references (the worker
    # thread may not have left its step when the last answer came), not some per request
    assert after <= before + SLACK, f"{after - before} tensors more after 27 requests"


def test_the_batch_size_defaults_from_memory_and_a_short_schedule_is_refused(tmp_path):
    eng = spec_engine()
    per_seq = kv_bytes_per_sequence(eng)
    args = eng.target.args
    one_layer = 2 * args.num_kv_heads * args.head_dim * eng.max_seq_len * 4  # fp32
    assert per_seq == one_layer * (args.num_layers + 1)
    assert default_max_num_seqs(eng, budget=3 * per_seq + 1) == 3
    assert default_max_num_seqs(eng, budget=10**15) == 256
    assert default_max_num_seqs(eng, budget=0) == 1
    path = tmp_path / "schedule.json"
    path.write_text('{"num_speculative_tokens_per_batch_size": [[1, 2, 3], [3, 4, 1]]}')
    num, schedule = batch_settings(eng, None, str(path))
    assert num <= 4 and schedule.num_steps(3) == 1
    with pytest.raises(ScheduleError, match="covers batch sizes 1..4, --max-num-seqs is 8") as e:
        batch_settings(eng, 8, str(path))
    assert str(e.value).startswith(str(path)) and "\n" not in str(e.value)


def test_a_schedule_turns_speculation_off_at_larger_batches():
    tok = word_tokenizer()
    prompts = text_prompts(6, 6, seed=14)
    schedule = BatchSchedule.of([[1, 1, 3], [2, 4, 0]])
    eng = spec_engine(slow_target(tiny_setup("llama").target, 0.002))
    with running(eng, tok, batching=(4, schedule)) as srv:
        answers = concurrently(srv.url, [(p, True, {}) for p in prompts])
        metrics = samples(srv.url)
    assert [a["text"] for a in answers] == [greedy_text(p) for p in prompts]
    k = by_batch_size(metrics, "specdraft:batch_num_speculative_tokens")
    assert all(v == (3 if size == 1 else 0) for size, v in k.items()) and max(k) > 1
    drafts = by_batch_size(metrics, "specdraft:batch_num_draft_tokens_total")
    assert all(drafts[size] == 0 for size in drafts if size > 1)


def serve_cli(monkeypatch, target, *options: str):
    """`specdraft serve` of a target directory (plain decoding) with options, its uvicorn
    replaced: (CliRunner's result, the apps it would have served)."""
    import specdraft.serve.server

    served = []
    monkeypatch.setattr(specdraft.serve.server, "serve", lambda app_, *a: served.append(app_))
    args = ["serve", "--target", str(target), "--no-spec", "--port", "8124", *options]
    return CliRunner().invoke(app, args, env={"COLUMNS": "400"}), served


def test_serve_batches_max_num_seqs_and_refuses_a_too_deep_schedule_in_one_line(
    monkeypatch, tmp_path
):
    target, _ = saved_pair(tiny_setup("llama"), tmp_path)
    result, served = serve_cli(monkeypatch, target, "--max-num-seqs", "3")
    assert result.exit_code == 0, result.output
    assert "sequences: batches of up to 3 (--max-num-seqs)" in result.output
    worker = served[0].state.server.worker
    assert isinstance(worker, BatchWorker) and worker.scheduler.max_num_seqs == 3
    worker.close()
    path = tmp_path / "schedule.json"
    path.write_text('{"num_speculative_tokens_per_batch_size": [[1, 4, 3]]}')
    result, served = serve_cli(monkeypatch, target, "--spec-schedule", str(path))
    assert result.exit_code != 0 and not served
    errors = [line for line in result.output.splitlines() if line.startswith("error")]
    assert len(errors) == 1 and str(path) in errors[0], result.output
    assert "exceeds the drafter's depth 0" in errors[0]
