"""doctor's online_acceptance against a specdraft server on loopback (the trained tiny world):
the healthy drafter passes with both rows, a server running a drafter with a wrong d2t fails
naming the gap, an unreachable URL fails naming it."""

from __future__ import annotations

import re
import shutil
import socket

import pytest
import torch

from specdraft.doctor import run_doctor
from specdraft.doctor.launch import ENGINE_ARGS_FIX, SPECDRAFT_SERVE_FIX
from specdraft.engine.spec_config import SpecConfig
from specdraft.serve.server import build_app, serve_in_thread
from tests.support.doctor_helpers import edit_weights, served_world
from tests.support.engine_helpers import one_thread, random_prompts  # noqa: F401 (fixture)
from tests.support.serve_helpers import word_tokenizer

SPEC = SpecConfig(num_steps=3, topk=1, num_draft_tokens=4)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """(draft dir, target dir with a word tokenizer, samples.jsonl): the engine tests' tiny
    smooth Llama and its briefly trained drafter (accepted ~50 %), saved with a manifest."""
    return served_world(tmp_path_factory.mktemp("online"), word_tokenizer())


def serve(target, draft):
    return serve_in_thread(build_app(str(target), str(draft), SPEC, max_seq_len=128))


def doctor(draft, target, samples, url):
    return run_doctor(draft, target=target, samples=samples, server=url, max_samples=8).finding(
        "online_acceptance"
    )


def with_shifted_d2t(draft, dst):
    """A copy of `draft` at `dst` whose map sends draft id i to target id i (d2t zeroed, t2d
    agreeing): a valid map that the engine loads, but the wrong one for all draft ids but 0
    (the drafter's vocabulary is not the first ids)."""
    shutil.copytree(draft, dst)

    def shift(tensors):
        d2t = next(k for k in tensors if k.endswith("d2t"))
        t2d = next(k for k in tensors if k.endswith("t2d"))
        tensors[d2t] = torch.zeros_like(tensors[d2t])
        tensors[t2d] = torch.arange(len(tensors[t2d])) < len(tensors[d2t])

    edit_weights(dst, shift)
    return dst


def doctor_against_server(draft, served, target, samples):
    """doctor's online finding for `draft` against a live server running `served`."""
    server = serve(target, served)
    try:
        return doctor(draft, target, samples, server.url)
    finally:
        server.stop()


def test_online_acceptance_healthy_server_passes(world, capsys):
    draft, target, samples = world
    finding = doctor_against_server(draft, draft, target, samples)
    assert finding.verdict == "pass", finding
    assert "online p_k [" in finding.evidence and "offline p_k [" in finding.evidence
    assert "(specdraft)" in finding.evidence
    # the long stages show a count and the time left (plain lines off a terminal, on stderr)
    err = capsys.readouterr().err
    for stage in ("online acceptance (requests)", "offline acceptance (samples)"):
        assert re.search(rf"doctor {re.escape(stage)} (\d+)/\1  ETA \d+:\d\d:\d\d", err), err


def test_online_acceptance_server_with_wrong_d2t_fails(world, tmp_path):
    draft, target, samples = world
    finding = doctor_against_server(
        draft, with_shifted_d2t(draft, tmp_path / "wrong"), target, samples
    )
    print(finding)
    assert finding.verdict == "fail", finding
    assert "online p_1" in finding.evidence and "offline p_1" in finding.evidence
    assert "vocab map (d2t)" in finding.fix


def test_online_acceptance_server_running_another_drafter_fails(world, tmp_path):
    """A server far better than the doctored checkpoint serves some other drafter."""
    draft, target, samples = world
    finding = doctor_against_server(
        with_shifted_d2t(draft, tmp_path / "broken"), draft, target, samples
    )
    assert finding.verdict == "fail", finding
    assert (
        "accepts far more than this checkpoint" in finding.evidence
        and "another drafter" in finding.fix
    )


