"""`tune --suite`: `tune` on a suite's prompts, then the chosen setting per category.

The prompts are the suite's chats rendered with the target's own chat template (generation
prompt added), turn by turn: turn k of a question carries its earlier turns and the target's
own greedy answers to them (plain decoding, `max_new_tokens` each), as a server would see them.
`tune` runs on every prompt of the suite; then the recommended setting (else the chain probe,
`probe_steps` deep) runs on each category's prompts against plain decoding, once each: tau, p_k,
decode tokens/s and their ratio per category (`CategoryTune`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from specdraft.bench.suites import Suite
from specdraft.bench.tune import TunedPair, tune
from specdraft.bench.tune_bench import Bench
from specdraft.bench.tune_model import TuneConfig, spec_text
from specdraft.bench.tune_report import TuneReport
from specdraft.data.render import prompt_ids
from specdraft.engine.spec_config import SpecConfig


@dataclass
class CategoryTune:
    """One category under `spec`: prompts (every turn), tau, p_k, decode tokens/s with and without it."""

    category: str
    num_prompts: int
    spec: SpecConfig
    accept_length: float
    acceptance_per_position: list[float]
    tokens_per_s: float
    plain_tokens_per_s: float

    @property
    def speedup(self) -> float:
        return self.tokens_per_s / self.plain_tokens_per_s if self.plain_tokens_per_s else 0.0

    def to_dict(self) -> dict:
        return {
            "category": self.category,
            "num_prompts": self.num_prompts,
            "setting": spec_text(self.spec),
            "accept_length": self.accept_length,
            "acceptance_per_position": self.acceptance_per_position,
            "tokens_per_s": self.tokens_per_s,
            "plain_tokens_per_s": self.plain_tokens_per_s,
            "speedup": self.speedup,
        }


def suite_prompt_ids(
    tokenizer, suite: Suite, answer: Callable[[list[int]], str]
) -> dict[str, list[list[int]]]:
    """{category: the token ids of every turn's prompt} (module doc); answer(ids) -> the target's
    answer text to a prompt, fed back into the question's next turn."""
    out: dict[str, list[list[int]]] = {c: [] for c in suite.categories}
    for q in suite.questions:
        chat: list[dict] = []
        for k, turn in enumerate(q.turns):
            chat.append({"role": "user", "content": turn})
            ids = prompt_ids(tokenizer, chat)
            out[q.category].append(ids)
            if k + 1 < len(q.turns):
                chat.append({"role": "assistant", "content": answer(ids)})
    return out


def tune_categories(
    target, draft, cfg: TuneConfig, prompts: dict[str, list[list[int]]], spec: SpecConfig
) -> list[CategoryTune]:
    """`spec` and plain decoding on each category's prompts (one run each)."""
    rows = []
    for category, ids in prompts.items():
        bench = Bench(target, draft, ids, cfg)
        run, plain = bench.run(spec), bench.run(None)
        m = run.metrics
        rows.append(
            CategoryTune(
                category,
                len(ids),
                spec,
                m.accept_length,
                list(m.acceptance_per_position),
                run.tokens_per_s,
                plain.tokens_per_s,
            )
        )
    return rows


def tune_suite_paths(
    pair: TunedPair, suite: Suite, cfg: TuneConfig, progress: Callable[[str], None] | None = None
) -> tuple[TuneReport, list[CategoryTune]]:
    """`tune` on `suite` for a target and drafter on disk, and the per-category rows."""
    from specdraft.engine.speculate import SpeculativeEngine

    tokenizer, engine = pair.load(cfg)

    def answer(ids: list[int]) -> str:
        device = engine.target.output.weight.device
        plain = SpeculativeEngine(
            engine.target, None, None, None, len(ids) + cfg.max_new_tokens, device
        )
        return tokenizer.decode(
            plain.generate(ids, cfg.max_new_tokens).token_ids, skip_special_tokens=True
        )

    prompts = suite_prompt_ids(tokenizer, suite, answer)
    report = tune(
        engine.target,
        engine.draft,
        [p for ids in prompts.values() for p in ids],
        cfg,
        str(pair.draft_dir),
        progress,
    )
    report.target_path, report.prompt_set = str(pair.target_dir), f"the {suite.name} suite"
    chosen = category_setting(report)
    return report, tune_categories(
        engine.target, engine.draft, cfg, prompts, chosen
    ) if chosen else []


def category_setting(report: TuneReport) -> SpecConfig | None:
    """The setting the per-category rows run: the recommendation, else the fastest measured
    candidate (no speculation recommended: the rows show what each category misses by), else None
    (nothing measured)."""
    if report.recommendation is not None:
        return report.recommendation.spec
    measured = [c for c in report.candidates if c.measured_tps]
    return max(measured, key=lambda c: c.measured_tps).spec if measured else None


def render_categories(suite: Suite, rows: list[CategoryTune], recommended: bool = True) -> str:
    """The per-category table under the tune report; `recommended` False: its setting is the
    fastest measured one, tune recommending none (`category_setting`)."""
    which = (
        "the recommendation"
        if recommended
        else "the fastest measured; no speculation is recommended"
    )
    lines = [
        f"per category of {suite.name} ({spec_text(rows[0].spec)}: {which}; one run each against plain decoding):",
        f"  {'category':<14} {'prompts':>7} {'tau':>7} {'tok/s':>9} {'plain':>9} {'speedup':>8}  p_k",
    ]
    for r in rows:
        p = " ".join(f"{x:.2f}" for x in r.acceptance_per_position)
        lines.append(
            f"  {r.category:<14} {r.num_prompts:>7} {r.accept_length:>7.3f} {r.tokens_per_s:>9.1f} "
            f"{r.plain_tokens_per_s:>9.1f} {r.speedup:>7.2f}x  {p}"
        )
    return "\n".join(lines)
