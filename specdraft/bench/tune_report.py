"""What tune concludes (`TuneReport`): the candidates, the recommendation by demo's rule
(`settle`, `bench.speedup`) and the commands that launch it on each engine."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specdraft.bench.speedup import pick_setting, ties_at_top
from specdraft.bench.tune_model import Candidate, Costs, Measured, TuneConfig
from specdraft.checkpoint import MANIFEST_FILE, CheckpointError, Manifest, detect_layout
from specdraft.checkpoint.dflash import is_dflash_drafter
from specdraft.export import existing_export, launch_command, suggested_export_dir

# the flags an engine's launch without speculation leaves out (`TuneReport.launch_flags`)
NO_SPECULATION_FLAGS = {"sglang": "--speculative-* flags", "vllm": "--speculative-config"}


@dataclass
class TuneReport:
    """Probes, costs, plain decoding, candidates (best predicted first), the current setting and
    the recommendations (None = no speculation); prompt_set: what the prompts were ("builtin", a
    file, a suite); busy: the busy-machine note of the load when the timing began (None: idle, a
    GPU)."""

    config: TuneConfig
    num_prompts: int
    probes: dict[int, Measured]
    costs: Costs
    plain_predicted_tps: float
    plain_measured_tps: float
    candidates: list[Candidate]
    current: Candidate | None
    recommendation: Candidate | None
    vllm_recommendation: Candidate | None
    draft_path: str = "DRAFT"
    target_path: str = "TARGET"
    prompt_set: str = "given"
    busy: str | None = None

    def prediction_error(self) -> float:
        """The largest factor between predicted and measured tokens/s over the measured
        candidates (1.0 = exact; 1.0 when nothing was measured)."""
        pairs = [(c.predicted_tps, c.measured_tps) for c in self.candidates if c.measured_tps]
        return max((max(p / m, m / p) for p, m in pairs if p > 0 and m > 0), default=1.0)

    def ties(self, chains_only: bool = False) -> list[Candidate]:
        """The measured candidates (chains only for vLLM) the recommendation was picked among."""
        return settle(
            [c for c in self.candidates if c.spec.is_chain or not chains_only],
            self.config.min_speedup,
        )[1]

    def recommended(self, engine: str) -> Candidate | None:
        """The recommendation for `engine` ("sglang" | "vllm"; vLLM's: the best chain, the only
        shape it runs), None for no speculation."""
        return self.recommendation if engine == "sglang" else self.vllm_recommendation

    def export_command(self, engine: str) -> str | None:
        """`specdraft export ...` to run before launching `engine` ("sglang" | "vllm") with the
        recommendation, or None (`export_command_line`)."""
        rec = self.recommended(engine)
        if rec is None:
            return None
        return export_command_line(self.draft_path, self.target_path, engine, rec.spec)

    def existing(self, engine: str) -> str | None:
        """The export of the drafter for `engine` already on disk (`existing_for`)."""
        return existing_for(self.draft_path, engine)

    def served_path(self, engine: str) -> str:
        """The drafter directory the engine loads (`served_path`)."""
        return served_path(self.draft_path, engine)

    def launch_flags(self, engine: str) -> str:
        """`engine`'s ("sglang" | "vllm") launch command of its recommendation (`recommended`), as
        `specdraft export` prints it (`export.launch_command`: SGLang's --speculative-* flags,
        vLLM's --speculative-config), or the advice to launch without speculation."""
        rec = self.recommended(engine)
        if rec is None:
            return f"launch without {NO_SPECULATION_FLAGS[engine]} (no speculation)"
        if is_dflash_drafter(self.draft_path):
            return self.dflash_flags(engine, rec)
        return launch_command(engine, self.target_path, Path(self.served_path(engine)), rec.spec)

    def dflash_flags(self, engine: str, rec: Candidate) -> str:
        """For a DFlash drafter: the export that prints the launch line (`dflash_export_hint`)."""
        return dflash_export_hint(self.draft_path, engine, rec.spec.num_steps)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""

        def one(c: Candidate | None) -> dict | None:
            return c.to_dict() if c else None

        return {
            "num_prompts": self.num_prompts,
            "prompt_set": self.prompt_set,
            "busy": self.busy,
            "max_new_tokens": self.config.max_new_tokens,
            "probes": {str(k): p.metrics.to_dict() for k, p in self.probes.items()},
            "costs_s": {
                "t_verify": self.costs.t_verify,
                "t_draft": self.costs.t_draft,
                "t_round": self.costs.t_round,
                "t_plain": self.costs.t_plain,
            },
            "plain": {
                "predicted_tokens_per_s": self.plain_predicted_tps,
                "measured_tokens_per_s": self.plain_measured_tps,
            },
            "candidates": [c.to_dict() for c in self.candidates],
            "current": one(self.current),
            "recommendation": one(self.recommendation),
            "vllm_recommendation": one(self.vllm_recommendation),
            "ties": [c.to_dict() for c in self.ties()],
            "prediction_error": self.prediction_error(),
            "sglang_flags": self.launch_flags("sglang"),
            "vllm_flags": self.launch_flags("vllm"),
            "export_commands": {e: self.export_command(e) for e in ("sglang", "vllm")},
        }


def settle(candidates: Any, min_speedup: float) -> tuple[Candidate | None, list[Candidate]]:
    """(the recommendation, the candidates tied at the top it was picked among) of the measured
    `candidates`, by `speedup.pick_setting` / `ties_at_top`, demo's rule; (None, []) when none
    beats plain decoding beyond the noise."""
    measured = [c for c in candidates if c.timing is not None]
    rows = [c.row() for c in measured]
    chosen = pick_setting(rows, min_speedup)
    ties = [
        c for c, r in zip(measured, rows) if any(r is t for t in ties_at_top(rows, min_speedup))
    ]
    return next((c for c, r in zip(measured, rows) if r is chosen), None), ties


def export_command_line(draft_path: str, target_path: str, engine: str, spec) -> str | None:
    """`specdraft export DRAFT OUT --engine E --target T --num-steps K` (SGLang: with --topk and
    --num-draft-tokens) writing the `served_path` that `engine`'s launch line under `spec` (a
    `SpecConfig`) names; None when the drafter directory serves as it is (`needs_export`) or its
    export is on disk already (`export.existing_export`)."""
    if not needs_export(draft_path, engine) or existing_for(draft_path, engine):
        return None
    tree = ["--topk", str(spec.topk), "--num-draft-tokens", str(spec.num_draft_tokens)]
    words = [draft_path, served_path(draft_path, engine), "--engine", engine]
    words += ["--target", target_path, "--num-steps", str(spec.num_steps)]
    return " ".join(
        ["specdraft export", *map(shlex.quote, words)] + (tree if engine == "sglang" else [])
    )


def dflash_export_hint(draft_path: str, engine: str, num_steps: int) -> str:
    """For a DFlash drafter at `num_steps` drafts a round: the `specdraft export` whose launch
    line serves it on `engine` (an engine's DFlash launch rules are `export.dflash`'s: vLLM drafts
    --num-steps N of the block, SGLang serves the trained block only)."""
    command = f"specdraft export {shlex.quote(draft_path)} OUT --engine {engine}"
    if engine == "vllm":
        command += f" --num-steps {num_steps}"
    served = "" if engine == "vllm" else " (SGLang serves the trained block only)"
    return (
        f"a DFlash drafter, {num_steps} drafts per round: `{command}` writes its export and "
        f"prints the launch line{served}"
    )


def needs_export(draft_dir: str, engine: str) -> bool:
    """Whether `engine` ("sglang" | "vllm") needs `specdraft export`'s output rather than
    `draft_dir`: True for specdraft's training layout (SGLang layout + specdraft manifest, what
    `specdraft train` writes, `checkpoint.describe_layout`) unless its manifest records an
    export (extra["export"]), and for the speculators layout under SGLang (vLLM reads it); an
    official SGLang-layout directory without a manifest serves as it is. A directory that is
    not a readable drafter (e.g. a placeholder) is named as given."""
    path = Path(draft_dir)
    try:
        layout = detect_layout(path)
    except (CheckpointError, OSError):
        return False
    if layout != "specdraft":
        return layout == "speculators" and engine == "sglang"
    try:
        return "export" not in Manifest.read(path / MANIFEST_FILE).extra
    except (CheckpointError, OSError, ValueError):
        return True


def existing_for(draft_path: str, engine: str) -> str | None:
    """The export of the drafter for `engine` already on disk (the demo's, or one an earlier
    tune line wrote: `export.existing_export`), when the drafter needs one; else None."""
    if not needs_export(draft_path, engine):
        return None
    found = existing_export(draft_path, engine)
    return None if found is None else str(found)


def served_path(draft_path: str, engine: str) -> str:
    """The drafter directory `engine` loads: the given one, its export on disk, or where
    `TuneReport.export_command` writes one (`export.suggested_export_dir`: DRAFT-ENGINE)."""
    if not needs_export(draft_path, engine):
        return draft_path
    return existing_for(draft_path, engine) or str(suggested_export_dir(draft_path, engine))
