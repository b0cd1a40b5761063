"""doctor --server against specdraft's own server with a BPE tokenizer, whose text does not
round-trip to the ids the engine ran: doctor asks for the token ids (return_token_ids), so online
and replayed offline acceptance agree exactly; a server that answers text only is re-tokenized,
offline then replays other sequences, and the evidence says so."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer, decoders, models
from transformers import PreTrainedTokenizerFast

from specdraft.doctor import run_doctor
from specdraft.engine.spec_config import SpecConfig
from specdraft.serve import routes as serve_module
from specdraft.serve.responses import ResponseShape
from specdraft.serve.server import build_app, serve_in_thread
from tests.support.doctor_helpers import served_world
from tests.support.engine_helpers import VOCAB, one_thread  # noqa: F401 (fixture)

SPEC = SpecConfig(num_steps=3, topk=1, num_draft_tokens=4)
LETTERS = "abcdefgh"


def bpe_tokenizer() -> PreTrainedTokenizerFast:
    """BPE over the tiny vocabulary: ids 0..7 = "a".."h", ids 8..63 = the pairs "aa", "ab", ...
    (merged). Decoding fuses pieces, so ids 0, 1 ("a", "b") come back as id 9 ("ab")."""
    vocab = {c: i for i, c in enumerate(LETTERS)}
    pairs = [(x, y) for x in LETTERS for y in LETTERS][: VOCAB - len(LETTERS)]
    vocab.update({x + y: len(LETTERS) + i for i, (x, y) in enumerate(pairs)})
    backend = Tokenizer(models.BPE(vocab, pairs))
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=backend)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """(draft dir, target dir with the BPE tokenizer, samples.jsonl): the engine tests' tiny
    smooth Llama and its briefly trained drafter, saved with a manifest."""
    return served_world(tmp_path_factory.mktemp("bpe"), bpe_tokenizer())


def online_finding(world):
    draft, target, samples = world
    server = serve_in_thread(build_app(str(target), str(draft), SPEC, max_seq_len=128))
    try:
        return run_doctor(
            draft, target=target, samples=samples, server=server.url, max_samples=8
        ).finding("online_acceptance")
    finally:
        server.stop()


def rows(evidence: str) -> tuple[list[float], list[float]]:
    """(online p_k, offline p_k) as printed in the evidence."""
    on = evidence.split("online p_k [")[1].split("]")[0]
    off = evidence.split("offline p_k [")[1].split("]")[0]
    return [float(v) for v in on.split(", ")], [float(v) for v in off.split(", ")]


def test_the_bpe_tokenizer_does_not_round_trip():
    tok = bpe_tokenizer()
    assert tok.decode([0, 1, 8]) == "abaa" and tok("abaa")["input_ids"] == [9, 8]


def test_online_and_offline_p1_agree_on_specdraft_server(world):
    finding = online_finding(world)
    online, offline = rows(finding.evidence)
    assert finding.verdict == "pass", finding
    assert 0.2 < online[0] < 0.9, finding  # a drafter that is neither always right nor always wrong
    assert online == pytest.approx(offline, abs=0.005), finding
    assert "re-tokenized" not in finding.evidence


def test_a_text_only_server_is_re_tokenized_and_the_evidence_says_so(world, monkeypatch):
    """A server that ignores return_token_ids (specdraft serve before it had it): doctor
    re-tokenizes its text, offline replays other sequences, and the report says why."""
    monkeypatch.setattr(
        serve_module, "ResponseShape", lambda model, chat, ids: ResponseShape(model, chat)
    )
    finding = online_finding(world)
    online, offline = rows(finding.evidence)
    assert offline[0] < online[0] - 0.1, finding
    assert "8 of 8 outputs came back as text only and were re-tokenized" in finding.evidence
    assert "offline then replays other sequences than online ran" in finding.evidence
