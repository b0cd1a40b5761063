"""specdraft.engine.speculate end to end on tiny seeded Llama and Qwen3 targets.

T = 0 output equals the target's greedy output (chain and trees, untrained and briefly trained
drafters, 20 prompts each); the caches the engine leaves equal a fresh prefill's; limits are
refused before generation; EOS, stop strings and streaming; loading a saved drafter.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import transformers

from specdraft.checkpoint import Manifest, save_draft
from specdraft.draft import Eagle3Draft
from specdraft.draft_config import DraftConfig
from specdraft.engine.graphs import StaticInputs
from specdraft.engine.load import load_engine
from specdraft.engine.spec_config import SpecConfig
from specdraft.engine.speculate import SpeculativeEngine
from tests.support.engine_helpers import (
    AUX_LAYERS,
    MAX_SEQ,
    greedy_sequences,
    one_thread,  # noqa: F401
    random_prompts,
    target_pass,
    tiny_setup,
)

NUM_PROMPTS, PROMPT_LEN, NUM_NEW = 20, 8, 24
SPECS = {
    "chain3": SpecConfig.chain(3),
    "tree3x2": SpecConfig(3, 2, 6),
    "tree4x4": SpecConfig(4, 4, 16),
}


def _greedy_reference(setup, prompts):
    return greedy_sequences(setup.target, prompts, NUM_NEW)[:, PROMPT_LEN:].tolist()


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_greedy_output_equals_target_greedy(arch):
    """Every spec x drafter reproduces the target's greedy tokens; the trained drafter is
    accepted (> 0) and more often than the untrained one."""
    setup = tiny_setup(arch)
    prompts = random_prompts(NUM_PROMPTS, PROMPT_LEN, seed=10)
    reference = _greedy_reference(setup, prompts)
    for name, spec in SPECS.items():
        tau = {}
        for kind in ("untrained", "trained"):
            engine = setup.engine(getattr(setup, kind), spec)
            outputs = [engine.generate(p, NUM_NEW).token_ids for p in prompts]
            assert outputs == reference, (name, kind)
            tau[kind] = engine.total.accept_length
        assert tau["trained"] > 1.0 and tau["trained"] > tau["untrained"], (name, tau)


def test_greedy_output_equals_target_greedy_on_a_context_heavy_target():
    """A target whose next token depends on the whole context (weights std 0.4)."""
    setup = tiny_setup("llama", "chaotic")
    prompts = random_prompts(NUM_PROMPTS, PROMPT_LEN, seed=11)
    reference = _greedy_reference(setup, prompts)
    for spec in (SPECS["chain3"], SPECS["tree4x4"]):
        engine = setup.engine(setup.trained, spec)
        assert [engine.generate(p, NUM_NEW).token_ids for p in prompts] == reference


def test_plain_decoding_equals_transformers_greedy():
    setup = tiny_setup("llama")
    prompts = random_prompts(NUM_PROMPTS, PROMPT_LEN, seed=12)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        setup.target_dir, dtype=torch.float32
    ).eval()
    ids = torch.tensor(prompts)
    with torch.no_grad():
        for _ in range(NUM_NEW):
            ids = torch.cat([ids, model(ids).logits[:, -1].argmax(-1, keepdim=True)], 1)
    engine = setup.engine(None, None)
    results = [engine.generate(p, NUM_NEW) for p in prompts]
    assert [r.token_ids for r in results] == ids[:, PROMPT_LEN:].tolist()
    assert all(
        r.metrics.accept_length == 1.0 and r.metrics.num_drafted_tokens == 0 for r in results
    )
    assert all(
        r.metrics.time_draft_s == 0.0 and r.metrics.time_verify_s > 0 for r in results
    )  # no drafter


@torch.no_grad()
def test_caches_after_generation_equal_a_fresh_prefill():
    """Compaction of accepted tree paths and the drafter's shifted extend leave exactly the K/V
    a from-scratch pass over the same tokens computes (target and drafter)."""
    setup = tiny_setup("qwen3")
    engine = setup.engine(setup.trained, SPECS["tree4x4"])
    prompt = random_prompts(1, PROMPT_LEN, seed=13)[0]
    result = engine.generate(prompt, 40)
    assert result.metrics.accepted_per_position[1] > 0  # some depth-2 acceptances happened
    tokens = torch.tensor([prompt + result.token_ids])
    num_target = tokens.shape[1] - 1  # every output token but the last is in the target cache
    engine_k = [
        layer.attention.kv_cache.k_cache[:, :, :num_target].clone() for layer in setup.target.layers
    ]
    num_draft = engine.draft_cache.length
    draft_k = engine.draft_cache.k[:, :, :num_draft].clone()
    _, aux = target_pass(setup.target, tokens[:, :num_target])
    for layer, cached in zip(setup.target.layers, engine_k):
        torch.testing.assert_close(
            layer.attention.kv_cache.k_cache[:, :, :num_target], cached, rtol=1e-5, atol=1e-5
        )
    fresh = setup.trained(
        tokens[:, 1 : num_draft + 1],
        aux[:, :num_draft],
        torch.arange(num_draft)[None],
        first_step=True,
    )
    torch.testing.assert_close(fresh.kv.k, draft_k, rtol=1e-5, atol=1e-5)


def test_limits_are_refused_before_generation_with_numbers():
    setup = tiny_setup("llama")
    engine = setup.engine(setup.untrained, SPECS["tree4x4"])  # max_seq_len 128, max positions 256
    with pytest.raises(
        ValueError,
        match=r"prompt 100 \+ max_new_tokens 30 = 130 tokens exceeds the engine's "
        r"max_seq_len 128: ask for at most 28 "
        r"new tokens, or build the engine with max_seq_len >= 130$",
    ):
        engine.generate([1] * 100, 30)
    wide = SpeculativeEngine(setup.target, None, None, None, 256, "cpu")
    with pytest.raises(
        ValueError,
        match=r"= 300 tokens exceeds the target.s max_position_embeddings 256: ask for at most 56 "
        r"new tokens$",
    ):
        wide.generate([1] * 200, 100)
    cfg = dataclasses.replace(setup.untrained.cfg, max_position_embeddings=64)
    short = Eagle3Draft(cfg).eval()
    short.load_target_embedding(setup.target.tok_embeddings.weight)
    engine = setup.engine(short, SPECS["chain3"])
    with pytest.raises(
        ValueError, match="= 70 tokens exceeds the drafter's max_position_embeddings 64"
    ):
        engine.generate([1] * 50, 20)
    assert (
        len(engine.generate([1] * 40, 20).token_ids) == 20
    )  # the engine still serves valid requests
    with pytest.raises(ValueError, match="empty prompt"):
        engine.generate([], 5)


def test_every_length_error_applies_one_rule_and_advises_only_what_can_be_done():
    """A cache as long as the target's positions: the longest request is the positions, the
    advice's new-token count is accepted, and no max_seq_len past the positions is suggested."""
    setup = tiny_setup("llama")
    engine = SpeculativeEngine(setup.target, setup.untrained, SPECS["chain3"], None, 256, "cpu")
    assert engine.longest_request() == 256
    for max_new in (5000, 256):  # far past the positions, then by one token
        with pytest.raises(ValueError) as refused:
            engine.check_limits(1, max_new)
        assert str(refused.value).endswith(
            f"ask for at most {engine.longest_request() - 1} new tokens"
        )
    engine.check_limits(1, engine.longest_request() - 1)  # the advised request is accepted
    longest = engine.longest_request()
    for max_new in (
        20,
        longest + 5,
    ):  # a prompt past the limit on its own: shorten it (and the answer)
        with pytest.raises(ValueError) as refused:
            engine.check_limits(longest + 10, max_new)
        advice = (
            f"shorten the prompt to at most {longest - 20} tokens"
            if max_new == 20
            else f"shorten the prompt and ask for fewer new tokens (together at most {longest})"
        )
        assert str(refused.value).endswith(advice)
    engine.check_limits(longest - 20, 20)  # the advised prompt is accepted


