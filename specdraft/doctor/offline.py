"""The seed's method, offline: the drafter alone on samples, teacher-forced with the target's aux
states, its own states fed back for later steps (train.loss.ttt_loss: the one TTT unroll),
as the named engine would load and feed it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from specdraft.checkpoint import Manifest
from specdraft.doctor.evidence import Evidence
from specdraft.doctor.file_evidence import Unavailable
from specdraft.doctor.keys import ENGINE_NAMES

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
    return run_on(ev, engine, ttt_steps, ev.labelled_samples)


def run_on(
    ev: Evidence, engine: str | None, ttt_steps: int, samples: list, replay: bool = False
) -> OfflineRun:
    """`run_offline` on the given `data.Sample`s (e.g. the sequences a server produced).

    replay: also replay the rounds a `ttt_steps`-deep chain engine runs at T = 0 over each
    sample's supervised runs (metrics.replayed_acceptance / replayed_tau; train.loss.replay_rounds).
    On a sequence an engine produced these are its own counts; per-position acceptance
    (prod alpha_i) overstates them, as rounds crowd where drafts fail. Compare a server's
    counters with the replay. Shows the samples done and the time left
    (`train.progress.counted_progress`).
    """
    from specdraft.train.loss import ttt_loss
    from specdraft.train.metrics import TTTMetrics
    from specdraft.train.progress import counted_progress

    layers, fed_from = _layers_fed(ev, engine)
    draft, loaded_as = ev.engine_draft(engine)
    target = ev.target
    metrics = TTTMetrics.zeros(ttt_steps)
    label = "doctor offline replay" if replay else "doctor offline acceptance"
    with torch.no_grad(), counted_progress(f"{label} (samples)", len(samples)) as advance:
        for s in samples:
            ids = torch.tensor([s.input_ids])
            mask = torch.tensor([s.loss_mask], dtype=torch.bool)
            out = target.forward(ids, aux_layers=layers)
            metrics.add(
                ttt_loss(
                    draft,
                    ids,
                    out.aux_hidden.float().clone(),
                    out.logits.clone(),
                    mask,
                    ttt_steps=ttt_steps,
                    replay=replay,
                )
            )
            advance()
    return OfflineRun(metrics, layers, fed_from, loaded_as, len(samples))


def _layers_fed(ev: Evidence, engine: str | None) -> tuple[list[int], str]:
    if engine is None:
        if ev.manifest is not None:
            return list(ev.manifest.aux_layers), "the training layers (manifest)"
        return list(ev.draft_config.aux_layers), "the config's layers"
    on, why = ev.aux_capture(engine)
    if not on:
        raise Unavailable(
            f"{ENGINE_NAMES[engine]} feeds no aux states: {why}", "see aux_width_on_target"
        )
    return ev.reading.captured(
        engine
    ), f"the layers {ENGINE_NAMES[engine]} captures under this config"


def training_accuracy(
    manifest: Manifest | None,
    splits: tuple[str, ...] = ("validation", "train"),
    key: str = "accuracy",
) -> tuple[list[float], str] | None:
    """Per-step rates recorded at training (`train.metrics.TTTMetrics.to_dict`'s `key`: per-step
    accuracy, or a block drafter's "replayed_acceptance") in the first of `splits` that has
    them, with its name."""
    training = (manifest.training or {}) if manifest is not None else {}
    for split in splits:
        record = training.get(split) or {}
        if record.get(key):
            return [float(a) for a in record[key]], f"training ({split} split)"
    return None
