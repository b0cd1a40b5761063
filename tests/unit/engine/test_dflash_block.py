"""The DFlash block proposer (`engine.dflash_block`): its block equals the training forward over
the same context (the context K/V cached as it grows), speculative decoding at T = 0 in fp32
equals the target's greedy output token for token on the fast target and on transformers-backed
targets (`hf_target.HFTarget`), drafts are accepted, and T = 1 follows the target's distribution
(the FC-10 chi-square test; the always-accept verifier fails it); loading a DFlash drafter
directory pairs it; settings a block cannot run are refused naming the block size."""

from __future__ import annotations

import functools

import pytest
import torch

from specdraft.checkpoint.dflash import save_dflash_draft
from specdraft.checkpoint.manifest import Manifest
from specdraft.engine import sampling
from specdraft.engine.dflash_block import DFlashBlock
from specdraft.engine.errors import EngineError
from specdraft.engine.load import load_engine
from specdraft.engine.sampling import SamplingParams, Verdict, sample
from specdraft.engine.spec_config import SpecConfig
from specdraft.train.dflash_loss import Blocks, block_inputs, block_mask
from tests.support.dflash import (
    TINY_BLOCK,
    engine_dflash_draft,
    save_engine_dflash,
    tiny_dflash_draft,
)
from tests.support.engine_helpers import (  # noqa: F401
    FAIL_P,
    PASS_P,
    TARGET_KW,
    chi_square_prompts,
    chi_square_pvalue,
    greedy_sequences,
    hf_setup,
    one_thread,
    random_prompts,
    tiny_setup,
)
from tests.support.tiny_models import save_tiny_model

PROMPT_LEN, NUM_NEW = 6, 12
HF_CLASSES = ("gemma2", "deepseek_v3", "gpt_oss")  # soft-capping; MLA + MoE; sinks and windows


@functools.cache
def trained(arch: str, hf: bool):
    """(setup, training sequences [B, 18], DFlash drafter trained on them) of a tiny target: the
    greedy continuations of 32 random prompts and of the chi-square prompts."""
    setup = hf_setup(arch) if hf else tiny_setup(arch)
    prompts = random_prompts(32, PROMPT_LEN, seed=2) + chi_square_prompts()
    sequences = greedy_sequences(setup.target, prompts, NUM_NEW)
    return setup, sequences, engine_dflash_draft(setup.target, sequences, PROMPT_LEN, 100)


def test_the_block_over_a_cached_context_equals_the_training_forward():
    draft = tiny_dflash_draft()
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 49, (1, 12), generator=g)
    aux = torch.randn(1, 12, 96, generator=g, dtype=torch.float64)
    anchor = 7
    blocks = Blocks(torch.tensor([[anchor]]), torch.ones(1, 1, dtype=torch.bool))
    block_ids, positions = block_inputs(ids, blocks, TINY_BLOCK, draft.cfg.mask_token_id)
    with torch.no_grad():
        expected = draft(block_ids, aux, positions, block_mask(blocks, 12, TINY_BLOCK))[0]
        proposer = DFlashBlock(draft, SpecConfig.chain(3), 64, torch.device("cpu"))
        proposer.extend(aux[0, :3])  # the prompt's context, then an accepted round's
        proposer.extend(aux[0, 3:anchor])
        got = proposer.block_hidden(block_ids[0], anchor)
    assert [c.length for c in proposer.caches] == [anchor, anchor]
    assert (got - expected).abs().max() < 1e-12


def _check_lossless(setup, sequences, draft):
    """Greedy DFlash output equals the target's greedy output on training prompts and unseen ones,
    with every draft count up to block_size - 1; drafts are accepted."""
    prompts = sequences[:8, :PROMPT_LEN].tolist() + random_prompts(2, PROMPT_LEN, seed=10)
    reference = greedy_sequences(setup.target, prompts, NUM_NEW)[:, PROMPT_LEN:].tolist()
    for num_steps in range(1, TINY_BLOCK):
        engine = setup.engine(draft, SpecConfig.chain(num_steps))
        assert isinstance(engine.proposer, DFlashBlock)
        assert [engine.generate(p, NUM_NEW).token_ids for p in prompts] == reference, num_steps
        assert engine.total.accept_length > 1.2, num_steps
    assert engine.total.accepted_per_position[-1] > 0  # whole blocks accepted


