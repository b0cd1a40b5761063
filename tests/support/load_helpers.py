"""A `tune_load.LoadBench` whose seconds come from a cost model of a target whose batched verify
grows with its rows x tokens (speculation wins at batch 1 and loses at large batches), not from
this machine's clock: the batching engine runs for real (acceptance, tokens), then each batch
run's seconds are set from the model, so tests check `tune --concurrency`'s logic on given
timings however busy the machine is."""

from __future__ import annotations

from specdraft.bench.tune_load import BatchRun, LoadBench


class ModelledLoadBench(LoadBench):
    """A round of b sequences at K costs fixed_s + row_s * b * (K + 1) + draft_s * b * K (a
    batched draft step grows with its rows too)."""

    def __init__(self, *args, fixed_s: float, row_s: float, draft_s: float, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fixed_s, self.row_s, self.draft_s = fixed_s, row_s, draft_s

    def round_s(self, batch_size: int, num_steps: int) -> float:
        """The modelled seconds of one round."""
        return (
            self.fixed_s
            + self.row_s * batch_size * (num_steps + 1)
            + self.draft_s * batch_size * num_steps
        )

    def run_batch(self, batch_size: int, num_steps: int) -> BatchRun:
        run = super().run_batch(batch_size, num_steps)
        run.seconds = sum(n * self.round_s(b, num_steps) for b, n in run.rounds_by_batch.items())
        return run


def modelled_load_bench(target, draft, prompts, cfg, **costs) -> ModelledLoadBench:
    """A ModelledLoadBench of `tune`'s arguments; costs: fixed_s, row_s, draft_s."""
    return ModelledLoadBench(target, draft, prompts, cfg, **costs)
