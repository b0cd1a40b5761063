"""Tiny seeded DFlash drafters for tests (specdraft/dflash.py's sizes shrunk)."""

from __future__ import annotations

import torch

from specdraft.dflash import DFlashConfig, DFlashDraft

TINY_BLOCK = 4


def tiny_dflash_cfg(**kw) -> DFlashConfig:
    """A 2-layer drafter of a 4-layer, 50-token, H = 32 target on its layers 0, 1, 2 (0-based),
    block 4, mask id 49; `kw` replaces any field."""
    base = dict(
        hidden_size=32,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        intermediate_size=64,
        vocab_size=50,
        target_layer_ids=(0, 1, 2),
        target_num_layers=4,
        mask_token_id=49,
        max_position_embeddings=128,
        num_hidden_layers=2,
        block_size=TINY_BLOCK,
    )
    return DFlashConfig(**{**base, **kw})


def tiny_dflash_draft(**kw) -> DFlashDraft:
    """`tiny_dflash_cfg(**kw)`'s drafter, seeded, with a random target head, in float64."""
    torch.manual_seed(0)
    draft = DFlashDraft(tiny_dflash_cfg(**kw))
    draft.load_target_head(torch.randn(50, 32), torch.randn(50, 32))
    return draft.double()


def engine_dflash_draft(
    target, sequences: torch.Tensor, prompt_len: int, steps: int
) -> DFlashDraft:
    """A DFlash drafter of the engine tests' tiny targets (tests.support.engine_helpers: vocab 64,
    H 32, 4 layers) on their AUX_LAYERS (1, 2, 4), block TINY_BLOCK, mask id 63, the target's head
    loaded (`engine.dflash_block.target_head`), trained `steps` Adam steps of the block loss
    (`train.dflash_loss`) on `sequences` [B, L] (prompts of prompt_len, then the target's greedy
    continuation, the only supervised part); seeded, float32, in eval mode."""
    from specdraft.engine.dflash_block import target_head
    from specdraft.train.dflash_loss import dflash_loss, sample_anchors
    from tests.support.engine_helpers import AUX_LAYERS, target_pass

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(5)
        draft = DFlashDraft(
            tiny_dflash_cfg(
                vocab_size=64, mask_token_id=63, target_layer_ids=tuple(k - 1 for k in AUX_LAYERS)
            )
        )
    draft.load_target_head(*target_head(target))
    _, aux = target_pass(target, sequences)
    loss_mask = torch.zeros_like(sequences)
    loss_mask[:, prompt_len:] = 1
    opt = torch.optim.Adam(draft.parameters(), lr=1e-2)
    with torch.enable_grad():
        for step in range(steps):
            seeds = [step * len(sequences) + i for i in range(len(sequences))]
            blocks = sample_anchors(loss_mask, TINY_BLOCK, 4, seeds)
            loss = dflash_loss(draft, sequences, aux.float(), loss_mask, blocks).loss
            opt.zero_grad()
            loss.backward()
            opt.step()
    return draft.eval()


def save_engine_dflash(draft: DFlashDraft, target, path):
    """Save `draft` (an `engine_dflash_draft`) with a manifest recording `target`'s sizes
    (a FastTarget's args); returns the directory."""
    from specdraft.checkpoint.dflash import save_dflash_draft
    from specdraft.checkpoint.manifest import Manifest

    args = target.args
    manifest = Manifest(
        draft=draft.cfg.to_dict(),
        target={
            "num_layers": args.num_layers,
            "hidden_size": args.hidden_size,
            "vocab_size": args.vocab_size,
        },
        aux_layers=list(draft.cfg.aux_layers),
        extra={"method": "dflash"},
    )
    return save_dflash_draft(draft, path, manifest)


class _EagerGraph:
    """Stands in for a captured CUDA graph without a GPU: replay runs the captured function."""

    def __init__(self, fn) -> None:
        self.replay = fn


class _TracedGraph:
    """Stands in for a captured CUDA graph without a GPU, frozen as one: the function's aten ops
    traced once (`make_fx`, its tensors' storage kept), with every host value it read then;
    replay runs those ops again on the same tensors."""

    def __init__(self, fn) -> None:
        from torch.fx.experimental.proxy_tensor import make_fx

        with torch.no_grad():
            self.replay = make_fx(fn)()


def replay_blocks_eagerly(monkeypatch, traced: bool = False) -> None:
    """Without a GPU, `GraphedBlock.capture` captures through a stand-in of
    `graphs.capture_graph`: its warm-up calls and resets as on CUDA, then an `_EagerGraph` of
    the round (a replay runs `GraphedBlock.run`, the captured code, eagerly), or with traced a
    `_TracedGraph` (the ops and host values of one run, replayed)."""
    from specdraft.engine import dflash_graph

    graph = _TracedGraph if traced else _EagerGraph

    def capture_graph(fn, warmups=2, reset=None):
        for _ in range(warmups):
            if reset is not None:
                reset()
            fn()
        if reset is not None:
            reset()
        return graph(fn), None

    monkeypatch.setattr(dflash_graph, "capture_graph", capture_graph)
