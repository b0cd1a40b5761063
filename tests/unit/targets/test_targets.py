"""specdraft.targets: hook capture vs transformers' hidden_states, loading, config hash.

What transformers 5 (checked on 5.24) returns, for every architecture tested here:
- `hidden_states[0]` is the input of decoder layer 1 (it is recorded by a hook on that layer),
  which for these models equals `embed_tokens(input_ids)` (none of them scales embeddings).
- `hidden_states[k]`, 1 <= k < L, is the output of decoder layer k.
- `hidden_states[L]` is `last_hidden_state`, i.e. *after* the final norm (capture_outputs'
  `tie_last_hidden_states=True`), so it differs from specdraft index L (before the norm).
"""

from __future__ import annotations

import pytest
import torch
import transformers

import specdraft.targets as target_module
from specdraft.conventions import ConventionError
from specdraft.errors import SpecdraftError
from specdraft.targets import Target, TargetOutput, load_target
from specdraft.targets.config import TargetConfigError, TargetFileMissing, config_hash
from tests.support.tiny_models import ARCHITECTURES, save_tiny_model, tiny_config, tiny_model

NUM_LAYERS = 4
EXPECTED_TARGET_CLASS = {
    "llama": "llama",
    "qwen2": "qwen",
    "qwen3": "qwen",
    "mistral": "llama",
    "deepseek_v2": "deepseek",
    "deepseek_v3": "deepseek",
    "llava": "llava",  # SGLang 0.5.23 llava.py has no EAGLE-3 capture; vLLM's delegates to Llama
}


@pytest.fixture(scope="module", params=ARCHITECTURES)
def arch_target(request) -> tuple[str, Target]:
    return request.param, load_target(tiny_config(request.param, num_layers=NUM_LAYERS))


@pytest.fixture(scope="module")
def llama_target() -> Target:
    return load_target(tiny_config("llama", num_layers=NUM_LAYERS))


def _inputs(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(0, 127, (2, 9), generator=generator)  # 127 = llava's image token
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, :3] = 0  # left padding on the second row
    return input_ids, attention_mask


def _reference(target: Target, input_ids, attention_mask):
    with torch.inference_mode():
        return target.model(
            input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True
        )


def _last_layer_output(target: Target, input_ids, attention_mask) -> torch.Tensor:
    """The last decoder layer's output, recorded independently of specdraft's hooks."""
    seen = []
    hook = target.model.get_submodule(_layers_path(target))[-1].register_forward_hook(
        lambda module, args, output: seen.append(output[0] if isinstance(output, tuple) else output)
    )
    try:
        _reference(target, input_ids, attention_mask)
    finally:
        hook.remove()
    (output,) = seen
    return output


def _layers_path(target: Target) -> str:
    if target.architecture == "LlavaForConditionalGeneration":
        return "model.language_model.layers"
    return "model.layers"


def _split(aux_hidden: torch.Tensor, hidden_size: int) -> list[torch.Tensor]:
    return list(aux_hidden.split(hidden_size, dim=-1))


def test_hooks_equal_output_hidden_states(arch_target):
    arch, target = arch_target
    input_ids, attention_mask = _inputs()
    L, H = target.num_layers, target.hidden_size
    out = target.forward(input_ids, attention_mask, aux_layers=list(range(L + 1)))
    reference = _reference(target, input_ids, attention_mask)
    assert len(reference.hidden_states) == L + 1
    states = _split(out.aux_hidden, H)
    for k in range(L):
        assert torch.equal(states[k], reference.hidden_states[k]), (arch, k)
    assert torch.equal(states[0], target.embed_tokens(input_ids)), "no embedding scaling here"
    # index L: the last layer's output before the norm; transformers' hidden_states[L] is after it
    assert torch.equal(states[L], out.last_hidden)
    assert torch.equal(out.last_hidden, _last_layer_output(target, input_ids, attention_mask))
    assert not torch.equal(out.last_hidden, reference.hidden_states[L])
    with torch.inference_mode():
        assert torch.equal(target.final_norm(out.last_hidden), reference.hidden_states[L])
        assert torch.equal(target.lm_head(target.final_norm(out.last_hidden)), out.logits)
    assert torch.equal(out.logits, reference.logits)


def test_outputs_shapes_and_dtypes(arch_target):
    arch, target = arch_target
    input_ids, attention_mask = _inputs()
    out = target.forward(input_ids, attention_mask, aux_layers=[1, 2, 3])
    assert isinstance(out, TargetOutput)
    assert out.logits.shape == (2, 9, target.vocab_size) and out.logits.dtype == torch.float32
    assert out.aux_hidden.shape == (2, 9, 3 * target.hidden_size)
    assert out.last_hidden.shape == (2, 9, target.hidden_size)


