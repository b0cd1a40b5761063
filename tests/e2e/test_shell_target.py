"""benchmarks/shell_target.py: pycode-25m and its committed drafter (and a DFlash drafter,
shell_dflash.py) embedded in a larger Llama shape compute what the small pair computes (float32,
CPU), and the placement rules themselves."""

import math
import sys
from types import SimpleNamespace

import pytest
import torch

from tests.support.benchmarks import load_benchmark
from tests.support.paths import PYCODE


@pytest.fixture(scope="module")
def shell():
    return load_benchmark("shell_target")


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


@pytest.mark.parametrize(
    "flags",
    [dict(fc_norm=True, norm_output=True), dict(norm_before_fc=True)],
    ids=["eagle3.1", "norm_before_fc"],
)
def test_shell_drafter_keeps_the_aux_norms(shell, flags):
    """A seeded drafter with norms on its aux states (EAGLE-3.1's fc_norm per state, or one
    norm_before_fc over all) and its shell (H 32 -> 64, head_dim 8 -> 12) give the same logits
    over two draft steps, the second fed the first's output (post-norm with norm_output)."""
    from tests.support.drafts import tiny_draft

    draft = tiny_draft(dtype=torch.float64, rms_norm_eps=0.5, **flags)
    big = shell.Shape(64, 10, 8, 4, 12, 96)
    embed = torch.zeros(128, 64, dtype=torch.float64)
    embed[:, :32] = torch.randn(128, 32, generator=torch.Generator().manual_seed(1))
    draft.load_target_embedding(embed[:, :32])
    target = SimpleNamespace(tok_embeddings=SimpleNamespace(weight=embed))
    shell_draft = shell.build_draft(draft, big, target)
    aux = 3 * torch.randn(
        1, 6, 3, 32, generator=torch.Generator().manual_seed(2), dtype=torch.float64
    )
    shell_aux = torch.zeros(1, 6, 3, 64, dtype=torch.float64)
    shell_aux[..., :32] = aux
    ids, positions = torch.arange(3, 9)[None], torch.arange(6)[None]
    small = draft(ids, aux.flatten(2), positions, first_step=True)
    large = shell_draft(ids, shell_aux.flatten(2), positions, first_step=True)
    # the shell's rope frequencies are rounded apart from the small drafter's: ~7e-9 with no
    # flags set; a norm placed without its sqrt(H/H') scale is off by ~1e-2
    assert (large.logits - small.logits).abs().max().item() < 1e-7
    again = draft(ids, small.hidden, positions + 1, first_step=False)
    shell_again = shell_draft(ids, large.hidden, positions + 1, first_step=False)
    assert (shell_again.logits - again.logits).abs().max().item() < 1e-7
    assert small.logits.std().item() > 0.01  # logits that say something


@pytest.fixture(scope="module")
def shell_dflash(shell):
    return sys.modules["shell_dflash"]  # imported by shell_target.py


def test_dflash_shell_computes_the_small_block(shell, shell_dflash):
    """A seeded DFlash drafter (float64) and its shell (H 32 -> 64, head_dim 8 -> 12: H/H' != d/D,
    so q/k_proj rows x sqrt(3/4); 4 -> 6 target layers) give the same block logits on the same
    context, the shell's embedded."""
    from tests.support.dflash import tiny_dflash_draft

    draft = tiny_dflash_draft(rms_norm_eps=0.5)  # an eps that matters: the head norms' scaling
    big = shell.Shape(64, 6, 8, 4, 12, 96)
    head = torch.zeros(50, 64, dtype=torch.float64)
    head[:, :32] = draft.embed_weight
    lm_head = torch.zeros_like(head)
    lm_head[:, :32] = draft.lm_head_weight
    target = SimpleNamespace(
        tok_embeddings=SimpleNamespace(weight=head), output=SimpleNamespace(weight=lm_head)
    )
    shell_draft = shell_dflash.build_dflash(draft, big, target)
    assert shell_draft.cfg.target_layer_ids == (0, 2, 3)
    assert shell_draft.cfg.hidden_size == 64 and shell_draft.cfg.head_dim == 12
    aux = torch.randn(9, 3 * 32, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    shell_aux = torch.zeros(9, 3, 64, dtype=torch.float64)
    shell_aux[..., :32] = aux.view(9, 3, 32)
    small = shell_dflash.block_logits(draft, aux, 7)
    large = shell_dflash.block_logits(shell_draft, shell_aux.view(9, -1), 7)
    # float64 drafters; block_logits returns float32: 1 ulp of logits up to ~18 is 1.9e-6
    assert (large - small).abs().max().item() < 1e-5
    assert small.std().item() > 0.1  # logits that say something


def test_dflash_setting_names(shell_dflash):
    from tests.support.dflash import tiny_dflash_draft

    draft = tiny_dflash_draft()  # block 4
    assert shell_dflash.dflash_spec("dflash", draft).num_steps == 3
    assert shell_dflash.dflash_spec("dflash2", draft).num_steps == 2
    assert shell_dflash.dflash_spec("chain3", draft) is None
    with pytest.raises(SystemExit, match="proposes 1..3"):
        shell_dflash.dflash_spec("dflash4", draft)
    with pytest.raises(SystemExit, match="give a DFlash drafter"):
        shell_dflash.dflash_spec("dflash", None)
    assert shell_dflash.default_dflash_settings(draft) == ["dflash"]


def test_dflash_round_time_leaves_the_context_where_it_was(shell_dflash):
    from specdraft.engine.spec_config import SpecConfig
    from tests.support.dflash import engine_dflash_draft
    from tests.support.engine_helpers import tiny_setup

    setup = tiny_setup()
    draft = engine_dflash_draft(setup.target, torch.zeros(1, 8, dtype=torch.long), 4, 0)
    engine = setup.engine(draft, SpecConfig.chain(3))
    ms = shell_dflash.dflash_round_ms(engine, prefix=10, pending=2, iters=3, warmup=1)
    assert ms > 0
    assert [c.length for c in engine.proposer.caches] == [12, 12]  # prefix + pending


@pytest.mark.skipif(
    not PYCODE.is_dir(), reason=f"{PYCODE} is absent: the shell check needs pycode-25m"
)
def test_tiny_dflash_shell_equals_the_small_pair(shell):
    torch.manual_seed(0)
    report = shell.check(
        PYCODE,
        shell.ASSETS / "draft",
        shell.SHAPES["tiny"],
        num_prompts=1,
        new_tokens=12,
        dflash="tiny",
    )
    assert shell.check_passed(report) == []
    dflash = report["dflash"]
    assert dflash["max_abs_block_logits_diff"] < 1e-4
    assert dflash["target_layer_ids"] == {"small": [1, 3, 4], "shell": [1, 4, 5]}
    for name in ("dflash3", "dflash"):
        r = dflash["settings"][name]
        assert r["outputs_equal"] and r["tau_shell"] == r["tau_small"]
    assert dflash["settings"]["dflash"]["tau_small"][0] > 1.5  # multi-token rounds compared
