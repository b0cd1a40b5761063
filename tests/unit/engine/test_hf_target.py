"""The transformers-backed engine target (`engine.hf_target.HFTarget`) on every decoder class of
tests.support.tiny_models: its cached forward equals the model's full forward (sliding windows and
chunked attention crossed, rejected slots dropped), speculative decoding at T = 0 equals the
target's greedy output token for token (chain and tree), T = 1 follows the target's distribution
(the FC-10 chi-square test), and `load_engine` picks it where the fast path does not apply."""

from __future__ import annotations

import pytest
import torch

from specdraft.engine.fast_model import causal_mask
from specdraft.engine.hf_target import cache_argument
from specdraft.engine.load import load_engine
from specdraft.engine.sampling import SamplingParams
from specdraft.engine.spec_config import SpecConfig
from tests.support.engine_helpers import (  # noqa: F401
    PASS_P,
    chi_square_pvalue,
    greedy_sequences,
    hf_setup,
    one_thread,
    random_prompts,
)
from tests.support.tiny_models import ARCHITECTURES, MORE_ARCHITECTURES, save_tiny_model

CLASSES = [
    a for a in ARCHITECTURES + MORE_ARCHITECTURES if a != "deepseek_v2"
]  # V3 covers MLA + MoE
NUM_PROMPTS, PROMPT_LEN, NUM_NEW = 4, 6, 12  # 18 positions: past the tiny windows / chunks of 4


@pytest.mark.parametrize("arch", CLASSES)
def test_cached_forward_with_dropped_slots_equals_the_full_forward(arch):
    target = hf_setup(arch).target
    ids = torch.tensor(random_prompts(1, 14, seed=4))
    with torch.inference_mode():
        full = target.target.causal_lm(input_ids=ids).logits.float()[0]
    target.setup_cache(1, 64)
    out = target(ids[:, :6], torch.arange(6)[None], torch.arange(6), causal_mask(0, 6, 6), (0, 4))
    errors = [(out.logits[0] - full[:6]).abs().max()]
    for p in range(6, 14):  # a rejected 2-token draft first, then the real token over it
        target(
            torch.tensor([[5, 7]]),
            torch.tensor([[p, p + 1]]),
            torch.arange(p, p + 2),
            causal_mask(p, 2, p + 2),
        )
        out = target(
            ids[:, p : p + 1],
            torch.tensor([[p]]),
            torch.tensor([p]),
            causal_mask(p, 1, p + 1),
            (0, 4),
        )
        errors.append((out.logits[0, 0] - full[p]).abs().max())
    assert max(errors) < 1e-5, arch
    assert out.aux_hidden.shape == (1, 1, 2 * target.args.hidden_size)


@pytest.mark.parametrize("arch", CLASSES)
def test_speculative_greedy_equals_target_greedy(arch):
    setup = hf_setup(arch)
    prompts = random_prompts(NUM_PROMPTS, PROMPT_LEN, seed=10)
    reference = greedy_sequences(setup.target, prompts, NUM_NEW)[:, PROMPT_LEN:].tolist()
    plain = setup.engine(None, None)
    assert [plain.generate(p, NUM_NEW).token_ids for p in prompts] == reference
    for spec in (SpecConfig.chain(3), SpecConfig(3, 2, 6)):
        engine = setup.engine(setup.trained, spec)
        assert [engine.generate(p, NUM_NEW).token_ids for p in prompts] == reference, (arch, spec)
        assert engine.total.accept_length > 1.0, (
            arch,
            spec,
        )  # drafts are accepted: paths are committed


def _decode_logits(target, ids):
    """Logits of a prefill of 6, then per position a rejected 2-token chain and the real token."""
    target.setup_cache(1, 64)
    logits = [
        target(ids[:, :6], torch.arange(6)[None], torch.arange(6), causal_mask(0, 6, 6)).logits[0]
    ]
    for p in range(6, ids.shape[1]):
        target(
            torch.tensor([[5, 7]]),
            torch.tensor([[p, p + 1]]),
            torch.arange(p, p + 2),
            causal_mask(p, 2, p + 2),
        )
        logits.append(
            target(
                ids[:, p : p + 1], torch.tensor([[p]]), torch.tensor([p]), causal_mask(p, 1, p + 1)
            ).logits[0]
        )
    return torch.cat(logits)


