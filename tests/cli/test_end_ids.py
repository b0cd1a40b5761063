"""Where a generation ends: `generate`, `serve` and `regenerate` stop at the target's end ids
(`target.config.end_token_ids`): the tokenizer's EOS and generation_config.json's eos_token_id
list, as transformers `generate` and vLLM do (Llama-3.1-Instruct lists [128001, 128008, 128009],
its tokenizer's EOS one of them). Before, generate and serve stopped at the tokenizer's EOS only
and ran past the end of a chat turn on such targets."""

from __future__ import annotations

import json
import shutil

import httpx
import pytest
from transformers import GenerationConfig
from typer.testing import CliRunner

from specdraft.cli import app
from specdraft.engine.requests import decode_continuation
from specdraft.regenerate.backends import LocalBackend, Prompt, Sampling
from specdraft.serve.server import build_app, serve_in_thread
from specdraft.targets.config import end_token_ids
from tests.support.cli import cli_args
from tests.support.engine_helpers import VOCAB, greedy_sequences, one_thread, tiny_setup  # noqa: F401
from tests.support.serve_helpers import word_tokenizer

PROMPT = "w1 w5 w9 w13 w2 w7"
NUM_NEW = 12


@pytest.fixture(scope="module")
def ends(tmp_path_factory):
    """(target dir, greedy continuation, k): the tiny target whose tokenizer's EOS never comes up in
    the greedy continuation of PROMPT and whose generation_config.json also lists the k-th token of
    it (its first occurrence, k >= 3), which the tokenizer does not name."""
    setup = tiny_setup("llama")
    target = tmp_path_factory.mktemp("ends") / "target"
    shutil.copytree(setup.target_dir, target)
    ids = word_tokenizer()(PROMPT)["input_ids"]
    out = greedy_sequences(setup.target, [ids], NUM_NEW)[0, len(ids) :].tolist()
    k = next(i for i in range(3, NUM_NEW) if out[i] not in out[:i])
    eos = next(i for i in range(VOCAB) if i not in out)
    word_tokenizer(eos=f"w{eos}").save_pretrained(target)
    (target / "generation_config.json").write_text(json.dumps({"eos_token_id": [eos, out[k]]}))
    return target, out, k


def text_of(ids: list[int]) -> str:
    return decode_continuation(word_tokenizer(), word_tokenizer()(PROMPT)["input_ids"], ids)


def test_end_ids_join_the_tokenizer_eos_and_the_generation_config(ends, tmp_path):
    target, out, k = ends
    tokenizer = word_tokenizer(eos="w3")
    assert end_token_ids(tokenizer, target) == sorted(
        {3, *json.loads((target / "generation_config.json").read_text())["eos_token_id"]}
    )
    assert end_token_ids(tokenizer, GenerationConfig(eos_token_id=9)) == [3, 9]
    assert end_token_ids(tokenizer, GenerationConfig(eos_token_id=[9, 3, 1])) == [1, 3, 9]
    assert end_token_ids(word_tokenizer(), GenerationConfig()) == []  # neither names one
    bare = tmp_path / "bare"  # no generation_config.json: config.json's, as transformers builds it
    shutil.copytree(target, bare)
    (bare / "generation_config.json").unlink()
    assert end_token_ids(tokenizer, bare) == [2, 3]  # the tiny Llama config's eos_token_id 2
    (bare / "generation_config.json").write_text(json.dumps({"eos_token_id": "w3"}))
    with pytest.raises(
        ValueError, match=f"{bare}: generation config eos_token_id 'w3' is not a token id"
    ):
        end_token_ids(tokenizer, bare)


def test_generate_stops_at_a_generation_config_end_id(ends):
    target, out, k = ends
    common = cli_args(
        "generate", target=target, prompt=PROMPT, max_new_tokens=NUM_NEW, max_seq_len=64
    )
    result = CliRunner().invoke(app, common)
    assert result.exit_code == 0, result.output
    streamed = result.output.split("\n")[0]  # the prompt, then the generated text
    assert streamed == PROMPT + text_of(out[: k + 1])  # before the fix: all NUM_NEW tokens
    assert f"output tokens             │ {k + 1:>13}" in result.output
    past = CliRunner().invoke(app, common + ["--ignore-eos"])
    assert past.exit_code == 0, past.output
    assert past.output.split("\n")[0] == PROMPT + text_of(out)


def test_serve_stops_at_a_generation_config_end_id(ends):
    target, out, k = ends
    with serve_in_thread(build_app(str(target), None, None, max_seq_len=64)) as server:
        client = httpx.Client(base_url=server.url, timeout=30)
        body = {"prompt": PROMPT, "temperature": 0, "max_tokens": NUM_NEW}
        stopped = client.post("/v1/completions", json=body).json()["choices"][0]
        assert (stopped["text"], stopped["finish_reason"]) == (text_of(out[: k + 1]), "stop")
        past = client.post("/v1/completions", json={**body, "ignore_eos": True}).json()["choices"][
            0
        ]
        assert (past["text"], past["finish_reason"]) == (text_of(out), "length")


def test_regenerate_stops_at_the_same_end_ids(ends):
    target, out, k = ends
    backend = LocalBackend(target)
    assert backend.eos_ids == end_token_ids(backend.tokenizer, target)
    ids = backend.tokenizer(PROMPT)["input_ids"]
    [completion] = backend.complete([Prompt(0, ids=ids)], Sampling(max_new_tokens=NUM_NEW))
    assert completion.content == text_of(out[:k])  # an answer leaves its end id out
