"""Tiny seeded drafters for tests."""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

import torch

from specdraft.checkpoint import Manifest
from specdraft.draft import Eagle3Draft
from specdraft.draft_config import NORM_FLAGS, DraftConfig
from tests.support.tiny_models import tiny_config

# Every combination of the four norm flags (speculators' trainer default: norm_before_residual,
# norm_before_fc, norm_output; SpecForge's EAGLE-3.1 config: fc_norm, norm_output).
FLAG_COMBINATIONS = [
    dict(zip(NORM_FLAGS, values)) for values in itertools.product((False, True), repeat=4)
]


def flag_id(flags: dict[str, bool]) -> str:
    """A pytest id naming the flags set ("none" for the default drafter)."""
    return "+".join(k for k, v in flags.items() if v) or "none"


def seeded_draft(cfg: DraftConfig, seed: int = 0) -> Eagle3Draft:
    """A drafter with every tensor seeded and non-trivial (norms perturbed) and the even target
    ids as its draft vocabulary (d2t[i] = i, so d2t is not the identity); a draft vocabulary as
    large as the target's is the identity map. RNG state is kept."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Eagle3Draft(cfg)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "norm" in name:  # every RMSNorm, the EAGLE-3.1 fc_norm.{i} included
                    p.add_(0.1 * torch.randn_like(p))
    vocab = cfg.draft_vocab_size
    full = vocab == cfg.vocab_size
    model.d2t.copy_(torch.zeros(vocab) if full else torch.arange(vocab))
    model.t2d.fill_(full)
    model.t2d[torch.arange(vocab) * (1 if full else 2)] = True
    model.embedding_loaded = True
    return model


def tiny_draft(
    num_layers: int = 5,
    aux_layers=(2, 3, 4),
    draft_vocab_size: int = 64,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    **overrides,
) -> Eagle3Draft:
    """`seeded_draft` for a tiny Llama target (vocab 128)."""
    cfg = DraftConfig.from_target(
        tiny_config("llama", num_layers=num_layers),
        aux_layers,
        draft_vocab_size=draft_vocab_size,
        **overrides,
    )
    return seeded_draft(cfg, seed).to(dtype)


def engine_draft(**overrides) -> Eagle3Draft:
    """`tiny_draft` at the width of the engine tests' 2-layer targets (support.kernels.ARGS: 64
    wide, 4 heads of 16 over 2 K/V heads, 200 ids), aux layers 0, 1, 2; float32."""
    heads = dict(num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    width = dict(hidden_size=64, target_hidden_size=64, vocab_size=200)
    return tiny_draft(**{"num_layers": 2, "aux_layers": (0, 1, 2), **heads, **width, **overrides})


def tiny_manifest(model: Eagle3Draft) -> Manifest:
    """A manifest naming the drafter's config and aux layers."""
    return Manifest(
        draft=model.cfg.to_dict(),
        target={"num_layers": model.cfg.target_num_layers},
        aux_layers=list(model.cfg.aux_layers),
    )


def save_training_checkpoint(
    model: Eagle3Draft, manifest: Manifest, run: Path, step: int = 5
) -> Path:
    """RUN/checkpoints/step-0000000N.pt as `train --save-every` writes it (progress state with the
    drafter's tensors under "draft." and its manifest); returns the file."""
    path = run / "checkpoints" / f"step-{step:08d}.pt"
    path.parent.mkdir(parents=True)
    torch.save(
        {
            "step": step,
            "manifest": dataclasses.asdict(manifest),
            "records": {},
            "extensions": {},
            "config": {},
            "model": {f"draft.{k}": v for k, v in model.state_dict().items()},
        },
        path,
    )
    return path


def ttt_draft(
    seed: int = 0, vocab: int = 48, draft_vocab: int = 48, dtype=torch.float64
) -> Eagle3Draft:
    """A seeded drafter for the TTT tests (float64 by default; 16 wide, aux layers 1-3 of a
    4-layer target of width 16, the target embedding random), its weights scaled up 10x."""
    heads = dict(num_attention_heads=4, num_key_value_heads=2, head_dim=4)
    width = dict(hidden_size=16, intermediate_size=32, target_hidden_size=16)
    target = dict(aux_layers=(1, 2, 3), target_num_layers=4, max_position_embeddings=128)
    cfg = DraftConfig(**heads, **width, vocab_size=vocab, draft_vocab_size=draft_vocab, **target)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        draft = Eagle3Draft(cfg)
        draft.load_target_embedding(torch.randn(vocab, 16))
        # scale up so attention weights are far from uniform: a wrong key set shows clearly
        for p in draft.parameters():
            p.data.mul_(10.0)
    return draft.to(dtype)


def ttt_inputs(seed: int, t_len: int = 9, vocab: int = 48):
    """(ids [1, t_len] long, aux [1, t_len, 48] float64) for `ttt_draft`, seeded."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (1, t_len), generator=g)
    aux = torch.randn(1, t_len, 48, generator=g, dtype=torch.float64)
    return ids, aux
