"""specdraft.engine.fast_model against transformers: prefill, decode, aux states, tree verify,
cache compaction, strict loading and refusals, on tiny seeded float32 models (and pycode-25m)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

from specdraft.engine.fast_config import ModelArgs
from specdraft.engine.fast_load import load_fast_target
from specdraft.engine.fast_model import FastTarget, causal_mask
from tests.support.paths import PYCODE
from tests.support.tiny_models import save_tiny_model, tiny_config, tiny_model

NUM_LAYERS = 4
MAX_SEQ = 32
TOL = 1e-5

# case -> (arch, tiny_config overrides); together: tied and untied heads, GQA, qkv bias,
# qk-norm with head_dim != hidden/heads, and the three rope types.
CASES = {
    "llama-tied": ("llama", dict(tie_word_embeddings=True)),
    "llama-llama3rope": (
        "llama",
        dict(
            rope_parameters=dict(
                rope_type="llama3",
                rope_theta=10000.0,
                factor=8.0,
                low_freq_factor=1.0,
                high_freq_factor=4.0,
                original_max_position_embeddings=64,
            )
        ),
    ),
    "qwen2-bias": ("qwen2", dict()),
    "qwen3-qknorm-tied": (
        "qwen3",
        dict(
            tie_word_embeddings=True,
            head_dim=16,
            num_attention_heads=4,
            num_key_value_heads=2,
            rope_parameters=dict(rope_type="linear", rope_theta=10000.0, factor=2.0),
        ),
    ),
    "mistral": ("mistral", dict()),
}


def _perturbed_model(arch: str, seed: int, **overrides) -> transformers.PreTrainedModel:
    """tiny_model with its zero biases and unit norms perturbed too, so every tensor matters."""
    model = tiny_model(arch, seed=seed, num_layers=NUM_LAYERS, **overrides)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=gen) * 0.1)
    return model


@pytest.fixture(scope="module", params=list(CASES))
def pair(request, tmp_path_factory) -> tuple[transformers.PreTrainedModel, FastTarget]:
    arch, overrides = CASES[request.param]
    hf = _perturbed_model(arch, seed=len(request.param), **overrides)
    path = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(path, max_shard_size="20KB" if request.param == "llama-tied" else "1GB")
    return hf, load_fast_target(path)


def _ids(batch: int, length: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 128, (batch, length), generator=torch.Generator().manual_seed(seed))


def _prefill(fast: FastTarget, ids: torch.Tensor, aux_layers: tuple[int, ...] = ()):
    batch, length = ids.shape
    fast.setup_cache(batch, MAX_SEQ)
    positions = torch.arange(length).expand(batch, length)
    return fast(
        ids, positions, torch.arange(length), causal_mask(0, length, MAX_SEQ, batch), aux_layers
    )


def _hf_last_logits(hf, ids: torch.Tensor) -> torch.Tensor:
    return hf(ids).logits[:, -1]


@torch.no_grad()
def test_prefill_logits_match_transformers(pair):
    hf, fast = pair
    ids = _ids(2, 12)
    out = _prefill(fast, ids)
    assert out.logits.dtype == torch.float32 and out.logits.shape == (2, 12, 128)
    assert out.aux_hidden is None
    assert (out.logits - hf(ids).logits).abs().max() < TOL


@torch.no_grad()
def test_decode_token_by_token_matches_full_forward(pair):
    hf, fast = pair
    ids = _ids(2, 12, seed=1)
    expected = hf(ids).logits
    out = _prefill(fast, ids[:, :5])
    steps = [out.logits]
    for t in range(5, 12):
        positions = torch.full((2, 1), t)
        step = fast(ids[:, t : t + 1], positions, torch.tensor([t]), causal_mask(t, 1, MAX_SEQ, 2))
        steps.append(step.logits)
    assert (torch.cat(steps, dim=1) - expected).abs().max() < TOL


@torch.no_grad()
def test_a_mask_over_the_slots_in_use_matches_a_full_width_one(pair):
    """The forward attends over the slots the mask's width covers: width = the slots written so
    far gives the full-width (max_seq_len) result."""
    hf, fast = pair
    ids = _ids(2, 12, seed=8)
    _prefill(fast, ids[:, :9])
    step = (ids[:, 9:], torch.arange(9, 12).expand(2, 3), torch.arange(9, 12))
    full = fast(*step, causal_mask(9, 3, MAX_SEQ, 2)).logits
    narrow = fast(*step, causal_mask(9, 3, 12, 2)).logits
    torch.testing.assert_close(narrow, full, rtol=1e-6, atol=1e-6)
    assert (narrow[:, -1] - hf(ids).logits[:, -1]).abs().max() < TOL


@torch.no_grad()
def test_aux_hidden_matches_transformers_streams(pair):
    hf, fast = pair
    ids = _ids(2, 10, seed=2)
    captured = []
    hook = hf.model.layers[-1].register_forward_hook(
        lambda module, args, output: captured.append(
            output[0] if isinstance(output, tuple) else output
        )
    )
    hidden_states = hf(ids, output_hidden_states=True).hidden_states
    hook.remove()
    hidden = hf.config.hidden_size
    aux = _prefill(fast, ids, aux_layers=(0, 1, NUM_LAYERS)).aux_hidden
    assert aux.shape == (2, 10, 3 * hidden)
    for i, reference in enumerate((hidden_states[0], hidden_states[1], captured[0])):
        assert (aux[..., i * hidden : (i + 1) * hidden] - reference).abs().max() < TOL
    reordered = _prefill(fast, ids, aux_layers=(NUM_LAYERS, 0)).aux_hidden
    assert torch.equal(reordered, torch.cat([aux[..., 2 * hidden :], aux[..., :hidden]], dim=-1))


# A 4-node draft tree after a 6-token prompt: node 0 is the root, nodes 1 and 2 its children
# (branching), node 3 a child of node 1. Positions are prompt length + depth, slots sequential.
PROMPT_LEN = 6
PARENTS = (-1, 0, 0, 1)
DEPTHS = (0, 1, 1, 2)


def _path(node: int) -> list[int]:
    return ([] if PARENTS[node] < 0 else _path(PARENTS[node])) + [node]


def _tree_mask(batch: int) -> torch.Tensor:
    mask = torch.zeros(len(PARENTS), MAX_SEQ, dtype=torch.bool)
    mask[:, :PROMPT_LEN] = True
    for node in range(len(PARENTS)):
        mask[node, [PROMPT_LEN + i for i in _path(node)]] = True
    return mask.expand(batch, 1, len(PARENTS), MAX_SEQ)


def _verify_tree(fast: FastTarget, prompt: torch.Tensor, nodes: torch.Tensor) -> torch.Tensor:
    _prefill(fast, prompt)
    batch = prompt.shape[0]
    positions = (PROMPT_LEN + torch.tensor(DEPTHS)).expand(batch, -1)
    slots = PROMPT_LEN + torch.arange(len(PARENTS))
    return fast(nodes, positions, slots, _tree_mask(batch)).logits


@torch.no_grad()
def test_tree_verify_matches_causal_forward_on_each_path(pair):
    hf, fast = pair
    prompt, nodes = _ids(2, PROMPT_LEN, seed=3), _ids(2, len(PARENTS), seed=4)
    logits = _verify_tree(fast, prompt, nodes)
    for node in range(len(PARENTS)):
        path_ids = torch.cat([prompt, nodes[:, _path(node)]], dim=1)
        assert (logits[:, node] - _hf_last_logits(hf, path_ids)).abs().max() < TOL


@torch.no_grad()
def test_compact_cache_then_decode_matches_fresh_forward(pair):
    hf, fast = pair
    prompt, nodes = _ids(2, PROMPT_LEN, seed=5), _ids(2, len(PARENTS), seed=6)
    _verify_tree(fast, prompt, nodes)
    accepted = _path(3)  # nodes 0, 1, 3 at slots 6, 7, 9 -> slots 6, 7, 8
    fast.compact_cache(PROMPT_LEN + torch.tensor(accepted), dst_start=PROMPT_LEN)
    length = PROMPT_LEN + len(accepted)
    next_ids = _ids(2, 1, seed=7)
    step = fast(
        next_ids,
        torch.full((2, 1), length),
        torch.tensor([length]),
        causal_mask(length, 1, MAX_SEQ, 2),
    )
    expected = _hf_last_logits(hf, torch.cat([prompt, nodes[:, accepted], next_ids], dim=1))
    assert (step.logits[:, 0] - expected).abs().max() < TOL


@torch.no_grad()
def test_compact_cache_moves_every_layers_and_rows_slots_and_nothing_else():
    """One gather over the stacked cache: for each layer, K and V, batch row and kv head, slots
    src land at dst_start.. in order (src overlapping the destination), other slots keep
    their values, and the layers' caches are views of the stack the forward writes."""
    # 32 wide, 3 layers, 4 heads over 2 K/V heads of 8, MLP 48, 64 ids, 64 positions
    args = ModelArgs("llama", 32, 3, 4, 2, 8, 48, 64, max_position_embeddings=64)
    fast = FastTarget(args)
    fast.setup_cache(2, 16)
    fast.kv_stack.copy_(
        torch.randn(fast.kv_stack.shape, generator=torch.Generator().manual_seed(0))
    )
    before = [
        (layer.attention.kv_cache.k_cache.clone(), layer.attention.kv_cache.v_cache.clone())
        for layer in fast.layers
    ]
    src, dst_start = torch.tensor([5, 7, 8, 11]), 6  # slot 7 is read and written, 8 too
    fast.compact_cache(src, dst_start)
    moved = list(range(dst_start, dst_start + src.numel()))
    kept = [s for s in range(16) if s not in moved]
    for layer, (k, v) in zip(fast.layers, before):
        cache = layer.attention.kv_cache
        for new, old in ((cache.k_cache, k), (cache.v_cache, v)):
            assert torch.equal(new[:, :, moved], old[:, :, src]) and torch.equal(
                new[:, :, kept], old[:, :, kept]
            )
    with pytest.raises(ValueError, match="exceed max_seq_len 16"):
        fast.compact_cache(src, 13)


