"""The seeds' method for a block drafter (DFlash): the drafter alone on samples, fed the target's
states of the layers the deployment captures, its blocks scored against the target's greedy tokens
at T = 0 (`train.dflash_loss`, the counts training records).

Both walks over a sample are teacher-forced on its tokens with the target's greedy tokens as the
verifier's (`train.dflash_loss.target_tokens`), from one block at every position:
- `run_blocks`: (1) the blocks at every anchor training could draw (`train.dflash_loss.
  sample_anchors`' rule: a supervised position whose block ends inside the supervised text), as
  training counts its sampled blocks: p_k = the share of blocks whose first k drafts all equal the
  target's tokens; (2) the rounds a whole-block engine runs over the sample
  (`train.dflash_loss.walked_rounds`: each round's anchor the token after the last accepted one),
  as training's validation walks them. On a sample that is the target's greedy output, (2) is what
  the engine measures on that text, round for round (the engine's block at an anchor is the
  teacher-forced one); (1) is higher, its anchors uniform where the engine's follow a rejection;
- `replay_served`: (2) for a server's setting on the sequences it produced, the counts a server's
  counters give.

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
    """The drafter alone on the samples (`ev.labelled_samples`), fed what the named engine
    captures (else the config's layers), both counts of the module doc: metrics.blocks /
    block_accepted[k] the blocks at every anchor training could draw and those whose drafts
    1..k+1 are the target's tokens (total[k]: blocks with position k+1 supervised);
    metrics.rounds / round_accepted the rounds of a block_size - 1 draft engine walked over each
    sample. Cached on `ev`."""

    def score(draft, ids, aux, greedy, mask, metrics) -> None:
        from specdraft.train.dflash_loss import (
            block_acceptance,
            block_outcomes,
            sample_anchors,
            walked_rounds,
        )

        t, steps = ids.shape[1], draft.cfg.block_size - 1
        if t < 3:  # no round, no block
            return
        outcomes = block_outcomes(draft, ids, aux, greedy, mask, torch.arange(t))
        every = sample_anchors(mask, draft.cfg.block_size, t, [0])
        anchors = every.anchors[0][every.keep[0]]
        drafts, wanted, supervised = (part[anchors] for part in outcomes)
        blocks, accepted = block_acceptance(drafts, wanted, supervised)
        metrics.blocks += blocks
        metrics.block_accepted += accepted
        metrics.total += supervised.sum(0)
        rounds, per_pos = walked_rounds(outcomes, mask[0], steps)
        metrics.rounds += rounds
        metrics.round_accepted += torch.tensor(per_pos)

    return ev.cached(
        f"block_run:{ev.engine}",
        lambda: _walk(ev, ev.engine, ev.labelled_samples, "doctor block acceptance", score),
    )


def replay_served(ev: Evidence, engine: str | None, steps: int, online) -> OfflineRun:
    """The drafter alone replaying a `steps`-draft block engine's rounds
    (`train.dflash_loss.engine_rounds`) on the sequences the server produced (`online.sequences`,
    their outputs supervised): the counts the server's own counters give when it runs this drafter
    on these layers."""
    from specdraft.train.dflash_loss import engine_rounds

    def score(draft, ids, aux, greedy, mask, metrics) -> None:
        k = min(steps, draft.cfg.block_size - 1)
        rounds, accepted = engine_rounds(draft, ids, aux, greedy, mask, k)
        metrics.rounds += rounds
        metrics.round_accepted[:k] += accepted

    return _walk(ev, engine, online.sequences, "doctor offline replay", score)
