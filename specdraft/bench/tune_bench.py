"""What runs and times the settings tune considers: engines over one target and drafter on the
prompts, at temperature 0 (`Bench`)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence

import torch

from specdraft.bench.config import BenchInputError
from specdraft.bench.tune_model import Measured, TuneConfig
from specdraft.draft import Eagle3Draft
from specdraft.engine.fast_model import FastTarget, causal_mask
from specdraft.engine.requests import SpecMetrics
from specdraft.engine.spec_config import SpecConfig
from specdraft.engine.speculate import SpeculativeEngine

WARMUP_TOKENS = 8


class Bench:
    """Builds engines over one target + drafter and runs them on the prompts (T = 0)."""

    def __init__(
        self,
        target: FastTarget,
        draft: Eagle3Draft,
        prompts: Sequence[Sequence[int]],
        cfg: TuneConfig,
    ) -> None:
        self.target, self.draft, self.prompts, self.cfg = (
            target,
            draft,
            [list(p) for p in prompts],
            cfg,
        )
        self.device = target.output.weight.device
        if not self.prompts or not all(self.prompts):
            raise BenchInputError("tune needs at least one prompt, none of them empty")
        longest_tree = max(
            cfg.max_tree_tokens, cfg.depth + 1, cfg.current.num_draft_tokens if cfg.current else 0
        )
        self.max_seq_len = max(map(len, self.prompts)) + cfg.max_new_tokens + longest_tree
        if self.max_seq_len > target.args.max_position_embeddings:
            raise BenchInputError(
                f"longest prompt + max_new_tokens {cfg.max_new_tokens} + tree {longest_tree} = "
                f"{self.max_seq_len} exceeds the target's max_position_embeddings "
                f"{target.args.max_position_embeddings}: use shorter prompts or fewer tokens"
            )

    def engine(self, spec: SpecConfig | None) -> SpeculativeEngine:
        """A fresh engine (plain decoding for spec None)."""
        return SpeculativeEngine(
            self.target, self.draft if spec else None, spec, None, self.max_seq_len, self.device
        )

    def run(self, spec: SpecConfig | None) -> Measured:
        """Generate max_new_tokens for every prompt (after a short warm-up)."""
        engine = self.engine(spec)
        engine.generate(self.prompts[0], min(WARMUP_TOKENS, self.cfg.max_new_tokens))
        total = SpecMetrics()
        for prompt in self.prompts:
            total = total.merge(engine.generate(prompt, self.cfg.max_new_tokens).metrics)
        total.check()
        return Measured(spec, total)

    @torch.inference_mode()
    def time_verify(
        self, sizes: Sequence[int], advance: Callable[[], None] = lambda: None
    ) -> dict[int, float]:
        """Median seconds of one target forward (aux states included) over T tokens after a
        prefix of typical length, for each T in sizes (compiled: the verify's graph replay);
        `advance()` once per distinct T timed."""
        engine = self.engine(SpecConfig.chain(1))
        prefix = min(
            len(self.prompts[0]) + self.cfg.max_new_tokens // 2, self.max_seq_len - max(sizes)
        )
        vocab = self.target.args.vocab_size
        ids = torch.arange(prefix, device=self.device) % vocab
        engine.runner.forward(
            ids,
            torch.arange(prefix, device=self.device),
            0,
            causal_mask(0, prefix, self.max_seq_len, device=self.device),
        )
        times = {}
        for size in sorted(set(sizes)):
            tokens = torch.arange(size, device=self.device) % vocab
            positions = prefix + torch.arange(size, device=self.device)
            mask = causal_mask(prefix, size, self.max_seq_len, device=self.device)
            samples = []
            for _ in range(self.cfg.verify_repeats + 1):  # the first run warms up
                synchronize(self.device)
                start = time.perf_counter()
                engine.runner.forward(
                    tokens, positions, prefix, mask, graphed=True
                )  # as a verify runs
                synchronize(self.device)
                samples.append(time.perf_counter() - start)
            times[size] = statistics.median(samples[1:])
            advance()
        return times


def synchronize(device: torch.device) -> None:
    """Wait for queued GPU work (timing)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