def test_tied_head_shares_the_embedding(pair):
    hf, fast = pair
    assert (fast.output.weight is fast.tok_embeddings.weight) == hf.config.tie_word_embeddings


def test_causal_mask_rows():
    mask = causal_mask(torch.tensor(2), 3, 6, batch_size=2)
    assert mask.shape == (2, 1, 3, 6) and mask.dtype == torch.bool
    assert mask[1, 0].int().tolist() == [[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 0]]


def test_rope_read_from_old_and_new_config_layouts():
    old = tiny_config("llama").to_dict() | {
        "rope_theta": 500000.0,
        "rope_scaling": {"type": "linear", "factor": 4.0},
    }
    old.pop("rope_parameters")
    args = ModelArgs.from_hf_config(old)
    assert (args.rope_type, args.rope_theta, args.rope_factor) == ("linear", 500000.0, 4.0)
    new = tiny_config(
        "llama", rope_parameters={"rope_type": "default", "rope_theta": 1234.0}
    ).to_dict()
    assert ModelArgs.from_hf_config(new).rope_theta == 1234.0
    qwen2 = ModelArgs.from_hf_config(tiny_config("qwen2").to_dict())
    assert (qwen2.qkv_bias, qwen2.o_bias, qwen2.qk_norm) == (True, False, False)