def test_aux_order_follows_request(arch_target):
    arch, target = arch_target
    input_ids, attention_mask = _inputs(1)
    reference = _reference(target, input_ids, attention_mask)
    out = target.forward(input_ids, attention_mask, aux_layers=[3, 1, 2])
    expected = torch.cat([reference.hidden_states[k] for k in (3, 1, 2)], dim=-1)
    assert torch.equal(out.aux_hidden, expected)


def test_properties(arch_target):
    arch, target = arch_target
    model = target.model
    assert target.num_layers == NUM_LAYERS
    assert target.hidden_size == 32 and target.vocab_size == 128
    assert target.architecture == type(model).__name__
    assert target.target_class == EXPECTED_TARGET_CLASS[arch]
    assert target.config is model.config.get_text_config()
    assert target.embed_tokens is model.get_input_embeddings()
    assert target.lm_head is model.get_output_embeddings()
    assert isinstance(target.final_norm, torch.nn.Module)
    assert target.layers is target.text_model.layers and len(target.layers) == NUM_LAYERS
    # plain attributes set once by __init__, not a block of one-line property accessors
    assert {
        "config",
        "causal_lm",
        "text_model",
        "embed_tokens",
        "layers",
        "final_norm",
        "lm_head",
        "num_layers",
        "hidden_size",
        "vocab_size",
        "architecture",
    } <= set(vars(target))


def test_return_logits_false_skips_head_same_states(arch_target):
    arch, target = arch_target
    input_ids, attention_mask = _inputs(2)
    with_head = target.forward(input_ids, attention_mask, aux_layers=[0, 2, NUM_LAYERS])
    calls = []
    hook = target.lm_head.register_forward_hook(lambda *a: calls.append(1))
    try:
        without = target.forward(
            input_ids, attention_mask, aux_layers=[0, 2, NUM_LAYERS], return_logits=False
        )
    finally:
        hook.remove()
    assert without.logits is None and calls == []
    assert torch.equal(without.aux_hidden, with_head.aux_hidden)
    assert torch.equal(without.last_hidden, with_head.last_hidden)


def test_index_zero_is_what_layer_one_receives(llama_target):
    """A model that rescales its embeddings: index 0 must be the scaled input of layer 1."""
    input_ids, _ = _inputs()
    hook = llama_target.embed_tokens.register_forward_hook(lambda module, args, out: out * 3.0)
    try:
        out = llama_target.forward(input_ids, aux_layers=[0])
        reference = _reference(llama_target, input_ids, None)
    finally:
        hook.remove()
    with torch.inference_mode():
        scaled = llama_target.embed_tokens(input_ids) * 3.0
    assert torch.equal(out.aux_hidden, scaled)
    assert torch.equal(out.aux_hidden, reference.hidden_states[0])


def test_only_requested_states_are_kept(llama_target, monkeypatch):
    recorders = []

    class SpyRecorder(target_module._Recorder):
        def __init__(self):
            super().__init__()
            recorders.append(self)

    monkeypatch.setattr(target_module, "_Recorder", SpyRecorder)
    model_kwargs = []
    spy = llama_target.model.register_forward_pre_hook(
        lambda module, args, kwargs: model_kwargs.append(dict(kwargs)), with_kwargs=True
    )
    try:
        llama_target.forward(_inputs()[0], aux_layers=[2])
    finally:
        spy.remove()
    (recorder,) = recorders
    assert sorted(recorder.states) == [2, NUM_LAYERS]  # requested + last (for last_hidden)
    assert model_kwargs[0]["output_hidden_states"] is False


def test_hooks_removed_after_forward_and_on_error(llama_target):
    layers = llama_target.model.model.layers

    def installed():  # transformers' own output-capturing hooks stay; ours must not
        return [(list(layer._forward_hooks), list(layer._forward_pre_hooks)) for layer in layers]

    before = installed()
    llama_target.forward(_inputs()[0], aux_layers=[0, 1, 2])
    assert installed() == before
    bad_ids = torch.full((1, 3), 10_000)  # out of vocabulary: the embedding raises
    with pytest.raises(IndexError):
        llama_target.forward(bad_ids, aux_layers=[0, 1, 2])
    assert installed() == before


@pytest.mark.parametrize("aux_layers", [[-1], [NUM_LAYERS + 1], [1, 1], [True], [1.0]])
def test_bad_aux_layers_raise(llama_target, aux_layers):
    with pytest.raises(ConventionError, match="aux layer"):  # a SpecdraftError and ValueError
        llama_target.forward(_inputs()[0], aux_layers=aux_layers)


