"""The seed's method, offline: the drafter alone on samples, teacher-forced with the target's aux
states, its own states fed back for later steps (train.loss.ttt_loss: the one TTT unroll),
as the named engine would load and feed it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from specdraft.checkpoint import Manifest
from specdraft.doctor.evidence import ENGINE_NAMES, Evidence, Unavailable

DEFAULT_TTT_STEPS = 5


@dataclass
class OfflineRun:
    """The drafter alone on samples, teacher-forced, own states fed back (train.loss metrics).

    metrics: TTTMetrics over the samples. aux_layers: the specdraft indices fed (what the
    engine would capture). fed_from / loaded_as: where those came from, in words.
    """

    metrics: Any
    aux_layers: list[int]
    fed_from: str
    loaded_as: str
    num_samples: int


def offline_run(ev: Evidence, engine: str | None, ttt_steps: int) -> OfflineRun:
    """`run_offline`, computed once per (engine, steps) and cached on `ev`."""
    return ev.cached(f"offline:{engine}:{ttt_steps}", lambda: run_offline(ev, engine, ttt_steps))


def run_offline(ev: Evidence, engine: str | None, ttt_steps: int) -> OfflineRun:
    """The drafter (as `engine` loads it) on the samples, fed the aux layers `engine` captures.

    Aux layers: the engine's reading of the config (engine given) or the training layers
    (manifest; else the config's). Uses train.loss.ttt_loss for the unroll and the counts.
    """
    return run_on(ev, engine, ttt_steps, ev.samples)


def run_on(ev: Evidence, engine: str | None, ttt_steps: int, samples: list) -> OfflineRun:
    """`run_offline` on the given `data.Sample`s (e.g. the sequences a server produced)."""
    from specdraft.train.loss import TTTMetrics, ttt_loss

    layers, fed_from = _layers_fed(ev, engine)
    draft, loaded_as = ev.engine_draft(engine)
    target = ev.target
    metrics = TTTMetrics.zeros(ttt_steps)
    with torch.no_grad():
        for s in samples:
            ids = torch.tensor([s.input_ids])
            mask = torch.tensor([s.loss_mask], dtype=torch.bool)
            out = target.forward(ids, aux_layers=layers)
            metrics.add(ttt_loss(draft, ids, out.aux_hidden.float().clone(), out.logits.clone(),
                                 mask, ttt_steps=ttt_steps))
    return OfflineRun(metrics, layers, fed_from, loaded_as, len(samples))


@dataclass
class RoundsRun:
    """The drafter alone replaying a chain engine's rounds at T = 0 over served sequences.

    num_rounds: verification rounds. accepted_per_pos: [K] rounds whose drafts 1..k+1 were all
    accepted (vLLM's `num_accepted_tokens_per_pos`). The rest as in OfflineRun.
    """

    num_rounds: int
    accepted_per_pos: list[int]
    aux_layers: list[int]
    fed_from: str
    loaded_as: str
    num_samples: int

    @property
    def acceptance_per_position(self) -> list[float]:
        """p_k = accepted at depth k / rounds."""
        return [a / max(self.num_rounds, 1) for a in self.accepted_per_pos]

    @property
    def accept_length(self) -> float:
        """tau = 1 + accepted drafts / rounds (the target's bonus token counts once a round)."""
        return 1 + sum(self.accepted_per_pos) / max(self.num_rounds, 1)


def run_rounds(ev: Evidence, engine: str | None, num_steps: int, samples: list) -> RoundsRun:
    """Replay the rounds a chain engine runs at T = 0, `num_steps` drafts a round, over each
    sample's supervised runs (`data.Sample`; a served sequence: prompt 0, output 1), the drafter
    fed what `engine` captures, a draft accepted when it is the target's greedy choice. On a
    sequence the engine produced these are the engine's own counts (its greedy tokens are the
    sequence's); on other text, an estimate that walks that text.

    Rounds and positions are not alike: rounds crowd where drafts fail (each advances one or
    two tokens there), so per-round acceptance is below the per-position acceptance of
    `run_on` on the same text (pycode-25m in vLLM: p_1 0.67 a round, 0.82 a position).
    """
    from specdraft.train.loss import greedy_choices, replay_rounds, ttt_unroll

    layers, fed_from = _layers_fed(ev, engine)
    draft, loaded_as = ev.engine_draft(engine)
    rounds, accepted = 0, [0] * num_steps
    with torch.no_grad():
        for s in samples:
            ids = torch.tensor([s.input_ids])
            out = ev.target.forward(ids, aux_layers=layers)
            outputs = ttt_unroll(draft, ids, out.aux_hidden.float().clone(), num_steps)
            drafts = torch.stack([draft.draft_to_target(o.logits[0].argmax(-1)) for o in outputs])
            greedy = greedy_choices(out.logits[0].argmax(-1), num_steps)
            n, per_pos = replay_rounds(drafts == greedy, torch.tensor(s.loss_mask, dtype=torch.bool))
            rounds += n
            accepted = [a + b for a, b in zip(accepted, per_pos)]
    return RoundsRun(rounds, accepted, layers, fed_from, loaded_as, len(samples))


def _layers_fed(ev: Evidence, engine: str | None) -> tuple[list[int], str]:
    if engine is None:
        if ev.manifest is not None:
            return list(ev.manifest.aux_layers), "the training layers (manifest)"
        return list(ev.draft_config.aux_layers), "the config's layers"
    on, why = ev.aux_capture(engine)
    if not on:
        raise Unavailable(f"{ENGINE_NAMES[engine]} feeds no aux states: {why}",
                          "see aux_width_on_target")
    return ev.reading.captured(engine), f"the layers {ENGINE_NAMES[engine]} captures under this config"


def training_accuracy(manifest: Manifest | None) -> tuple[list[float], str] | None:
    """Per-step accuracy recorded at training (validation split preferred), with its name."""
    training = (manifest.training or {}) if manifest is not None else {}
    for split in ("validation", "train"):
        record = training.get(split) or {}
        if record.get("accuracy"):
            return [float(a) for a in record["accuracy"]], f"training ({split} split)"
    return None