@pytest.mark.parametrize(
    "arch, name",
    [
        ("deepseek_v3", "DeepseekV3ForCausalLM"),
        ("llava", "LlavaForConditionalGeneration"),
        ("llama", "LlamaForCausalLMEagle3"),
    ],
)
def test_other_architectures_are_refused(arch, name):
    config = tiny_config(arch).to_dict() | {"architectures": [name]}
    message = (
        f"specdraft's engine serves Llama/Qwen2/Qwen3/Mistral targets; {name} targets are "
        "captured and trained with specdraft and served by SGLang/vLLM"
    )
    with pytest.raises(ValueError, match=message):
        ModelArgs.from_hf_config(config)


def test_unsupported_rope_and_missing_keys_are_refused():
    yarn = {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}
    with pytest.raises(ValueError, match="rope type 'yarn' is not implemented"):
        ModelArgs.from_hf_config(tiny_config("llama", rope_parameters=yarn).to_dict())
    config = tiny_config("qwen3").to_dict()
    del config["intermediate_size"]
    with pytest.raises(ValueError, match="qwen3 config: missing key 'intermediate_size'"):
        ModelArgs.from_hf_config(config)


def test_sliding_window_shorter_than_max_seq_is_refused():
    fast = FastTarget(ModelArgs.from_hf_config(tiny_config("mistral", sliding_window=16).to_dict()))
    fast.setup_cache(1, 16)
    with pytest.raises(ValueError, match="sliding window 16 < max_seq_len 32.*full attention only"):
        fast.setup_cache(1, 32)
    qwen2 = tiny_config(
        "qwen2", use_sliding_window=True, sliding_window=8, max_window_layers=2
    ).to_dict()
    assert ModelArgs.from_hf_config(qwen2).sliding_window == 8