class CharTokenizer:
    """decode(ids) = one letter per id (a-z, then A-Z ...)."""

    @staticmethod
    def decode(ids):
        return "".join(chr(ord("A") + i) for i in ids)


def test_eos_stop_strings_and_streaming():
    setup = tiny_setup("llama")
    prompt = random_prompts(1, PROMPT_LEN, seed=14)[0]
    reference = _greedy_reference(setup, [prompt])[0]
    engine = setup.engine(setup.trained, SPECS["tree3x2"], tokenizer=CharTokenizer())
    chunks = []
    full = engine.generate(prompt, NUM_NEW, on_tokens=chunks.append)
    assert (
        full.token_ids == reference
        and sum(chunks, []) == reference
        and full.finish_reason == "length"
    )
    eos = reference[6]
    cut = reference.index(eos) + 1
    result = engine.generate(prompt, NUM_NEW, eos_ids=(eos,))
    assert (result.token_ids, result.finish_reason) == (reference[:cut], "eos")
    stop = CharTokenizer.decode(reference[4:6])
    first = CharTokenizer.decode(reference).find(stop)
    result = engine.generate(prompt, NUM_NEW, stop=[stop])
    assert result.finish_reason == "stop" and result.text == CharTokenizer.decode(reference)[:first]
    assert result.token_ids == reference[: first + 2]
    plain = setup.engine(None, None)
    with pytest.raises(ValueError, match="stop strings need a tokenizer"):
        plain.generate(prompt, 4, stop=["x"])