def test_against_specdraft_serve_the_launch_checks_advise_its_options(world):
    """specdraft serve has no SGLang / vLLM launch line: the checks of one say so and advise
    specdraft serve's options, not --engine-args (which they advise without a server)."""
    draft, target, samples = world
    server = serve(target, draft)
    try:
        report = run_doctor(draft, target=target, samples=samples, server=server.url, max_samples=8)
    finally:
        server.stop()
    for check in ("algorithm_is_eagle3", "launch_names_these_models", "speculative_settings_valid"):
        finding = report.finding(check)
        assert finding.verdict == "skip", finding
        assert (
            finding.evidence
            == f"{server.url} is specdraft serve: it has no SGLang or vLLM launch line to check"
        )
        assert finding.fix == SPECDRAFT_SERVE_FIX and "--engine-args" not in finding.fix
    depth = report.finding("draft_depth_pays_off")  # on the chain the server reports running
    assert depth.verdict != "skip" and "with 3 steps" in depth.evidence, depth
    assert (
        "--engine-args" not in report.skips_enabled_by()
    )  # the table's caption names no such input
    assert report.finding("online_acceptance").verdict == "pass"
    alone = run_doctor(draft, target=target, samples=samples, max_samples=8)
    assert (
        alone.finding("algorithm_is_eagle3").fix == ENGINE_ARGS_FIX
        and "--engine-args" in alone.skips_enabled_by()
    )


def test_a_specdraft_server_that_drafts_nothing_is_told_to_start_with_the_drafter(world):
    draft, target, samples = world
    server = serve_in_thread(
        build_app(str(target), None, None, max_seq_len=128)
    )  # specdraft serve --no-spec
    try:
        report = run_doctor(draft, target=target, samples=samples, server=server.url, max_samples=8)
    finally:
        server.stop()
    finding = report.finding("online_acceptance")
    assert finding.verdict == "fail" and "the server verified no drafts" in finding.evidence, (
        finding
    )
    assert finding.fix == f"restart specdraft serve with --draft {draft} (not --no-spec)"
    depth = report.finding("draft_depth_pays_off")
    assert depth.verdict == "skip" and "without speculation" in depth.evidence, depth
    assert depth.fix == f"restart specdraft serve with --draft {draft}"


def test_online_acceptance_unreachable_server_fails(world):
    draft, target, samples = world
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    finding = run_doctor(
        draft, target=target, samples=samples, server=url, max_samples=8, server_wait_s=0
    ).finding("online_acceptance")
    assert finding.verdict == "fail"
    assert url in finding.evidence


def test_online_acceptance_without_server_skips(world):
    draft, target, samples = world
    finding = run_doctor(draft, target=target, samples=samples).finding("online_acceptance")
    assert (
        finding.verdict == "skip" and "--server URL" in finding.fix and "--samples" in finding.fix
    )


def test_online_acceptance_unreachable_server_fails_without_samples(world):
    draft, target, _ = world
    finding = run_doctor(
        draft, target=target, server="http://127.0.0.1:1", server_wait_s=0
    ).finding("online_acceptance")
    assert finding.verdict == "fail" and "http://127.0.0.1:1" in finding.evidence


def test_replayed_rounds_equal_the_engine_counts(world):
    """The drafter alone replaying chain rounds on the engine's own outputs gives the engine's
    verification steps and per-depth accepted counts exactly (both fp32 on the CPU)."""
    from specdraft.data.render import Sample
    from specdraft.doctor.evidence import Evidence
    from specdraft.doctor.inputs import DoctorInputs
    from specdraft.doctor.offline import run_on
    from specdraft.engine.load import load_engine

    draft, target, _ = world
    engine = load_engine(target, draft, SPEC)
    prompts = random_prompts(8, 12, seed=11)
    results = [engine.generate(p, 40) for p in prompts]
    served = [
        Sample(p + r.token_ids, [0] * len(p) + [1] * len(r.token_ids))
        for p, r in zip(prompts, results)
    ]
    replay = run_on(
        Evidence(DoctorInputs(draft, target=target)), None, SPEC.num_steps, served, replay=True
    ).metrics
    steps = sum(r.metrics.num_verify_steps for r in results)
    per_pos = [
        sum(
            r.metrics.accepted_per_position[k]
            for r in results
            if k < len(r.metrics.accepted_per_position)
        )
        for k in range(SPEC.num_steps)
    ]
    assert 0 < per_pos[0] < steps, (
        per_pos
    )  # a drafter that is neither always right nor always wrong
    assert (int(replay.rounds), replay.round_accepted.tolist()) == (steps, per_pos)


