"""Helpers for the serve / bench / tune tests: a word tokenizer for the tiny targets, slow
targets (a memory-bound target simulated by a sleep per forward), engines whose seconds are
modelled on a virtual clock, and servers on loopback."""

from __future__ import annotations

import contextlib
import copy
import json
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast
from typer.testing import CliRunner

from specdraft.checkpoint import Manifest, save_draft
from specdraft.cli import app
from specdraft.engine.fast_model import FastTarget
from specdraft.engine.requests import decode_continuation
from specdraft.engine.spec_config import SpecConfig
from specdraft.engine.speculate import SpeculativeEngine
from specdraft.serve.server import RunningServer, create_app, serve_in_thread
from tests.support.cli import cli_args
from tests.support.engine_helpers import (
    AUX_LAYERS,
    MAX_SEQ,
    VOCAB,
    TinySetup,
    greedy_sequences,
    random_prompts,
    tiny_setup,
)

CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}w3{% endif %}"
)


def word_tokenizer(eos: str | None = None) -> PreTrainedTokenizerFast:
    """Word-level tokenizer over the tiny vocabulary: "w<i>" = id i, whitespace separated."""
    backend = Tokenizer(models.WordLevel({f"w{i}": i for i in range(VOCAB)}, unk_token="w0"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token=eos
    )  # no special ids: all text
    tok.chat_template = CHAT_TEMPLATE
    return tok


def saved_pair(setup: TinySetup, out: Path, trained: bool = True) -> tuple[Path, Path]:
    """(target dir, draft dir) under `out`, as the CLI loads them: the setup's target with the word
    tokenizer, and its trained (or untrained) drafter with a manifest for AUX_LAYERS."""
    target = out / "target"
    shutil.copytree(setup.target_dir, target)
    word_tokenizer().save_pretrained(target)
    draft = setup.trained if trained else setup.untrained
    args = setup.target.args
    manifest = Manifest(
        draft=draft.cfg.to_dict(),
        aux_layers=list(AUX_LAYERS),
        target={"hidden_size": args.hidden_size, "num_layers": args.num_layers},
    )
    return target, save_draft(draft, out / "draft", manifest=manifest)


def text_prompts(num: int, length: int, seed: int) -> list[str]:
    """Random prompts as text ("w12 w5 ...")."""
    return [" ".join(f"w{t}" for t in ids) for ids in random_prompts(num, length, seed)]


def write_prompts(path: Path, prompts: list[str]) -> Path:
    """A bench / tune prompt file (JSONL rows {"prompt": ...})."""
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    return path


def slow_target(target: FastTarget, seconds: float) -> FastTarget:
    """A copy of `target` whose every forward also sleeps `seconds` (a big memory-bound target
    on a GPU: a forward costs about the same for 1 or 16 tokens). Sleeping uses no CPU."""
    slow = copy.deepcopy(target)
    forward = slow.forward

    def sleepy_forward(*args, **kwargs):
        time.sleep(seconds)
        return forward(*args, **kwargs)

    slow.forward = sleepy_forward
    return slow


class VirtualClock:
    """Seconds that pass only when `advance` is called (thread-safe): a clock for bench runs whose
    servers' costs are modelled (`modelled_engine`), not timed."""

    def __init__(self) -> None:
        self.t, self.lock = 0.0, threading.Lock()

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        with self.lock:
            self.t += seconds


def modelled_engine(
    eng: SpeculativeEngine, clock: VirtualClock, verify_s: float, draft_s: float
) -> SpeculativeEngine:
    """`eng` whose `generate` advances `clock` as a modelled engine would take: `verify_s` for the
    prefill, then per verification step `verify_s` plus `draft_s` per draft step (none without a
    drafter). The tokens are the engine's own; only the seconds are given."""
    real, steps = eng.generate, eng.spec.num_steps if eng.spec else 0

    def generate(*args, on_tokens=None, **kwargs):
        args = list(args)
        callback = args.pop(8) if len(args) > 8 else on_tokens
        calls = []

        def timed(ids: list[int]) -> None:
            clock.advance(verify_s + (steps * draft_s if calls else 0.0))
            calls.append(len(ids))
            if callback is not None:
                callback(ids)

        return real(*args, on_tokens=timed, **kwargs)

    eng.generate = generate
    return eng


def engine(
    target: FastTarget,
    draft=None,
    spec: SpecConfig | None = None,
    tokenizer=None,
    max_seq_len: int = MAX_SEQ,
) -> SpeculativeEngine:
    """A SpeculativeEngine on the CPU (plain decoding without draft / spec)."""
    return SpeculativeEngine(target, draft, spec, None, max_seq_len, "cpu", tokenizer)


@contextlib.contextmanager
def running(
    eng: SpeculativeEngine, tokenizer, name: str = "tiny", end_ids: tuple[int, ...] = (), **kwargs
) -> Iterator[RunningServer]:
    """A specdraft server for `eng` on a free loopback port (ending generations at `end_ids`)."""
    server = serve_in_thread(create_app(eng, tokenizer, name, end_ids=end_ids, **kwargs))
    try:
        yield server
    finally:
        server.stop()


@contextlib.contextmanager
def spec_server(**kwargs) -> Iterator[RunningServer]:
    """A speculative specdraft server of the tiny Llama (its briefly trained drafter, a 3-step
    chain, the word tokenizer); kwargs go to `running`."""
    setup = tiny_setup("llama")
    tok = word_tokenizer()
    eng = engine(own_target(setup), setup.trained, SpecConfig.chain(3), tok)
    with running(eng, tok, **kwargs) as server:
        yield server


def own_target(setup) -> FastTarget:
    """A private copy of the shared tiny target (two engines used at once must not share caches)."""
    return copy.deepcopy(setup.target)


def bench_args(url, out, **options) -> list[str]:
    """`specdraft bench --url URL ... --out OUT`: concurrency 1, 4 tokens, 2 prompts, 1 repeat
    unless `options` (cli_args names) say otherwise."""
    given = {"concurrency": "1", "max_tokens": "4", "num_prompts": "2", "repeats": "1", **options}
    return cli_args("bench", url=url, **given, out=out)


def invoke_bench(url, out, **options):
    """CliRunner's result of `specdraft bench` run in-process with `bench_args(url, out,
    **options)`."""
    return CliRunner().invoke(app, bench_args(url, out, **options))


def fake_vllm_app(step_s, tokens_per_step: int, num_spec: int):
    """A vLLM-like batched server for bench tests: every in-flight request emits
    `tokens_per_step` tokens per step of `step_s(active requests)` seconds (asyncio.sleep), and
    /metrics exposes vLLM's spec-decode counters (each step: 1 draft of `num_spec` tokens, the
    step's tokens - 1 accepted at the first positions); num_spec 0 = no speculation."""
    import asyncio

    from fastapi import FastAPI
    from starlette.responses import JSONResponse, PlainTextResponse, StreamingResponse

    state = {"active": 0, "drafts": 0, "draft_tokens": 0, "accepted": 0, "per_pos": [0] * num_spec}
    app = FastAPI()
    labels = 'engine="0",model_name="fake"'

    async def models(request):
        return JSONResponse({"object": "list", "data": [{"id": "fake", "object": "model"}]})

    async def metrics(request):
        lines = [
            "# TYPE vllm:num_requests_running gauge",
            f"vllm:num_requests_running{{{labels}}} {state['active']}",
        ]
        if num_spec:
            for name, key in (
                ("num_drafts", "drafts"),
                ("num_draft_tokens", "draft_tokens"),
                ("num_accepted_tokens", "accepted"),
            ):
                lines += [
                    f"# TYPE vllm:spec_decode_{name} counter",
                    f"vllm:spec_decode_{name}_total{{{labels}}} {float(state[key])}",
                    f"vllm:spec_decode_{name}_created{{{labels}}} 1.7e9",
                ]
            lines.append("# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter")
            lines += [
                f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{labels},position="{k}"}} {float(v)}'
                for k, v in enumerate(state["per_pos"])
            ]
        return PlainTextResponse("\n".join(lines) + "\n")

    async def completions(request):
        body = await request.json()

        async def chunks():
            state["active"] += 1
            try:
                done = 0
                while done < body["max_tokens"]:
                    await asyncio.sleep(step_s(state["active"]))
                    n = min(tokens_per_step, body["max_tokens"] - done)
                    done += n
                    if num_spec:
                        state["drafts"] += 1
                        state["draft_tokens"] += num_spec
                        state["accepted"] += n - 1
                        for k in range(n - 1):
                            state["per_pos"][k] += 1
                    yield (
                        "data: "
                        + json.dumps(
                            {"choices": [{"index": 0, "text": " x" * n, "finish_reason": None}]}
                        )
                        + "\n\n"
                    )
                usage = {"prompt_tokens": 4, "completion_tokens": done, "total_tokens": 4 + done}
                yield (
                    "data: " + json.dumps({"choices": [], "usage": usage}) + "\n\ndata: [DONE]\n\n"
                )
            finally:
                state["active"] -= 1

        return StreamingResponse(chunks(), media_type="text/event-stream")

    app.add_route("/v1/models", models, methods=["GET"])
    app.add_route("/metrics", metrics, methods=["GET"])
    app.add_route("/v1/completions", completions, methods=["POST"])
    return app


