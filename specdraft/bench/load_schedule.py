"""What `tune --concurrency` concludes (`LoadReport`): the schedule from each measured batch
size's chosen setting (`tune_load.tune_load`: a chain, a tree or none), as vLLM's
`num_speculative_tokens_per_batch_size`, as SGLang's adaptive config, and as the file
`specdraft serve --spec-schedule FILE` reads (`engine.schedule.read_schedule`); with the launch lines.
How each engine reads them: `conventions.spec_schedule`.

The rows: measured batch sizes b_1 < ... < b_n with chosen settings S_1..S_n of depths K_1..K_n
give [1, b_2 - 1, K_1], [b_2, b_3 - 1, K_2], ..., [b_n, max_num_seqs, K_n] (a size between two
measured ones takes the smaller one's setting; the last row runs to vLLM's max_num_seqs, where
vLLM's lookup ends), adjacent rows of one setting merged; checked by
`engine.schedule.BatchSchedule`. A row whose setting is a tree is written for vLLM and SGLang as
the tree's depth K (num_speculative_tokens, SGLang's steps: both take a chain length per batch
size, so they draft a chain of K there; SGLang's adaptive steps run topk 1 only), and for
`specdraft serve` as the tree itself (the file's `schedule.TREES_KEY`).
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specdraft.bench.tune_load import Level, LoadModel
from specdraft.bench.tune_model import TuneConfig
from specdraft.bench.tune_report import (
    dflash_export_hint,
    existing_for,
    export_command_line,
    served_path,
)
from specdraft.checkpoint.dflash import is_dflash_drafter
from specdraft.conventions.spec_schedule import VLLM_SCHEDULE_KEY
from specdraft.engine.schedule import BatchSchedule
from specdraft.engine.spec_config import SpecConfig
from specdraft.export import launch_command
from specdraft.files import atomic_write_text

SCHEDULE_FILE = "spec_schedule.json"  # for `specdraft serve --spec-schedule`
SGLANG_ADAPTIVE_FILE = "sglang_adaptive.json"  # for SGLang's --speculative-adaptive-config


def level_schedule(levels: list[Level], max_num_seqs: int) -> BatchSchedule:
    """The schedule of the levels' chosen settings (module docstring), its trees with it; the
    last row ends at max(max_num_seqs, the largest measured batch size)."""
    starts = [1] + [level.batch_size for level in levels[1:]]
    ends = [s - 1 for s in starts[1:]] + [max(max_num_seqs, levels[-1].batch_size)]
    rows: list[list] = []  # [start, end, setting]
    for start, end, level in zip(starts, ends, levels):
        if rows and rows[-1][2] == level.chosen:
            rows[-1][1] = end
        else:
            rows.append([start, end, level.chosen])
    schedule = BatchSchedule.of([[lo, hi, spec.num_steps if spec else 0] for lo, hi, spec in rows])
    trees = [[lo, hi, s.topk, s.num_draft_tokens] for lo, hi, s in rows if s and not s.is_chain]
    return schedule.with_trees(trees)


def schedule_rows(levels: list[Level], max_num_seqs: int) -> list[list[int]]:
    """vLLM's [[min_batch, max_batch, K], ...] of `level_schedule` (a tree's row: its depth)."""
    return [list(entry) for entry in level_schedule(levels, max_num_seqs).entries]


@dataclass
class LoadReport:
    """The levels (batch sizes, ascending), the fitted `LoadModel`, the drafter's depth, vLLM's
    max_num_seqs the last row runs to; paths as given to tune; busy: the busy-machine note."""

    config: TuneConfig
    levels: list[Level]
    model: LoadModel
    depth: int
    max_num_seqs: int
    draft_path: str = "DRAFT"
    target_path: str = "TARGET"
    prompt_set: str = "given"
    num_prompts: int = 0
    busy: str | None = None

    def schedule(self) -> BatchSchedule:
        """The schedule, trees included, checked (`BatchSchedule`, `check_depth`)."""
        schedule = level_schedule(self.levels, self.max_num_seqs)
        schedule.check_depth(self.depth)
        return schedule

    def rows(self) -> list[list[int]]:
        """vLLM's rows of the schedule (a tree's row: its depth K)."""
        return [list(entry) for entry in self.schedule().entries]

    @property
    def max_k(self) -> int:
        """The deepest K of the schedule (0: speculation loses at every batch size)."""
        return max(k for _, _, k in self.rows())

    def vllm_flags(self) -> str:
        """`vllm serve` with num_speculative_tokens = the deepest K and the schedule, or the
        advice to launch without speculation; a DFlash drafter: the export that prints its line
        (`tune_report.dflash_export_hint`)."""
        if self.max_k == 0:
            return "launch without --speculative-config (speculation loses at every batch size)"
        if is_dflash_drafter(self.draft_path):
            return dflash_export_hint(self.draft_path, "vllm", self.max_k)
        draft = Path(served_path(self.draft_path, "vllm"))
        extra = {VLLM_SCHEDULE_KEY: self.rows()}
        line = launch_command("vllm", self.target_path, draft, SpecConfig.chain(self.max_k), extra)
        return f"{line} --max-num-seqs {self.max_num_seqs}"

    def export_command(self, engine: str) -> str | None:
        """`specdraft export ...` writing the drafter directory `engine`'s ("sglang" | "vllm")
        launch line names (`tune_report.export_command_line`, the deepest K's chain), or None:
        no speculation, the drafter serves as it is, or its export is on disk."""
        if self.max_k == 0:
            return None
        spec = SpecConfig.chain(self.max_k)
        return export_command_line(self.draft_path, self.target_path, engine, spec)

    def existing(self, engine: str) -> str | None:
        """The export of the drafter for `engine` already on disk (`tune_report.existing_for`)."""
        return existing_for(self.draft_path, engine) if self.max_k else None

    def served_path(self, engine: str) -> str:
        """The drafter directory `engine` loads (`tune_report.served_path`)."""
        return served_path(self.draft_path, engine)

    def sglang_adaptive(self) -> dict[str, Any] | None:
        """SGLang's adaptive config: each row's first batch size -> its K as the one candidate
        (fixed steps per size, the measured ones); None when no row speculates."""
        if self.max_k == 0:
            return None
        return {str(low): {"candidate_steps": [k]} for low, _, k in self.rows()}

    def sglang_flags(self, adaptive_file: str | Path = SGLANG_ADAPTIVE_FILE) -> str:
        """SGLang's launch line with the adaptive config file (EAGLE-3 chains, topk 1); a DFlash
        drafter: the export that prints its line (`tune_report.dflash_export_hint`)."""
        if self.max_k == 0:
            return "launch without --speculative-* flags (speculation loses at every batch size)"
        if is_dflash_drafter(self.draft_path):
            return dflash_export_hint(self.draft_path, "sglang", self.max_k)
        draft = Path(served_path(self.draft_path, "sglang"))
        line = launch_command("sglang", self.target_path, draft, SpecConfig.chain(self.max_k))
        return f"{line} --speculative-adaptive --speculative-adaptive-config " + shlex.quote(
            str(adaptive_file)
        )

    def serve_flags(self, schedule_file: str | Path = SCHEDULE_FILE) -> str:
        """`specdraft serve` with the schedule file (the drafter at the deepest K)."""
        target = shlex.quote(self.target_path)
        if self.max_k == 0:
            return f"specdraft serve --target {target} --no-spec"
        return (
            f"specdraft serve --target {target} --draft {shlex.quote(self.draft_path)} "
            f"--num-steps {self.max_k} --spec-schedule {shlex.quote(str(schedule_file))}"
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {
            "num_prompts": self.num_prompts,
            "prompt_set": self.prompt_set,
            "busy": self.busy,
            "max_new_tokens": self.config.max_new_tokens,
            "depth": self.depth,
            "model_s": {"a": self.model.a, "b": self.model.b, "plain": self.model.plain},
            "levels": [level_dict(level) for level in self.levels],
            **self.schedule().to_json(),
            "sglang_adaptive": self.sglang_adaptive(),
            "vllm_flags": self.vllm_flags(),
            "sglang_flags": self.sglang_flags(),
            "serve_flags": self.serve_flags(),
        }


def level_dict(level: Level) -> dict[str, Any]:
    """One batch size's plain decoding, candidates and chosen K, JSON-ready."""
    return {
        "batch_size": level.batch_size,
        "plain": {
            "predicted_tokens_per_s": level.plain_predicted_tps,
            "measured_tokens_per_s": level.plain_tps,
        },
        "candidates": [c.to_dict() for c in level.candidates.values()],
        "num_steps": level.chosen_k,
        "setting": None if level.chosen is None else spec_dict(level.chosen),
    }


def spec_dict(spec: SpecConfig) -> dict[str, int]:
    """A setting's num_steps, topk and num_draft_tokens."""
    return {
        "num_steps": spec.num_steps,
        "topk": spec.topk,
        "num_draft_tokens": spec.num_draft_tokens,
    }


def write_schedule_files(report: LoadReport, out_dir: str | Path) -> dict[str, Path]:
    """Write SCHEDULE_FILE ({VLLM_SCHEDULE_KEY: rows}, and the trees under
    `schedule.TREES_KEY` when a row runs one) and, when a row speculates, SGLANG_ADAPTIVE_FILE
    under out_dir (an existing directory): {what: path}."""
    out = Path(out_dir)
    written = {"serve": out / SCHEDULE_FILE}
    atomic_write_text(written["serve"], json.dumps(report.schedule().to_json()) + "\n")
    adaptive = report.sglang_adaptive()
    if adaptive is not None:
        written["sglang"] = out / SGLANG_ADAPTIVE_FILE
        atomic_write_text(written["sglang"], json.dumps(adaptive, indent=2) + "\n")
    return written