def test_replay_rounds_walks_the_chain():
    """Each round accepts the leading hits of its column and moves by accepted + 1; a supervised
    run is entered one token before it starts and left where it ends."""
    from specdraft.train.loss import greedy_choices, replay_rounds

    # K = 2 steps, T = 9 tokens
    hits = torch.tensor(
        [[0, 1, 0, 1, 1, 0, 1, 0, 0], [0, 1, 0, 0, 1, 0, 0, 0, 0]], dtype=torch.bool
    )

    def from_(a: int, end: int = 9) -> torch.Tensor:
        return torch.tensor([a <= i < end for i in range(9)])

    # base 1: both hit -> base 4: both -> base 7: 7 + 2 = 9 is past the end.
    assert replay_rounds(hits, from_(2)) == (2, [2, 2])
    # base 0: miss -> 1: both -> 4: both -> 7: stop.
    assert replay_rounds(hits, from_(1)) == (3, [2, 2])
    # base 2: miss -> 3: one (step 1 misses) -> 5: miss -> 6: one -> 8: stop.
    assert replay_rounds(hits, from_(3)) == (4, [2, 0])
    # a run 2..5: base 1 accepts tokens 3 and 4 -> base 4: token 6 is outside; two runs add up.
    assert replay_rounds(hits, from_(2, 6)) == (1, [1, 1])
    assert replay_rounds(hits, from_(2, 6) | from_(8)) == (1, [1, 1])  # 7 + 2 = 9: no round
    assert greedy_choices(torch.tensor([5, 6, 7, 8]), 2).tolist() == [
        [6, 7, -1, -1],
        [7, -1, -1, -1],
    ]


def test_validation_replays_the_rounds_of_the_ttt_depth():
    """ttt_loss(replay=True) counts the rounds replay_rounds walks on each row, with the
    target's argmax as the greedy choice; without replay the counts stay zero."""
    from specdraft.train.loss import greedy_choices, replay_rounds, ttt_loss, ttt_unroll
    from specdraft.train.metrics import TTTMetrics
    from tests.support.drafts import ttt_draft, ttt_inputs

    draft = ttt_draft(0)
    ids, aux = ttt_inputs(4, t_len=12)
    logits = torch.randn(1, 12, 48, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    mask = torch.zeros(1, 12, dtype=torch.bool)
    mask[0, 3:] = True
    with torch.no_grad():
        plain = ttt_loss(draft, ids, aux, logits, mask, ttt_steps=3)
        out = ttt_loss(draft, ids, aux, logits, mask, ttt_steps=3, replay=True)
        drafts = torch.stack(
            [draft.draft_to_target(o.logits[0].argmax(-1)) for o in ttt_unroll(draft, ids, aux, 3)]
        )
    assert int(plain.rounds) == 0 and plain.round_accepted.tolist() == [0, 0, 0]
    want = replay_rounds(drafts == greedy_choices(logits[0].argmax(-1), 3), mask[0])
    assert (int(out.rounds), out.round_accepted.tolist()) == want and want[0] >= 3
    metrics = TTTMetrics.zeros(3)
    metrics.add(out)
    assert metrics.replayed_tau() == 1 + sum(want[1]) / want[0]


def other_model_app(vocab: int):
    """A vLLM-like server of another model (`vocab` ids, /v1/models "other-model"): greedy
    completions return the token ids vocab - 1, vocab - 2, ...; /metrics exposes vLLM's counters
    (one 3-token draft per output token, the first accepted)."""
    from fastapi import FastAPI
    from starlette.responses import JSONResponse, PlainTextResponse

    app = FastAPI()
    tokens = [0]

    @app.get("/v1/models")
    async def models():
        return JSONResponse({"object": "list", "data": [{"id": "other-model", "object": "model"}]})

    @app.get("/metrics")
    async def metrics():
        n = float(tokens[0])
        lines = [
            f"# TYPE vllm:spec_decode_{name} counter\nvllm:spec_decode_{name}_total {value}"
            for name, value in (
                ("num_drafts", n),
                ("num_draft_tokens", 3 * n),
                ("num_accepted_tokens", n),
            )
        ]
        return PlainTextResponse("\n".join(lines) + "\n")

    @app.post("/v1/completions")
    async def completions(body: dict):
        ids = [vocab - 1 - k for k in range(body["max_tokens"])]
        tokens[0] += len(ids)
        return JSONResponse(
            {"choices": [{"text": "", "token_ids": ids}], "usage": {"completion_tokens": len(ids)}}
        )

    return app


def test_online_acceptance_server_of_another_model_fails_naming_it(world):
    """A server whose ids run past --target's vocabulary serves another model: one failed row
    naming the id, the served model and the fix, not an IndexError in the offline replay."""
    draft, target, samples = world
    server = serve_in_thread(other_model_app(4096))
    try:
        finding = doctor(draft, target, samples, server.url)
    finally:
        server.stop()
    assert finding.verdict == "fail", finding
    assert "token id 4095" in finding.evidence and "'other-model'" in finding.evidence, finding
    assert "start the server on --target" in finding.fix and "other-model" in finding.fix