def test_greedy_equals_target_greedy_on_the_fast_target():
    _check_lossless(*trained("llama", hf=False))


@pytest.mark.parametrize("arch", HF_CLASSES)
def test_greedy_equals_target_greedy_on_transformers_targets(arch):
    _check_lossless(*trained(arch, hf=True))


def test_sampling_follows_the_target():
    setup, _, draft = trained("llama", hf=False)
    spec, params = SpecConfig.chain(TINY_BLOCK - 1), SamplingParams(1.0)
    assert chi_square_pvalue(setup, spec, params, draft) > PASS_P
    engine = setup.engine(draft, spec)  # the test's prompts: drafts accepted at T = 1
    for seed, prompt in enumerate(chi_square_prompts() * 10):
        engine.generate(prompt, NUM_NEW, temperature=1.0, seed=seed)
    assert engine.total.accept_length > 1.05


def _always_descend(parents, tokens, target_probs, generator):
    """Biased: accept the whole chain, bonus from the target after it."""
    last = len(tokens) - 1
    return Verdict(list(range(1, last + 1)), int(sample(target_probs[last], generator)))


def test_an_always_accepting_verifier_fails_the_same_test(monkeypatch):
    setup, _, draft = trained("llama", hf=False)
    monkeypatch.setattr(sampling, "verify_tree", _always_descend)
    spec = SpecConfig.chain(TINY_BLOCK - 1)
    assert chi_square_pvalue(setup, spec, SamplingParams(1.0), draft) < FAIL_P


def test_load_engine_pairs_a_saved_dflash_drafter(tmp_path):
    setup, sequences, draft = trained("llama", hf=False)
    args = setup.target.args
    target = {"num_layers": args.num_layers, "hidden_size": args.hidden_size}
    manifest = Manifest(
        draft=draft.cfg.to_dict(),
        target=target | {"vocab_size": args.vocab_size},
        aux_layers=list(draft.cfg.aux_layers),
        extra={"method": "dflash"},
    )
    path = save_dflash_draft(draft, tmp_path / "draft", manifest)
    engine = load_engine(setup.target_dir, path, SpecConfig.chain(2))
    assert isinstance(engine.proposer, DFlashBlock) and engine.notes == []
    prompt = sequences[0, :PROMPT_LEN].tolist()
    assert engine.generate(prompt, NUM_NEW).token_ids == sequences[0, PROMPT_LEN:].tolist()
    other = tmp_path / "other"
    save_dflash_draft(
        draft, other, Manifest(**{**manifest.__dict__, "target": target | {"vocab_size": 99}})
    )
    with pytest.raises(EngineError, match="trained for another target"):
        load_engine(setup.target_dir, other, SpecConfig.chain(2))


def test_load_engine_pairs_a_dflash_drafter_with_a_transformers_target(tmp_path):
    target_dir = save_tiny_model("gemma3", tmp_path / "gemma3", **TARGET_KW)
    engine = load_engine(target_dir, None, None)  # the transformers-backed target alone
    draft = engine_dflash_draft(engine.target, torch.zeros(1, 8, dtype=torch.long), 4, 0)
    path = save_engine_dflash(draft, engine.target, tmp_path / "draft")
    engine = load_engine(target_dir, path, SpecConfig.chain(TINY_BLOCK - 1))
    assert engine.target_path == "transformers" and isinstance(engine.proposer, DFlashBlock)
    prompt = random_prompts(1, PROMPT_LEN, seed=3)[0]
    expected = greedy_sequences(engine.target, [prompt], NUM_NEW)[0, PROMPT_LEN:].tolist()
    assert engine.generate(prompt, NUM_NEW).token_ids == expected


@pytest.mark.parametrize(
    ("spec", "refusal"),
    [
        (SpecConfig.chain(TINY_BLOCK), f"num_steps {TINY_BLOCK} > block_size {TINY_BLOCK} - 1"),
        (SpecConfig(2, 2, 4), "topk 2: a DFlash drafter proposes one chain per block"),
    ],
)
def test_settings_a_block_cannot_run_are_refused(spec, refusal):
    setup, _, draft = trained("llama", hf=False)
    with pytest.raises(EngineError, match=refusal):
        setup.engine(draft, spec)
