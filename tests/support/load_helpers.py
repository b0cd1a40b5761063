"""A `tune_load.LoadBench` whose seconds come from a cost model of a target whose batched verify
grows with its rows x tokens (speculation wins at batch 1 and loses at large batches), not from
this machine's clock: the batching engine runs for real (acceptance, tokens), then each batch
run's seconds are set from the model, so tests check `tune --concurrency`'s logic on given
timings however busy the machine is."""

from __future__ import annotations

from specdraft.bench.tune_load import BatchRun, LoadBench


class ModelledLoadBench(LoadBench):
    """A round of b sequences at a setting of N verified nodes, num_steps n and topk k costs
    fixed_s + row_s * b * N + draft_s * b * n * k (a batched draft step grows with its rows and
    its width too; a chain of K: N = K + 1, n k = K)."""

    def __init__(self, *args, fixed_s: float, row_s: float, draft_s: float, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fixed_s, self.row_s, self.draft_s = fixed_s, row_s, draft_s

    def round_s(self, batch_size: int, spec) -> float:
        """The modelled seconds of one round (spec None: plain decoding)."""
        nodes, width = (
            (1, 0) if spec is None else (spec.num_draft_tokens, spec.num_steps * spec.topk)
        )
        return self.fixed_s + self.row_s * batch_size * nodes + self.draft_s * batch_size * width

    def run_batch(self, batch_size: int, spec) -> BatchRun:
        run = super().run_batch(batch_size, spec)
        run.seconds = sum(n * self.round_s(b, spec) for b, n in run.rounds_by_batch.items())
        return run


def modelled_load_bench(target, draft, prompts, cfg, **costs) -> ModelledLoadBench:
    """A ModelledLoadBench of `tune`'s arguments; costs: fixed_s, row_s, draft_s."""
    return ModelledLoadBench(target, draft, prompts, cfg, **costs)