class CountingTokenizer(CharTokenizer):
    """CharTokenizer recording how many ids each decode call gets."""

    def __init__(self):
        self.calls = []

    def decode(self, ids):
        self.calls.append(len(ids))
        return CharTokenizer.decode(ids)


def test_stop_strings_decode_only_the_outputs_tail():
    """Checking stop strings after each token decodes a window of the newest tokens, not the whole
    output (quadratic in long outputs); a stop string is still found where it ends."""
    setup = tiny_setup("llama")
    prompt = random_prompts(1, PROMPT_LEN, seed=14)[0]
    tokenizer = CountingTokenizer()
    engine = setup.engine(None, None, tokenizer=tokenizer)
    result = engine.generate(prompt, 100, stop=["\n\n"])  # ids decode to letters: never a newline
    assert result.finish_reason == "length" and len(result.token_ids) == 100
    window = 4 * 2 + 8
    # while generating: the window after 4 ids of context (CONTEXT_TOKENS); once at the end: the text
    assert max(tokenizer.calls[:-1]) == window + 4 and tokenizer.calls[-1] == 4 + 100
    reference = result.token_ids
    stop = CharTokenizer.decode(reference[70:73])
    first = CharTokenizer.decode(reference).find(stop)
    stopped = engine.generate(prompt, 100, stop=[stop])
    assert stopped.finish_reason == "stop" and stopped.token_ids == reference[: first + 3]


def _manifest(draft, setup, aux_layers):
    args = setup.target.args
    return Manifest(
        draft=draft.cfg.to_dict(),
        aux_layers=list(aux_layers),
        target={
            "hidden_size": args.hidden_size,
            "num_layers": args.num_layers,
            "vocab_size": args.vocab_size,
        },
    )


def test_load_engine_pairs_a_saved_drafter(tmp_path):
    setup = tiny_setup("llama")
    draft_dir = save_draft(
        setup.trained, tmp_path / "draft", manifest=_manifest(setup.trained, setup, AUX_LAYERS)
    )
    engine = load_engine(setup.target_dir, draft_dir, SPECS["chain3"], max_seq_len=MAX_SEQ)
    prompts = random_prompts(3, PROMPT_LEN, seed=15)
    assert [engine.generate(p, NUM_NEW).token_ids for p in prompts] == _greedy_reference(
        setup, prompts
    )
    assert engine.total.num_requests == 3 and engine.total.accept_length > 1.0
    bad = save_draft(
        setup.trained, tmp_path / "bad", manifest=_manifest(setup.trained, setup, (1, 2, 3))
    )
    with pytest.raises(
        ValueError, match=r"manifest aux_layers \[1, 2, 3\] != drafter config \[1, 2, 4\]"
    ):
        load_engine(setup.target_dir, bad, SPECS["chain3"], max_seq_len=MAX_SEQ)
    assert load_engine(setup.target_dir, None, None, max_seq_len=MAX_SEQ).draft is None


def test_a_drafter_for_another_target_is_refused():
    setup = tiny_setup("llama")
    width = dict(hidden_size=16, num_attention_heads=2, intermediate_size=32, vocab_size=80)
    other_target = dict(**width, num_hidden_layers=5, max_position_embeddings=256)
    cfg = DraftConfig.from_target(other_target, (1, 2, 3))
    other = Eagle3Draft(cfg)
    with pytest.raises(
        ValueError,
        match="target_hidden_size 16 != target hidden_size 32.*vocab_size 80 "
        "!= target vocab_size 64.*target_num_layers 5 != target num_layers"
        " 4.*embedding is not loaded",
    ):
        setup.engine(other, SPECS["chain3"])
    with pytest.raises(
        ValueError, match=r"aux layers \[1, 2, 3\] != the drafter's training layers"
    ):
        SpeculativeEngine(setup.target, setup.trained, SPECS["chain3"], (1, 2, 3), MAX_SEQ, "cpu")


