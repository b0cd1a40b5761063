"""benchmarks/shell_target.py: pycode-25m and its committed drafter embedded in a larger Llama
shape compute what the small pair computes (float32, CPU), and the placement rules themselves."""

import importlib.util
import math
import sys
from pathlib import Path

import pytest
import torch

from tests.support.paths import PYCODE

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "shell_target.py"


@pytest.fixture(scope="module")
def shell():
    sys.path.insert(0, str(SCRIPT.parent))  # its helpers, as when run as a script
    spec = importlib.util.spec_from_file_location("shell_target", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_head_rows_keep_rotate_half_pairs(shell):
    emb = shell.Embedding(shell.Shape(8, 2, 2, 1, 4, 16), shell.Shape(16, 4, 4, 2, 8, 32))
    # small head dims (0, 1 | 2, 3) -> shell dims (0, 1 | 4, 5) of the same head, head 1 at 8
    assert emb.head_rows(2).tolist() == [0, 1, 4, 5, 8, 9, 12, 13]
    assert emb.hidden(3).tolist() == list(range(8)) + list(range(16, 24)) + list(range(32, 40))
    assert [emb.layer(k) for k in range(3)] == [0, 2, 4]
    assert emb.norm_scale == pytest.approx(math.sqrt(0.5)) and emb.eps_scale == 0.5
    assert emb.q_scale == pytest.approx(math.sqrt(2)) and emb.rope_theta(100.0) == pytest.approx(
        1e4
    )


def test_refuses_other_group_sizes(shell):
    with pytest.raises(ValueError, match="GQA group"):
        shell.Embedding(shell.Shape(8, 2, 4, 1, 4, 16), shell.Shape(16, 4, 4, 2, 8, 32))
    with pytest.raises(ValueError, match="smaller than the model"):
        shell.Embedding(shell.Shape(8, 2, 2, 1, 4, 16), shell.Shape(16, 1, 4, 2, 8, 32))


def test_place_scales_into_rows_and_columns(shell):
    dest = torch.full((4, 6), 7.0)
    shell.place(
        dest,
        torch.tensor([[1.0, 2.0], [3.0, 4.0]]),
        torch.tensor([3, 0]),
        torch.tensor([5, 1]),
        scale=2.0,
    )
    assert (
        dest[3, 5] == 2
        and dest[3, 1] == 4
        and dest[0, 5] == 6
        and dest[0, 1] == 8
        and dest[1, 1] == 7
    )


@pytest.mark.skipif(
    not PYCODE.is_dir(), reason=f"{PYCODE} is absent: the shell check needs pycode-25m"
)
def test_tiny_shell_equals_the_small_pair(shell):
    torch.manual_seed(0)
    report = shell.check(
        PYCODE, shell.ASSETS / "draft", shell.SHAPES["tiny"], num_prompts=1, new_tokens=12
    )
    assert shell.check_passed(report) == []
    assert report["max_abs_logits_diff"] < 1e-4
    assert report["aux_layers"] == {"small": [2, 4, 5], "shell": [2, 5, 6]}
    chain = report["settings"]["chain3"]
    assert (
        chain["outputs_equal"]
        and chain["tau_shell"] == chain["tau_small"]
        and chain["tau_small"][0] > 1.0
    )
    tree = report["settings"]["tree4x2_8"]
    assert tree["outputs_equal"] and tree["tau_shell"] == tree["tau_small"]