@pytest.mark.parametrize("arch", CLASSES)
def test_causal_forwards_without_a_mask_equal_the_masked_ones(arch):
    """A causal host mask (prefill, decode, chain) goes to the model as None: its own masks from
    the cache (windows, chunks) equal `layer_masks`; a tree's mask is built."""
    target = hf_setup(arch).target
    ids = torch.tensor(random_prompts(1, 14, seed=6))
    positions = torch.tensor([[6, 7, 7]])
    assert target.model_masks(causal_mask(6, 3, 9), positions, 6) is None
    tree = causal_mask(6, 3, 9).clone()
    tree[..., 2, 7] = False  # node 2 is a sibling of node 1
    assert target.model_masks(tree, positions, 6) is not None
    mask_free = _decode_logits(target, ids)
    target.model_masks = target.layer_masks
    try:
        masked = _decode_logits(target, ids)
    finally:
        del target.model_masks
    assert (mask_free - masked).abs().max() < 1e-5, arch


CHAIN, TREE = SpecConfig.chain(2), SpecConfig(2, 2, 4)
# The classes whose forward deviates most from Llama's, one verification mode each past Gemma 2
# (each mode draws FC-10's 3 x 400 samples, one engine run each): soft-capped logits; MLA + MoE
# routing (speculative sampling against the drafter's probabilities); sliding layers and attention
# sinks in tree masks.
SAMPLED = {
    "gemma2-chain": ("gemma2", CHAIN),
    "gemma2-tree": ("gemma2", TREE),
    "deepseek_v3-chain": ("deepseek_v3", CHAIN),
    "gemma3-tree": ("gemma3", TREE),
    "gpt_oss-tree": ("gpt_oss", TREE),
}


@pytest.mark.parametrize(("arch", "spec"), list(SAMPLED.values()), ids=list(SAMPLED))
def test_sampling_follows_the_target(arch, spec):
    assert chi_square_pvalue(hf_setup(arch), spec, SamplingParams(1.0)) > PASS_P


def test_load_engine_uses_the_fast_path_where_it_applies(tmp_path):
    fast = load_engine(save_tiny_model("llama", tmp_path / "l"), None, None)
    assert fast.target_path == "fast" and fast.notes == []
    slow = load_engine(save_tiny_model("gemma3", tmp_path / "g"), None, None)
    assert slow.target_path == "transformers"
    assert slow.notes[0].startswith("target runs on the transformers (the model's own forward")
    assert "Gemma3ForCausalLM" in slow.notes[0]
    assert (
        slow.generate([1, 2, 3], 4).token_ids
        == greedy_sequences(slow.target, [[1, 2, 3]], 4)[0, 3:].tolist()
    )


def test_a_mask_as_wide_as_the_cache_is_accepted():
    """tune times verifies with masks of max_seq_len columns, as the compiled fast path takes them."""
    target = hf_setup("gemma2").target
    ids = torch.tensor(random_prompts(1, 10, seed=5))
    target.setup_cache(1, 64)
    narrow = target(ids, torch.arange(10)[None], torch.arange(10), causal_mask(0, 10, 10)).logits
    target.setup_cache(1, 64)
    wide = target(ids, torch.arange(10)[None], torch.arange(10), causal_mask(0, 10, 64)).logits
    assert torch.equal(narrow, wide)


class _PastKeyValuesLM(torch.nn.Module):
    def forward(self, input_ids, past_key_values=None, use_cache=None, **kwargs):
        raise NotImplementedError


class _CacheLM(torch.nn.Module):
    def forward(self, input_ids, cache=None, use_cache=None, **kwargs):
        raise NotImplementedError


class _NoCacheLM(torch.nn.Module):
    def forward(self, input_ids, **kwargs):
        raise NotImplementedError


def test_the_cache_goes_under_the_name_the_models_forward_takes():
    """transformers 5.24 names it `cache`, earlier 5.x `past_key_values` (where `cache=` would land in
    **kwargs, ignored: every verify then ran without the KV cache)."""
    assert cache_argument(_CacheLM()) == "cache"
    assert cache_argument(_PastKeyValuesLM()) == "past_key_values"
    with pytest.raises(ValueError, match="_NoCacheLM.forward takes no KV cache"):
        cache_argument(_NoCacheLM())


def test_a_forward_that_ignores_the_cache_is_an_error_not_a_cacheless_run():
    target = hf_setup("gemma2").target
    forward = target.target.causal_lm.forward
    target.target.causal_lm.forward = lambda *args, cache=None, past_key_values=None, **kwargs: (
        forward(*args, **kwargs)
    )
    try:
        target.setup_cache(1, 64)
        with pytest.raises(
            RuntimeError, match="wrote 0 cache slots, expected 6: its forward did not use the cache"
        ):
            target(
                torch.tensor(random_prompts(1, 6, seed=4)),
                torch.arange(6)[None],
                torch.arange(6),
                causal_mask(0, 6, 6),
            )
    finally:
        del target.target.causal_lm.forward