def test_static_inputs_stage_host_values_into_their_own_bytes():
    """A graph's inputs share one buffer: each lands in its own aligned bytes (an odd-sized bool
    mask before an int64 input), host values through the host buffer and one staging copy."""
    inputs = StaticInputs(
        [(1, 3), (1, 1, 3, 5), (3,)],
        [torch.long, torch.bool, torch.long],
        torch.device("cpu"),
        on_host=(True, True, True),
    )
    mask = torch.rand(1, 1, 3, 5, generator=torch.Generator().manual_seed(0)) < 0.5
    inputs.fill((torch.tensor([[7, -2, 9]]), mask, torch.tensor([40, 41, 1 << 40])))
    assert inputs.tensors[0].tolist() == [[0, 0, 0]]  # on the device only once staged
    inputs.stage()
    assert inputs.tensors[0].tolist() == [[7, -2, 9]]
    assert torch.equal(inputs.tensors[1], mask)
    assert inputs.tensors[2].tolist() == [40, 41, 1 << 40]
    inputs.fill((torch.tensor([[1, 2, 3]]), ~mask, torch.tensor([5, 6, 7])))  # refilled in place
    inputs.stage()
    assert inputs.tensors[0].tolist() == [[1, 2, 3]] and torch.equal(inputs.tensors[1], ~mask)
    with pytest.raises(ValueError, match=r"shape \(1, 1\), captured for \(1, 3\)"):
        inputs.fill((torch.tensor([[1]]), mask, torch.tensor([5, 6, 7])))  # would broadcast


def test_static_inputs_do_not_copy_a_device_value_written_in_place():
    """A device input passed as its own static tensor (the engine's drafted tokens, written there
    by the drafter: `GraphedTarget.device_input_ids`) costs no copy; any other tensor is copied."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class CountCopies(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.copies = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.copies += func is torch.ops.aten.copy_.default
            return func(*args, **(kwargs or {}))

    inputs = StaticInputs(
        [(1, 3), (3,)], [torch.long, torch.long], torch.device("cpu"), on_host=(False, False)
    )
    inputs.tensors[0].copy_(torch.tensor([[4, 5, 6]]))
    with CountCopies() as mode:
        inputs.fill(
            (inputs.tensors[0][0][None], torch.tensor([1, 2, 3]))
        )  # a view of the same bytes
    assert (
        mode.copies == 1
        and inputs.tensors[0].tolist() == [[4, 5, 6]]
        and inputs.tensors[1].tolist() == [1, 2, 3]
    )
    with CountCopies() as mode:
        inputs.fill((torch.tensor([[7, 8, 9]]), inputs.tensors[1]))
    assert mode.copies == 1 and inputs.tensors[0].tolist() == [[7, 8, 9]]


def test_static_inputs_stage_only_the_host_values():
    """Host inputs come first in the buffer and the staging copy covers just them: it must not
    overwrite an input given on the device (copied to its place before the graph's staging)."""
    inputs = StaticInputs(
        [(1, 3), (1, 1, 3, 5), (3,)],
        [torch.long, torch.bool, torch.long],
        torch.device("cpu"),
        on_host=(False, True, False),
    )
    assert inputs.host_bytes == 16  # the 15-byte mask, 8-byte aligned
    assert inputs.tensors[1].data_ptr() == inputs.device_buffer.data_ptr()
    inputs.tensors[0].copy_(torch.tensor([[4, 5, 6]]))  # as fill does for a device input
    inputs.host_tensors[1].fill_(True)
    inputs.stage()
    assert inputs.tensors[0].tolist() == [[4, 5, 6]] and bool(inputs.tensors[1].all())
    with pytest.raises(
        ValueError, match="graph input on meta, captured for one on cpu"
    ):  # meta: another device
        inputs.fill(
            (
                torch.ones(1, 3, dtype=torch.long, device="meta"),
                torch.ones(1, 1, 3, 5, dtype=torch.bool),
                torch.tensor([5, 6, 7]),
            )
        )
    with pytest.raises(ValueError, match="graph input on meta, captured for one on the CPU"):
        inputs.fill(
            (
                torch.tensor([[1, 2, 3]]),
                torch.ones(1, 1, 3, 5, dtype=torch.bool, device="meta"),
                torch.tensor([5, 6, 7]),
            )
        )
