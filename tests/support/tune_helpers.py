"""A tune `Bench` whose timings come from a cost model, not from this machine's clock: the
engine runs for real (acceptance, tokens), then each run's times are set from the model, so
tests check tune's logic (calibration, prediction, recommendation) on given timings however
busy the machine is."""

from __future__ import annotations

from collections.abc import Sequence

from specdraft.bench.tune_bench import Bench
from specdraft.bench.tune_model import Measured
from specdraft.engine.spec_config import SpecConfig


class ModelledBench(Bench):
    """`Bench` with modelled seconds: every target forward (prefill or verify, any token count:
    a memory-bound target) costs `verify_s`, every draft step `draft_s`; nothing else costs time."""

    def __init__(self, *args, verify_s: float, draft_s: float, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.verify_s, self.draft_s = verify_s, draft_s

    def time_verify(self, sizes: Sequence[int], advance=lambda: None) -> dict[int, float]:
        return {size: self.verify_s for size in sizes}

    def run(self, spec: SpecConfig | None) -> Measured:
        measured = super().run(spec)
        m = measured.metrics
        m.time_prefill_s = m.num_requests * self.verify_s
        m.time_verify_s = m.num_verify_steps * self.verify_s
        m.time_draft_s = m.num_verify_steps * (spec.num_steps if spec else 0) * self.draft_s
        m.time_other_s = 0.0
        return measured


def modelled_bench(target, draft, prompts, cfg, verify_s: float, draft_s: float) -> ModelledBench:
    """A ModelledBench of `tune`'s arguments."""
    return ModelledBench(target, draft, prompts, cfg, verify_s=verify_s, draft_s=draft_s)
