"""Case S4 (engine side): speculative arguments SGLang would silently rewrite are refused.

`--speculative-eagle-topk 1 --speculative-num-steps 1 --speculative-num-draft-tokens 16`:
SGLang sets num_draft_tokens = num_steps + 1 = 2. specdraft's SpecConfig (and so its engine and
`specdraft generate`) refuses the triple and proposes steps 15 / draft tokens 16 or a tree.
The doctor's lint of the same launch command is tests/cases/test_case_s4_spec_args.py.
"""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from specdraft.cli import app
from specdraft.engine.spec_config import SpecConfig
from tests.support.cli import cli_args, cli_options


def test_case_s4_chain_with_wrong_draft_tokens_is_refused_with_fixes():
    with pytest.raises(ValueError) as info:
        SpecConfig(num_steps=1, topk=1, num_draft_tokens=16)
    message = str(info.value)
    assert "num_draft_tokens must be num_steps + 1 = 2" in message
    assert "SGLang would silently set num_draft_tokens = 2" in message
    assert "num_steps 15 / num_draft_tokens 16" in message
    topk, steps, tokens = map(
        int, re.search(r"topk (\d+), num_steps (\d+), num_draft_tokens (\d+)$", message).groups()
    )
    assert topk > 1 and tokens == 16
    SpecConfig(steps, topk, tokens)  # the proposed tree is valid
    SpecConfig(15, 1, 16)  # and so is the proposed chain


@pytest.mark.parametrize(
    "triple", [(3, 1, 4), (1, 1, 2), (3, 2, 2), (3, 2, 10), (4, 4, 53), (1, 8, 9)]
)
def test_valid_triples(triple):
    SpecConfig(*triple)


@pytest.mark.parametrize(
    "triple, rule",
    [
        ((3, 1, 3), "num_steps \\+ 1 = 4"),
        ((3, 2, 1), "2 <= num_draft_tokens"),
        ((4, 4, 54), "= 53 nodes"),
        ((1, 8, 10), "= 9 nodes"),
        ((0, 1, 1), "num_steps = 0"),
        ((2, 0, 3), "topk = 0"),
    ],
)
def test_invalid_triples_name_the_rule(triple, rule):
    with pytest.raises(ValueError, match=rule):
        SpecConfig(*triple)


def test_chain_helper_and_vllm_length():
    spec = SpecConfig.chain(5)
    assert (spec.num_steps, spec.topk, spec.num_draft_tokens) == (5, 1, 6)
    assert spec.num_speculative_tokens == 5 and spec.is_chain
    assert spec.sglang_args() == cli_options(
        speculative_num_steps=5, speculative_eagle_topk=1, speculative_num_draft_tokens=6
    )


def test_case_s4_generate_cli_refuses_before_loading(tmp_path):
    (tmp_path / "unloadable").mkdir()
    (tmp_path / "unloadable" / "config.json").write_text("{}")  # never read: refused first
    (tmp_path / "empty-draft").mkdir()  # a directory (--draft is checked), never read
    result = CliRunner().invoke(
        app,
        cli_args(
            "generate",
            target=tmp_path / "unloadable",
            draft=tmp_path / "empty-draft",
            prompt="hi",
            topk=1,
            num_steps=1,
            num_draft_tokens=16,
        ),
    )
    assert result.exit_code == 2  # a usage error: the options cannot run together
    assert "SGLang would silently set num_draft_tokens = 2" in result.stderr