def test_empty_aux_layers(llama_target):
    out = llama_target.forward(_inputs()[0], aux_layers=[])
    assert out.aux_hidden.shape == (2, 9, 0)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_load_from_directory_matches_config(arch, tmp_path):
    config = tiny_config(arch, num_layers=NUM_LAYERS)
    from_config = load_target(config, seed=3)
    reference = tiny_model(arch, seed=3, num_layers=NUM_LAYERS)  # same seed -> same weights
    expected = reference.state_dict()
    for name, tensor in from_config.model.state_dict().items():
        assert torch.equal(tensor, expected[name]), name
    from_dir = load_target(save_tiny_model(arch, tmp_path / arch, seed=3, num_layers=NUM_LAYERS))
    assert from_dir.architecture == from_config.architecture
    input_ids, attention_mask = _inputs()
    a = from_config.forward(input_ids, attention_mask, aux_layers=[1, 0, 3])
    b = from_dir.forward(input_ids, attention_mask, aux_layers=[1, 0, 3])
    for name in ("logits", "aux_hidden", "last_hidden"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    assert config_hash(from_dir.model.config) == config_hash(config)


def test_seed_changes_weights():
    a = load_target(tiny_config("qwen3"), seed=0).lm_head.weight
    b = load_target(tiny_config("qwen3"), seed=1).lm_head.weight
    assert not torch.equal(a, b)


def test_bfloat16_target():
    target = load_target(tiny_config("llama"), dtype=torch.bfloat16)
    out = target.forward(_inputs()[0], aux_layers=[1, 2])
    assert out.aux_hidden.dtype == torch.bfloat16 and out.last_hidden.dtype == torch.bfloat16
    assert out.logits.dtype == torch.float32


def test_tiny_deepseek_has_mla_and_moe():
    model = tiny_model("deepseek_v3")
    layers = model.model.layers
    assert not hasattr(layers[0].mlp, "experts") and hasattr(layers[1].mlp, "experts")
    assert model.config.kv_lora_rank == 16 and model.config.q_lora_rank == 16


def _tiny_gpt2_config() -> transformers.GPT2Config:
    return transformers.GPT2Config(n_layer=2, n_embd=16, n_head=2, vocab_size=64, n_positions=32)


def test_unknown_architecture_raises(tmp_path):
    with pytest.raises(ValueError, match="unsupported target class.*gpt2"):
        load_target(_tiny_gpt2_config())
    with pytest.raises(ValueError, match="GPT2LMHeadModel"):
        Target(transformers.GPT2LMHeadModel(_tiny_gpt2_config()))
    transformers.GPT2LMHeadModel(_tiny_gpt2_config()).save_pretrained(tmp_path / "gpt2")
    with pytest.raises(ValueError, match="GPT2LMHeadModel"):
        load_target(tmp_path / "gpt2")
    config = tiny_config("llama")
    config.architectures = ["LlamaForSequenceClassification"]
    with pytest.raises(ValueError, match="LlamaForSequenceClassification"):
        load_target(config)


def test_loading_draws_no_progress_bar_and_restores_the_setting(tmp_path, capfd):
    path = save_tiny_model("llama", tmp_path / "m", num_layers=2)
    hf_logging = transformers.utils.logging
    verbosity = hf_logging.get_verbosity()
    assert hf_logging.is_progress_bar_enabled()
    capfd.readouterr()
    load_target(path)
    captured = capfd.readouterr()
    assert "Loading weights" not in captured.err + captured.out and "it/s" not in captured.err
    assert (
        hf_logging.is_progress_bar_enabled() and hf_logging.get_verbosity() == verbosity
    )  # warnings stay
    hf_logging.disable_progress_bar()  # a user's own choice is kept too
    try:
        load_target(path)
        assert not hf_logging.is_progress_bar_enabled()
    finally:
        hf_logging.enable_progress_bar()


def test_missing_directory_raises(tmp_path):
    with pytest.raises(TargetFileMissing, match="config.json") as caught:
        load_target(tmp_path)
    assert isinstance(caught.value, FileNotFoundError) and isinstance(caught.value, SpecdraftError)


def test_load_is_strict(tmp_path):
    path = save_tiny_model("llama", tmp_path / "m", num_layers=2)
    config = transformers.AutoConfig.from_pretrained(path)
    config.num_hidden_layers = 3  # the checkpoint lacks layer 3's weights
    config.save_pretrained(path)
    with pytest.raises(TargetConfigError, match="missing_keys.*layers.2"):
        load_target(path)


def test_config_hash():
    base = config_hash(tiny_config("llama"))
    assert len(base) == 64
    assert config_hash(tiny_config("llama")) == base
    assert config_hash(tiny_config("llama", rms_norm_eps=1e-5)) != base
    assert config_hash(tiny_config("llava")) == base  # only the text config counts
    volatile = tiny_config("llama")
    volatile.architectures = ["LlamaForCausalLM"]
    volatile.use_cache = False
    assert config_hash(volatile) == base