def fake_sglang_app(tokens_per_verify: int):
    """An SGLang-like server: native streaming /generate with cumulative text and meta_info
    (completion_tokens, spec_verify_ct = completion_tokens / tokens_per_verify), no /metrics."""
    from fastapi import FastAPI
    from starlette.responses import JSONResponse, StreamingResponse

    app = FastAPI()

    async def models(request):
        return JSONResponse({"object": "list", "data": [{"id": "fake-sglang", "object": "model"}]})

    async def model_info(request):
        return JSONResponse({"model_path": "fake-sglang"})

    async def generate(request):
        body = await request.json()
        total = body["sampling_params"]["max_new_tokens"]

        async def chunks():
            for done in range(tokens_per_verify, total + 1, tokens_per_verify):
                meta = {
                    "prompt_tokens": 4,
                    "completion_tokens": done,
                    "spec_verify_ct": done // tokens_per_verify,
                }
                yield "data: " + json.dumps({"text": " x" * done, "meta_info": meta}) + "\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(chunks(), media_type="text/event-stream")

    app.add_route("/v1/models", models, methods=["GET"])
    app.add_route("/get_model_info", model_info, methods=["GET"])
    app.add_route("/generate", generate, methods=["POST"])
    return app


@contextlib.contextmanager
def spec_and_plain_servers() -> Iterator[tuple[RunningServer, RunningServer]]:
    """A speculative specdraft server (trained drafter, 3-step chain) and a plain one, running."""
    tok = word_tokenizer()
    with (
        spec_server() as spec,
        running(engine(own_target(tiny_setup("llama")), None, None, tok), tok) as plain,
    ):
        yield spec, plain


@pytest.fixture(scope="module")
def servers():
    """`spec_and_plain_servers` for the module."""
    with spec_and_plain_servers() as pair:
        yield pair


NUM_NEW = 12


def greedy_text(prompt: str, num_new: int = NUM_NEW, ids: list[int] | None = None) -> str:
    tok = word_tokenizer()
    ids = ids or tok(prompt)["input_ids"]
    out = greedy_sequences(tiny_setup("llama").target, [ids], num_new)[0, len(ids) :].tolist()
    return decode_continuation(tok, ids, out)  # as the server decodes: "w1 w2" continues " w40 ..."


def open_stream(url: str, prompt: str, max_tokens: int, wait: bool = True) -> socket.socket:
    """A raw streaming greedy completion request; returns the socket once its first SSE chunk
    arrived (that chunk read), or at once unless `wait`."""
    host, port = url.removeprefix("http://").split(":")
    body = json.dumps(
        {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True}
    ).encode()
    sock = socket.create_connection((host, int(port)), timeout=30)
    sock.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    data = b""
    while wait and b"data: " not in data:
        data += sock.recv(4096)
    return sock
