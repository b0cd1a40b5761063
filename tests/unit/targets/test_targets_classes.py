"""specdraft.targets on every further decoder class of issue #22 (transformers 5.24): hook capture
against the model's own `output_hidden_states`, index L before the final norm, the head a store
records reproducing the model's logits, and the per-class deviations (Gemma's scaled embeddings
and (1 + w) norm, Gemma 2's logit soft-capping, Llama 4's decoder under `model`, Qwen3-VL's
M-RoPE on text positions).

One module-scoped model per class (construction is the cost)."""

from __future__ import annotations

import pytest
import torch

from specdraft.capture.forward import target_head_tensors
from specdraft.draft import rope_cos_sin
from specdraft.draft_config import rope_from_hf_config
from specdraft.draft_rope import rope_inv_freq
from specdraft.targets import Target, load_target
from specdraft.train.loss import target_logits
from tests.support.tiny_models import MORE_ARCHITECTURES, NEWER_ARCHITECTURES, tiny_config

NUM_LAYERS = 4
EXPECTED_TARGET_CLASS = {
    "qwen3_moe": "qwen3_moe",
    "gpt_oss": "gpt_oss",
    "gemma2": "gemma2",
    "gemma3": "gemma3",
    "llama4": "llama4",
    "phi3": "llama",
    "qwen2_vl": "qwen2_vl",
    "qwen3_vl": "qwen3_vl",
    "qwen3_vl_moe": "qwen3_vl",
    "mistral3": "llava",
    "kimi_k25": "deepseek",
    "llama4_mm": "llama4",
    "qwen3_5": "qwen3_5",
    "gemma4": "gemma4",
}
SCALED_EMBEDDINGS = {"gemma2", "gemma3", "gemma4"}  # embeddings times sqrt(H) before layer 1


@pytest.fixture(scope="module", params=MORE_ARCHITECTURES + NEWER_ARCHITECTURES)
def arch_target(request) -> tuple[str, Target]:
    return request.param, load_target(tiny_config(request.param, num_layers=NUM_LAYERS))


def _inputs() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(0, 120, (2, 9), generator=generator)  # 120..127: wrappers' media ids
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, :3] = 0
    return input_ids, attention_mask


def test_capture_matches_output_hidden_states(arch_target):
    arch, target = arch_target
    assert target.target_class == EXPECTED_TARGET_CLASS[arch]
    assert target.num_layers == NUM_LAYERS and target.hidden_size == 32
    input_ids, attention_mask = _inputs()
    L, H = target.num_layers, target.hidden_size
    out = target.forward(input_ids, attention_mask, aux_layers=list(range(L + 1)))
    seen = []
    hook = target.layers[-1].register_forward_hook(
        lambda module, args, output: seen.append(output[0] if isinstance(output, tuple) else output)
    )
    try:
        with torch.inference_mode():
            reference = target.causal_lm(
                input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True
            )
    finally:
        hook.remove()
    states = list(out.aux_hidden.split(H, dim=-1))
    assert len(reference.hidden_states) == L + 1
    for k in range(L):
        assert torch.equal(states[k], reference.hidden_states[k]), (arch, k)
    with torch.inference_mode():
        embedded = torch.nn.functional.embedding(input_ids, target.embed_tokens.weight)
        if (
            arch in SCALED_EMBEDDINGS
        ):  # 5.24: the scale sits in embed_tokens (a scaled embedding module)
            embedded = embedded * torch.tensor(H**0.5, dtype=embedded.dtype)
        assert torch.equal(states[0], embedded), (
            "index 0 is layer 1's input, after any embedding scale"
        )
        assert torch.equal(states[0], target.embed_tokens(input_ids))
        assert torch.equal(states[L], out.last_hidden) and torch.equal(out.last_hidden, seen[0])
        assert torch.equal(
            target.final_norm(out.last_hidden), reference.hidden_states[L]
        )  # L: before the norm
    assert torch.equal(out.logits, reference.logits.float())


def test_recorded_head_reproduces_the_logits(arch_target):
    """What training recomputes from a store (norm.weight + lm_head over index L) is the model's logits."""
    arch, target = arch_target
    input_ids, attention_mask = _inputs()
    out = target.forward(input_ids, attention_mask, aux_layers=[1])
    head = target_head_tensors(target)
    config = target.config
    softcap = getattr(config, "final_logit_softcapping", None)
    assert (softcap is not None) == (arch == "gemma2")
    logits = target_logits(
        out.last_hidden, head["norm.weight"], head["lm_head.weight"], config.rms_norm_eps, softcap
    )
    torch.testing.assert_close(logits, out.logits, rtol=1e-5, atol=1e-5)
    if arch in ("gemma2", "gemma3", "qwen3_5"):  # the recorded weight is 1 + w: the raw one misses
        raw = target_logits(
            out.last_hidden,
            target.final_norm.weight.detach(),
            head["lm_head.weight"],
            config.rms_norm_eps,
            softcap,
        )
        assert not torch.allclose(raw, out.logits, atol=1e-3)


def test_wrappers_capture_their_text_decoder(arch_target):
    arch, target = arch_target
    assert target.config is target.model.config.get_text_config()
    assert target.embed_tokens is target.model.get_input_embeddings()
    assert target.lm_head is target.model.get_output_embeddings()
    if arch == "llama4":  # get_decoder() returns the model itself in 5.24; the decoder is `model`
        assert target.text_model is target.model.model
    elif arch == "llama4_mm":  # get_decoder() is a Llama4ForCausalLM, which also runs the logits
        assert target.text_model is target.model.language_model.model
        assert target.causal_lm is target.model.language_model
    else:
        assert target.text_model is target.model.get_decoder()
        assert target.causal_lm is target.model


@pytest.mark.parametrize("arch", ["qwen3_vl", "qwen3_vl_moe"])
def test_qwen3_vl_mrope_on_text_positions_is_the_drafters_rope(arch):
    """Interleaved M-RoPE with its t, h, w rows all at the text positions (a text-only prompt) is
    the 1-D RoPE the drafter is trained and served with (rope_from_hf_config: theta, no sections)."""
    target = load_target(tiny_config(arch, num_layers=1))
    theta, scaling = rope_from_hf_config(
        lambda key, default=None: getattr(target.config, key, default)
    )
    assert scaling is None and "mrope_section" in target.config.rope_parameters
    positions = torch.arange(40)[None]
    x = torch.zeros(1, 40, target.hidden_size)
    with torch.inference_mode():
        cos, sin = target.text_model.rotary_emb(x, positions[None].expand(3, -1, -1))
    expected_cos, expected_sin = rope_cos_sin(
        positions, rope_inv_freq(target.config.head_dim, theta, None), torch.float32
    )
    torch.testing.assert_close(cos, expected_cos[:, 0], rtol=0, atol=1e-6)
    torch.testing.assert_close(sin, expected_sin[:, 0], rtol=0, atol=1e-6)
