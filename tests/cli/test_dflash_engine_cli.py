"""`specdraft generate`, `serve` and `tune` with a DFlash drafter directory: the target's greedy text,
block_size - 1 drafts per round unless --num-steps says fewer, and the one-line usage errors for
what a block cannot run (more drafts than its block, an EAGLE-3 tree, EAGLE-3 aux-id options)."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

import specdraft.cli.serve
import specdraft.serve.server
from specdraft.cli import app
from specdraft.engine.dflash_block import DFlashBlock
from tests.support.cli import cli_args, cli_options
from tests.support.dflash import TINY_BLOCK, engine_dflash_draft, save_engine_dflash
from tests.support.engine_helpers import (  # noqa: F401
    copy_with_word_tokenizer,
    greedy_sequences,
    one_thread,
    tiny_setup,
)
from tests.support.serve_helpers import text_prompts, write_prompts

PROMPT = "w1 w5 w9 w13 w2 w7"


@pytest.fixture
def dflash_world(tmp_path):
    """(target dir with a word tokenizer, DFlash drafter dir, the prompt's greedy continuation)."""
    setup = tiny_setup("llama")
    tokenizer = copy_with_word_tokenizer(setup, tmp_path / "target")
    ids = tokenizer(PROMPT)["input_ids"]
    sequences = greedy_sequences(setup.target, [ids], 12)
    draft = engine_dflash_draft(setup.target, sequences, len(ids), 20)
    draft_dir = save_engine_dflash(draft, setup.target, tmp_path / "draft")
    return tmp_path / "target", draft_dir, tokenizer.decode(sequences[0, len(ids) :].tolist())


def _generate(target, **options):
    args = cli_args("generate", target=target, prompt=PROMPT, max_new_tokens=12, max_seq_len=64)
    return CliRunner().invoke(app, args + cli_options(**options))


def test_generate_with_a_dflash_drafter_prints_the_greedy_text(dflash_world):
    target, draft, expected = dflash_world
    whole = _generate(target, draft=draft)
    assert whole.exit_code == 0, whole.output
    assert expected in whole.output.replace("\n", "")
    steps = TINY_BLOCK - 1  # the whole block by default
    assert f"steps {steps}, topk 1, draft tokens {steps + 1}" in whole.stderr
    fewer = _generate(target, draft=draft, num_steps=1)
    assert fewer.exit_code == 0, fewer.output
    assert expected in fewer.output.replace("\n", "") and "steps 1, topk 1" in fewer.stderr


@pytest.mark.parametrize(
    ("options", "line"),
    [
        (
            {"num_steps": TINY_BLOCK},
            f"--num-steps {TINY_BLOCK}: the DFlash drafter {{draft}} (block size {TINY_BLOCK}) "
            f"proposes at most {TINY_BLOCK - 1} drafts per round (block size - 1): pass "
            f"--num-steps 1..{TINY_BLOCK - 1}",
        ),
        (
            {"num_draft_tokens": TINY_BLOCK + 1},
            f"--num-draft-tokens {TINY_BLOCK + 1}: the DFlash drafter {{draft}} (block size "
            f"{TINY_BLOCK}) proposes at most {TINY_BLOCK - 1} drafts",
        ),
        (
            {"topk": 2, "num_draft_tokens": 4},
            f"--topk 2 drafts an EAGLE-3 tree; the DFlash drafter {{draft}} (block size "
            f"{TINY_BLOCK}) proposes one chain per block: drop --topk",
        ),
        (
            {"sglang_version": "0.5.10"},
            "--sglang-version reads an EAGLE-3 drafter's aux layer ids; the DFlash drafter "
            "{draft} (block size 4) names its target layers in config.json "
            "(dflash_config.target_layer_ids): drop --sglang-version",
        ),
    ],
)
def test_what_a_block_cannot_run_is_one_usage_line(dflash_world, options, line):
    target, draft, _ = dflash_world
    result = _generate(target, draft=draft, **options)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert line.format(draft=draft) in lines[0], lines[0]


def test_serve_builds_a_dflash_engine(dflash_world, monkeypatch):
    target, draft, _ = dflash_world
    served = []
    monkeypatch.setattr(
        specdraft.serve.server, "serve", lambda app, host, port: served.append(app.state.server)
    )
    monkeypatch.setattr(specdraft.cli.serve, "check_port_free", lambda host, port: None)
    result = CliRunner().invoke(app, cli_args("serve", target=target, draft=draft))
    assert result.exit_code == 0, result.output
    engine = served[0].engine
    assert isinstance(engine.proposer, DFlashBlock) and engine.spec.num_steps == TINY_BLOCK - 1
    assert f"steps {TINY_BLOCK - 1}, topk 1" in result.output
    with torch.inference_mode():
        assert (
            engine.generate([1, 5, 9], 4).token_ids
            == greedy_sequences(engine.target, [[1, 5, 9]], 4)[0, 3:].tolist()
        )


def test_tune_with_a_dflash_drafter_measures_chains_of_its_block(dflash_world, tmp_path):
    target, draft, _ = dflash_world
    prompts = write_prompts(tmp_path / "prompts.jsonl", text_prompts(2, 8, seed=31))
    base = cli_args("tune", target=target, draft=draft, prompts=prompts, max_tokens=8)
    result = CliRunner().invoke(
        app, base + cli_options(num_measure=1, repeats=1, json_out=tmp_path / "tune.json")
    )
    assert result.exit_code == 0, result.output
    data = json.loads((tmp_path / "tune.json").read_text())
    steps = TINY_BLOCK - 1  # probed and current: the whole block
    assert set(data["probes"]) == {"1"} and data["probes"]["1"]["accepted_per_position"]
    assert len(data["probes"]["1"]["accepted_per_position"]) == steps
    assert data["current"]["num_steps"] == steps
    assert {c["num_steps"] for c in data["candidates"]} == set(range(1, steps + 1))
    assert all(c["topk"] == 1 for c in data["candidates"])
    assert f"current: steps {steps}, topk 1" in result.output
    for refused, line in (
        (
            cli_options(topks="1,2"),
            f"--topks 1,2 names EAGLE-3 tree widths; the DFlash drafter {draft} (block size "
            f"{TINY_BLOCK}) proposes chains only: drop --topks",
        ),
        (
            cli_options(probe_steps=TINY_BLOCK),
            f"--probe-steps {TINY_BLOCK}: the DFlash drafter {draft} (block size {TINY_BLOCK}) "
            f"proposes at most {steps} drafts per round: pass --probe-steps 1..{steps}",
        ),
        (cli_options(num_steps=TINY_BLOCK), f"--num-steps {TINY_BLOCK}: the DFlash drafter"),
    ):
        result = CliRunner().invoke(app, base + refused)
        lines = result.output.strip().splitlines()
        assert result.exit_code != 0 and len(lines) == 1, result.output
        assert lines[0].startswith(f"error: {line}"), lines[0]
