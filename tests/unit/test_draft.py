"""The drafter against an independent float64 computation of DESIGN.md §2's equations."""

import math

import pytest
import torch

from specdraft.draft import KV, Eagle3Draft
from specdraft.draft_config import DraftConfig
from tests.support.drafts import FLAG_COMBINATIONS, flag_id, tiny_draft
from tests.support.tiny_models import tiny_config


def rms(x, w, eps):
    return w * x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)


def rope(vec, pos, theta):
    """Rotate one head vector [hd] by position `pos`: pairs (i, i + hd/2) rotate together."""
    hd = vec.shape[-1]
    out = vec.clone()
    for i in range(hd // 2):
        angle = pos * theta ** (-2 * i / hd)
        a, b = vec[i], vec[i + hd // 2]
        out[i] = a * math.cos(angle) - b * math.sin(angle)
        out[i + hd // 2] = b * math.cos(angle) + a * math.sin(angle)
    return out


def reference_step(p, cfg, token, h, pos, past):
    """One position of one draft step, written from the equations, one head at a time.

    p: parameter dict (float64); h: [H] (already fused by fc when first step); past: list of
    (k_heads, v_heads) of earlier positions, each [kv_heads, hd]. Returns (logits, out, (k, v)).
    """
    eps, hd = cfg.rms_norm_eps, cfg.head_dim
    emb = p["embed_tokens.weight"][token]
    normed_h = rms(h, p["midlayer.hidden_norm.weight"], eps)
    x = torch.cat([rms(emb, p["midlayer.input_layernorm.weight"], eps), normed_h])
    q = (p["midlayer.self_attn.q_proj.weight"] @ x).view(cfg.num_attention_heads, hd)
    k = (p["midlayer.self_attn.k_proj.weight"] @ x).view(cfg.num_key_value_heads, hd)
    v = (p["midlayer.self_attn.v_proj.weight"] @ x).view(cfg.num_key_value_heads, hd)
    k = torch.stack([rope(k[j], pos, cfg.rope_theta) for j in range(k.shape[0])])
    entries = past + [(k, v)]
    group = cfg.num_attention_heads // cfg.num_key_value_heads
    heads = []
    for i in range(cfg.num_attention_heads):
        qi = rope(q[i], pos, cfg.rope_theta)
        scores = torch.stack([qi @ ek[i // group] for ek, _ in entries]) / math.sqrt(hd)
        weights = torch.softmax(scores, 0)
        heads.append(sum(w * ev[i // group] for w, (_, ev) in zip(weights, entries)))
    attn = p["midlayer.self_attn.o_proj.weight"] @ torch.cat(heads)
    r = attn + (normed_h if cfg.norm_before_residual else h)  # vLLM's _norm_before_residual
    m = rms(r, p["midlayer.post_attention_layernorm.weight"], eps)
    mlp = p["midlayer.mlp.down_proj.weight"] @ (
        torch.nn.functional.silu(p["midlayer.mlp.gate_proj.weight"] @ m)
        * (p["midlayer.mlp.up_proj.weight"] @ m)
    )
    out = r + mlp
    normed = rms(out, p["norm.weight"], eps)
    logits = p["lm_head.weight"] @ normed
    return logits, (normed if cfg.norm_output else out), (k, v)


def reference_fuse(p, cfg, aux):
    """The first step's h from one position's aux states [n·H_target]: input_norm over all of
    them (norm_before_fc), then one norm per aux state (fc_norm), then fc."""
    eps = cfg.rms_norm_eps
    if cfg.norm_before_fc:
        aux = rms(aux, p["input_norm.weight"], eps)
    if cfg.fc_norm:
        aux = torch.cat(
            [rms(c, p[f"fc_norm.{i}.weight"], eps) for i, c in enumerate(aux.chunk(cfg.n_aux))]
        )
    return p["fc.weight"] @ aux


@pytest.mark.parametrize("flags", FLAG_COMBINATIONS, ids=flag_id)
def test_forward_matches_equations_float64(flags):
    model = tiny_draft(dtype=torch.float64, **flags)
    cfg = model.cfg
    p = {k: v for k, v in model.state_dict().items()}
    torch.manual_seed(1)
    T = 4
    ids = torch.randint(0, cfg.vocab_size, (1, T))
    aux = torch.randn(1, T, cfg.n_aux * cfg.target_hidden_size, dtype=torch.float64)
    first = model(ids, aux, torch.arange(T), first_step=True)
    # Second draft step for the last position, attending to the first step's cache.
    ids2 = torch.randint(0, cfg.vocab_size, (1, 1))
    second = model(
        ids2, first.hidden[:, -1:], torch.tensor([T]), first_step=False, past_kv=first.kv
    )

    past = []
    for t in range(T):
        h = reference_fuse(p, cfg, aux[0, t])
        logits, out, kv = reference_step(p, cfg, ids[0, t], h, t, past)
        past.append(kv)
        torch.testing.assert_close(first.logits[0, t], logits, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(first.hidden[0, t], out, rtol=1e-10, atol=1e-10)
    logits, out, _ = reference_step(p, cfg, ids2[0, 0], first.hidden[0, -1], T, past)
    torch.testing.assert_close(second.logits[0, 0], logits, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(second.hidden[0, 0], out, rtol=1e-10, atol=1e-10)


def test_incremental_cache_equals_full_forward():
    model = tiny_draft()
    torch.manual_seed(2)
    ids = torch.randint(0, 128, (2, 6))
    aux = torch.randn(2, 6, 96)
    full = model(ids, aux, torch.arange(6), first_step=True)
    head = model(ids[:, :4], aux[:, :4], torch.arange(4), first_step=True)
    tail = model(ids[:, 4:], aux[:, 4:], torch.arange(4, 6), first_step=True, past_kv=head.kv)
    torch.testing.assert_close(
        torch.cat([head.logits, tail.logits], 1), full.logits, rtol=1e-5, atol=1e-5
    )
    both = KV.cat([head.kv, tail.kv])
    torch.testing.assert_close(both.k, full.kv.k, rtol=1e-5, atol=1e-5)


def one_position(model, first_step: bool):
    """`model` on one position: token 0 at position 0 with an all-zero aux input of width 96 (the
    first step's fc input, 3 x 32)."""
    return model(
        torch.zeros(1, 1, dtype=torch.long),
        torch.zeros(1, 1, 96),
        torch.zeros(1, dtype=torch.long),
        first_step=first_step,
    )


def test_later_step_rejects_aux_width():
    model = tiny_draft()
    with pytest.raises(ValueError, match="own hidden state"):
        one_position(model, first_step=False)


def test_shared_embedding_must_be_loaded():
    cfg = DraftConfig.from_target(tiny_config("llama", num_layers=5), (2, 3, 4))
    model = Eagle3Draft(cfg)
    with pytest.raises(RuntimeError, match="load_target_embedding"):
        one_position(model, first_step=True)
    model.load_target_embedding(torch.ones(128, 32))
    out = one_position(model, first_step=True)
    assert out.logits.shape == (1, 1, 128)


@pytest.mark.parametrize(
    "field,value,match",
    [
        ("norm_output", 1, "true or false"),
        ("tie_word_embeddings", True, "lm_head"),
        ("aux_layers", (2, 2, 4), "distinct"),
        ("aux_layers", (2, 3, 6), "0..5"),
        ("draft_vocab_size", 999, "exceeds"),
        ("rope_scaling", {"rope_type": "yarn", "factor": 2.0}, "yarn"),
    ],
)
def test_config_refuses(field, value, match):
    overrides = {"aux_layers": (2, 3, 4), field: value}
    with pytest.raises(ValueError, match=match):
        DraftConfig.from_target(tiny_config("llama", num_layers=5), **overrides)


def test_config_from_target_defaults_and_owned_embedding():
    target = tiny_config("llama", num_layers=5)
    cfg = DraftConfig.from_target(target, (2, 3, 4))
    assert (cfg.hidden_size, cfg.target_hidden_size, cfg.vocab_size, cfg.draft_vocab_size) == (
        32,
        32,
        128,
        128,
    )
    assert not cfg.owns_embedding and cfg.n_aux == 3
    wide = DraftConfig.from_target(target, (2, 3, 4), hidden_size=64, num_attention_heads=8)
    assert wide.owns_embedding
    assert Eagle3Draft(wide).fc.weight.shape == (64, 96)
    assert DraftConfig.from_dict(cfg.to_dict()) == cfg


def test_eagle31_norms_are_parameters_under_the_engines_names():
    """input_norm [n·H_target] and fc_norm.{i} [H_target] (SGLang / vLLM / speculators names)."""
    names = {
        k: tuple(v.shape)
        for k, v in tiny_draft(norm_before_fc=True, fc_norm=True).state_dict().items()
    }
    assert names["input_norm.weight"] == (96,)
    assert [names[f"fc_norm.{i}.weight"] for i in range(3)] == [(32,)] * 3
    assert not any(k.startswith(("input_norm", "fc_norm")) for k in tiny_draft().state_dict())