def test_forward_before_setup_cache_and_bad_aux_layers_raise():
    fast = FastTarget(ModelArgs.from_hf_config(tiny_config("llama", num_layers=2).to_dict()))
    ids, positions, slots, mask = (
        _ids(1, 3),
        torch.arange(3)[None],
        torch.arange(3),
        causal_mask(0, 3, 8),
    )
    with pytest.raises(RuntimeError, match="before setup_cache"):
        fast(ids, positions, slots, mask)
    fast.setup_cache(1, 8)
    with pytest.raises(ValueError, match=r"aux_layers \[3\]: each must be in 0..2"):
        fast(ids, positions, slots, mask, aux_layers=(3,))


def _rewrite_checkpoint(path: Path, edit) -> None:
    tensors = load_file(path / "model.safetensors")
    edit(tensors)
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})


def test_strict_load_names_extra_and_missing_tensors(tmp_path):
    path = save_tiny_model("llama", tmp_path / "m", num_layers=2)

    def edit(tensors):
        tensors["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(4)
        del tensors["model.layers.1.mlp.up_proj.weight"]

    _rewrite_checkpoint(path, edit)
    with pytest.raises(ValueError) as error:
        load_fast_target(path)
    extra = "model.layers.0.self_attn.rotary_emb.inv_freq (model.safetensors)"
    assert f"match no parameter: {extra}" in str(error.value)
    assert "no tensor fills: model.layers.1.mlp.up_proj.weight" in str(error.value)


def test_strict_load_refuses_wrong_shape_and_untied_head_of_tied_config(tmp_path):
    path = save_tiny_model("llama", tmp_path / "m", num_layers=2)
    _rewrite_checkpoint(path, lambda t: t.update({"model.norm.weight": torch.ones(31)}))
    with pytest.raises(
        ValueError, match=r"model.norm.weight has shape \[31\], the config implies \[32\]"
    ):
        load_fast_target(path)
    tied = save_tiny_model("llama", tmp_path / "t", num_layers=2, tie_word_embeddings=True)
    _rewrite_checkpoint(tied, lambda t: t.update({"lm_head.weight": torch.zeros(128, 32)}))
    with pytest.raises(ValueError, match="lm_head.weight differs from model.embed_tokens.weight"):
        load_fast_target(tied)
    with pytest.raises(FileNotFoundError, match="config.json: not found"):
        load_fast_target(tmp_path)


@torch.no_grad()
def test_pycode_25m_logits_match_transformers():
    if not PYCODE.is_dir():
        pytest.skip(
            f"{PYCODE} is absent: the real-model parity check needs the pycode-25m checkpoint"
        )
    hf = transformers.LlamaForCausalLM.from_pretrained(PYCODE, dtype=torch.float32).eval()
    fast = load_fast_target(PYCODE, dtype=torch.float32)
    ids = torch.randint(
        0, hf.config.vocab_size, (1, 32), generator=torch.Generator().manual_seed(0)
    )
    fast.setup_cache(1, 32)
    out = fast(ids, torch.arange(32)[None], torch.arange(32), causal_mask(0, 32, 32))
    assert (out.logits - hf(ids).logits).abs().max() < 1e-4
