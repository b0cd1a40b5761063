"""The seeds' method for a block drafter (DFlash): the drafter alone on samples, fed the target's
states of the layers the deployment captures, each block at an anchor scored as the round an
engine runs there at T = 0 (`train.dflash_loss.block_acceptance`, the counts training records).

Two walks over a sample, both teacher-forced on its tokens with the target's greedy tokens as the
verifier's (`train.dflash_loss.target_tokens`):
- `run_blocks`: a block at every anchor training could draw (`train.dflash_loss.sample_anchors`'s
  rule: a supervised position whose block ends inside the supervised text), as training's
  validation counts them: per-position acceptance p_k = the share of blocks whose first k drafts
  all equal the target's tokens, tau = 1 + sum_k p_k;
- `replay_served`: the rounds an engine runs on a sequence it produced (`train.loss.replay_rounds`:
  each round's anchor the token after the last accepted one), the counts a server's counters
  give.

Each block is `train.dflash_loss.block_logits`: the training forward and mask, which attend to what
the engine's block attends to (`engine.dflash_block`: the context before the anchor, the whole
block). `ev` is always a `block.BlockEvidence` (typed as its base, which this module's caller
imports).
"""

from __future__ import annotations

import torch

from specdraft.conventions import dflash_reads as reads
from specdraft.dflash import DFlashDraft
from specdraft.doctor.evidence import Evidence
from specdraft.doctor.file_evidence import Unavailable
from specdraft.doctor.keys import ENGINE_NAMES
from specdraft.doctor.offline import OfflineRun
from specdraft.draft_config import DraftError

# Blocks per drafter forward: the attention mask is [64·block_size, T + 64·block_size] per chunk.
BLOCKS_PER_FORWARD = 64


def replay_drafter(ev: Evidence) -> DFlashDraft:
    """The drafter as the files load (`BlockEvidence.need_drafter`), the target's embedding and
    lm_head loaded, in eval mode; Unavailable when the target's head is not the drafter's size."""

    def loaded() -> DFlashDraft:
        draft = ev.need_drafter()
        target = ev.target
        try:
            draft.load_target_head(
                target.embed_tokens.weight.detach().float(), target.lm_head.weight.detach().float()
            )
        except DraftError as e:
            raise Unavailable(
                f"the drafter cannot run on this target: {e}", "serve the target it was trained on"
            ) from None
        return draft.float().eval()

    return ev.cached("block_replay_draft", loaded)


def fed_layers(ev: Evidence, engine: str | None) -> tuple[list[int], str]:
    """(specdraft indices, where they came from in words) of the target states the drafter is fed:
    what `engine` captures under config.json (`dflash_reads.engine_aux_layers`), else (no engine,
    or a vLLM config naming none) the layers the drafter's config names, as specdraft loads it."""
    if engine is not None:
        layers = reads.engine_aux_layers(ev.reading(engine), engine, ev.facts.num_layers)
        if layers:
            return list(layers), f"the layers {ENGINE_NAMES[engine]} captures under this config"
    return list(ev.need_drafter().cfg.aux_layers), "the layers config.json names"


