"""Run every check the inputs allow and render the report (rich table or JSON).

Checks run in `checks.CHECKS` order; one that lacks an input is a skip that says why (never a
pass). The report fails when any check fails; `specdraft doctor` then exits non-zero.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from specdraft.checkpoint import wrong_dir_message
from specdraft.checkpoint.dflash import is_dflash_dir, records_dflash
from specdraft.client import check_url
from specdraft.doctor.checks import CHECKS
from specdraft.doctor.evidence import Evidence
from specdraft.doctor.file_evidence import Unavailable
from specdraft.doctor.inputs import DoctorInputError, DoctorInputs
from specdraft.doctor.verdict import VERDICTS, Result


@dataclass(frozen=True)
class Finding:
    """One check's conclusion: check (the function's name), verdict ("pass" | "fail" |
    "skip"), evidence (what was seen; for a skip, why it could not run), fix."""

    check: str
    verdict: str
    evidence: str
    fix: str = ""


@dataclass(frozen=True)
class Report:
    """Every finding of one doctor run, in check order, and notes about its inputs (e.g. the
    --samples records --skip-bad skipped)."""

    findings: list[Finding]
    notes: list[str] = field(default_factory=list)
    given: tuple[str, ...] = ()  # the INPUT_FLAGS the run was given

    @property
    def failed(self) -> list[Finding]:
        """The failing findings."""
        return [f for f in self.findings if f.verdict == "fail"]

    @property
    def ok(self) -> bool:
        """True when no check failed (skips do not count as passes, nor as failures)."""
        return not self.failed

    def counts(self) -> dict[str, int]:
        """Findings per verdict."""
        return verdict_counts(f.verdict for f in self.findings)

    def finding(self, check: str) -> Finding:
        """The finding of the check named `check` (KeyError when it did not run)."""
        for f in self.findings:
            if f.check == check:
                return f
        raise KeyError(check)

    def skips_enabled_by(self) -> dict[str, int]:
        """The inputs (INPUT_FLAGS) skipped checks name as what would run them, each with how many
        checks it would run, in INPUT_FLAGS order; a skip that names none (e.g. for want of the
        drafter's manifest), or only inputs the run was given, is not counted."""
        wanted = [
            _input_named(f"{f.fix} {f.evidence}", self.given)
            for f in self.findings
            if f.verdict == "skip"
        ]
        return {flag: wanted.count(flag) for flag in INPUT_FLAGS if flag in wanted}

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: findings, counts, skips_enabled_by and notes."""
        return {
            "ok": self.ok,
            "counts": self.counts(),
            "skips_enabled_by": self.skips_enabled_by(),
            "findings": [asdict(f) for f in self.findings],
            "notes": list(self.notes),
        }


# The inputs a skipped check may name as what would let it run, in the order the hint lists them.
INPUT_FLAGS = ("--target", "--engine-args", "--samples", "--server")


def _input_named(text: str, given: tuple[str, ...] = ()) -> str | None:
    """The INPUT_FLAGS not in `given` named first in `text`, or None."""
    found = [(text.find(f), f) for f in INPUT_FLAGS if f in text and f not in given]
    return min(found)[1] if found else None


def skips_text(enabled_by: dict[str, int]) -> str:
    """ "pass --target to run 3 more checks, --samples for 1": what the skipped checks need ("" if
    they name no input)."""
    parts = [f"{flag} for {n}" for flag, n in enabled_by.items()]
    if not parts:
        return ""
    first, n = next(iter(enabled_by.items()))
    return f"pass {first} to run {n} more check{'s' * (n != 1)}" + "".join(
        ", " + p for p in parts[1:]
    )


def run_doctor(checkpoint: str | Path, **given: Any) -> Report:
    """Check a draft checkpoint against its training record, its target and its deployment:
    every check the inputs allow, in `checks.CHECKS` order, one Finding each. `given`: the
    fields of `inputs.DoctorInputs` by keyword, declared there (paths as str or Path; None, ""
    or left out: not given); server, a live server's URL, is kept as its base URL
    (`client.check_url`, as bench checks it). Returns a Report; raises ValueError only for
    invalid arguments: DoctorInputError for a path that does not exist, a CHECKPOINT that is no drafter (e.g. the target) or a --target that is a drafter
    (`checkpoint.wrong_dir_message` words both), a config.json of either that is not valid JSON
    (`inputs.given_config`); what `DoctorInputs` refuses (a safetensors file cut short,
    aux_layers other than the manifest records); DataError for a --samples file that cannot be
    read (naming the file and line); BadURL for a server URL without http:// or https:// or a
    host. A checkpoint that can be read but is wrong is a failing finding."""
    if given.get("server") is not None:  # paths are appended
        given["server"] = check_url(given["server"], "--server")
    refuse_wrong_dirs(checkpoint, given.get("target"))
    return run_checks(*evidence_and_checks(DoctorInputs(checkpoint, **given)))


def evidence_and_checks(inputs: DoctorInputs) -> tuple[Evidence, tuple]:
    """The evidence and checks of the checkpoint: a block drafter's (`doctor.block`) for a DFlash
    drafter, or one whose manifest records DFlash training under another config.json (whose
    first fail is then `config_kind_matches_weights`'s), else EAGLE-3's (`checks.CHECKS`)."""
    path = Path(inputs.checkpoint)
    if is_dflash_dir(path) or (path.is_dir() and records_dflash(path)):
        from specdraft.doctor.block import BLOCK_CHECKS, BlockEvidence

        return BlockEvidence(inputs), BLOCK_CHECKS
    return Evidence(inputs), CHECKS


def refuse_wrong_dirs(checkpoint: str | Path, target: str | Path | None) -> None:
    """DoctorInputError when CHECKPOINT is no drafter or --target is no target
    (`checkpoint.wrong_dir_message`)."""
    for path, want, given_as in ((checkpoint, "drafter", ""), (target, "target", "--target")):
        wrong = wrong_dir_message(path, want, given_as) if path else None
        if wrong:
            raise DoctorInputError(wrong)


def run_checks(ev: Evidence, checks=CHECKS) -> Report:
    """Read --samples (a bad file is an error), run every check of `checks` in order, and
    report."""
    from specdraft.targets import no_progress_bars

    # transformers' bars (the target's "Loading weights") stay out of the report
    with no_progress_bars():
        ev.read_given_samples()
        for check in checks:
            ev.findings.append(_run_one(check, ev))
    given = tuple(f for f in INPUT_FLAGS if getattr(ev.inputs, f[2:].replace("-", "_")))
    return Report(list(ev.findings), ev.notes(), given)


def _run_one(check, ev: Evidence) -> Finding:
    try:
        result: Result = check(ev)
    except Unavailable as e:
        result = Result("skip", e.reason, e.fix)
    return Finding(check.__name__, result.verdict, result.evidence, result.fix)


STYLES = {"pass": "green", "fail": "bold red", "skip": "yellow"}


def verdict_counts(verdicts: Iterable[str]) -> dict[str, int]:
    """How many of `verdicts` are each of VERDICTS."""
    verdicts = list(verdicts)
    return {v: verdicts.count(v) for v in VERDICTS}


def counts_text(counts: dict[str, int]) -> str:
    """ "16 pass, 0 fail, 4 skipped": a report's verdicts in one phrase."""
    return f"{counts['pass']} pass, {counts['fail']} fail, {counts['skip']} skipped"


def report_table(
    report: Report, title: str = "specdraft doctor", expand: bool = True, wrap_at: int | None = None
):
    """A rich Table of one row per finding: its verdict, then the check's name over its evidence
    and, when it has one, "fix: ..." (report.notes are not in it). Two columns keep the evidence
    wide at 80 columns; words wrap whole, and a token longer than the line folds, never cut.
    expand False: as wide as its longest line, not the console's width. wrap_at (output
    redirected, whose console is unbounded: `cli.common.make_console`): the evidence column is
    that many columns wide, or as its longest word (a path) when wider, and the title stays one
    line, so text wraps at spaces only: no path is folded."""
    from rich.cells import cell_len
    from rich.table import Table
    from rich.text import Text

    hint = skips_text(report.skips_enabled_by())
    caption = counts_text(report.counts()) + (f"; {hint}" if hint else "")
    heading = (
        Text(title, no_wrap=True, overflow="ignore") if wrap_at else title
    )  # a terminal wraps it, as ever
    table = Table(title=heading, caption=caption, show_lines=True, expand=expand)
    table.add_column("verdict", no_wrap=True)
    cells = [_finding_cell(f) for f in report.findings]
    width = (
        max([wrap_at, *(cell_len(word) for cell in cells for word in cell.plain.split())])
        if wrap_at
        else None
    )
    table.add_column("check / evidence", overflow="fold", max_width=width)
    for f, cell in zip(report.findings, cells):
        table.add_row(Text(f.verdict.upper(), style=STYLES[f.verdict]), cell)
    return table


def _finding_cell(f: Finding):
    """A finding's check (bold), evidence, and "fix: ..." (cyan) when it has one, as rich Text."""
    from rich.text import Text

    cell = Text(f.check, style="bold")
    cell.append("\n" + f.evidence)
    if f.fix:
        cell.append("\nfix: " + f.fix, style="cyan")
    return cell


def report_json(report: Report) -> str:
    """The report as indented JSON."""
    return json.dumps(report.to_dict(), indent=2)