def block_outcomes(
    draft: DFlashDraft,
    ids: torch.Tensor,
    aux: torch.Tensor,
    greedy: torch.Tensor,
    mask: torch.Tensor,
    anchors: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(drafts, target's tokens, supervised) [N, K] of the blocks at `anchors` [N] long of one
    sequence ids [1, T]: the drafter's argmax at block positions 1..K = block_size - 1, the
    target's greedy tokens there (greedy [1, T], `target_tokens`), whether the position is inside
    the sequence and supervised (mask [1, T] bool). aux: [1, T, n·H_target]."""
    from specdraft.train.dflash_loss import Blocks, block_labels, block_logits

    out = []
    for chunk in torch.split(anchors, BLOCKS_PER_FORWARD):
        blocks = Blocks(chunk[None], torch.ones(1, len(chunk), dtype=torch.bool))
        drafts = block_logits(draft, ids, aux, blocks).argmax(-1)[0]
        labels, supervised = block_labels(greedy, mask, blocks, draft.cfg.block_size)
        out.append((drafts, labels[0], supervised[0]))
    return tuple(torch.cat(parts) for parts in zip(*out))


def _walk(ev: Evidence, engine: str | None, samples: list, label: str, score) -> OfflineRun:
    """The target run on each of `samples` with the layers fed (`fed_layers`), `score(draft, ids,
    aux, greedy, mask, metrics)` adding its blocks' counts to metrics (TTTMetrics over
    K = block_size - 1); shows the samples done and the time left."""
    from specdraft.train.dflash_loss import target_tokens
    from specdraft.train.metrics import TTTMetrics
    from specdraft.train.progress import counted_progress

    layers, fed_from = fed_layers(ev, engine)
    draft = replay_drafter(ev)
    metrics = TTTMetrics.zeros(draft.cfg.block_size - 1)
    with torch.no_grad(), counted_progress(f"{label} (samples)", len(samples)) as advance:
        for s in samples:
            ids = torch.tensor([s.input_ids])
            out = ev.target.forward(ids, aux_layers=layers)
            greedy = target_tokens(ids, out.logits)
            mask = torch.tensor([s.loss_mask], dtype=torch.bool)
            score(draft, ids, out.aux_hidden.float().clone(), greedy, mask, metrics)
            advance()
    loaded_as = f"{ev.path} as config.json describes it (block size {draft.cfg.block_size})"
    return OfflineRun(metrics, layers, fed_from, loaded_as, len(samples))


def run_blocks(ev: Evidence) -> OfflineRun:
    """The drafter alone on the samples (`ev.labelled_samples`), a block at every anchor training
    could draw (module doc), fed what the named engine captures (else the config's layers);
    metrics.rounds = blocks, round_accepted[k] = blocks whose drafts 1..k+1 are the target's
    tokens, total[k] = blocks with position k+1 supervised. Cached on `ev`."""

    def score(draft, ids, aux, greedy, mask, metrics) -> None:
        from specdraft.train.dflash_loss import block_acceptance, sample_anchors

        every = sample_anchors(mask, draft.cfg.block_size, ids.shape[1], [0])
        anchors = every.anchors[0][every.keep[0]]
        if len(anchors):
            drafts, wanted, supervised = block_outcomes(draft, ids, aux, greedy, mask, anchors)
            rounds, accepted = block_acceptance(drafts, wanted, supervised)
            metrics.rounds += rounds
            metrics.round_accepted += accepted
            metrics.total += supervised.sum(0)

    return ev.cached(
        f"block_run:{ev.engine}",
        lambda: _walk(ev, ev.engine, ev.labelled_samples, "doctor block acceptance", score),
    )


def replay_served(ev: Evidence, engine: str | None, steps: int, online) -> OfflineRun:
    """The drafter alone replaying a `steps`-draft block engine's rounds (`train.loss.replay_rounds`)
    on the sequences the server produced (`online.sequences`, their outputs supervised): the
    counts the server's own counters give when it runs this drafter on these layers."""
    from specdraft.train.loss import replay_rounds

    def score(draft, ids, aux, greedy, mask, metrics) -> None:
        t = ids.shape[1]
        anchors = torch.arange(1, t)  # the block after base position a - 1
        drafts, wanted, supervised = block_outcomes(draft, ids, aux, greedy, mask, anchors)
        k = min(steps, draft.cfg.block_size - 1)
        hits = torch.zeros(k, t, dtype=torch.bool)
        hits[:, : t - 1] = ((drafts == wanted) & supervised)[:, :k].T
        rounds, accepted = replay_rounds(hits, mask[0])
        metrics.rounds += rounds
        metrics.round_accepted[:k] += torch.tensor(accepted)

    return _walk(ev, engine, online.sequences, "doctor offline replay", score)
