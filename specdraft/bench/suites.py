"""Evaluation suites: prompt sets by category, bundled or read from a user's file.

Bundled (specdraft/assets/suites/<dir>/, each with its LICENSE and SOURCE.md): "mt-bench" (the 80
two-turn MT-bench questions, 8 categories; lm-sys/FastChat, Apache-2.0), "humaneval" (the 164
HumanEval prompts, `task_id` and `prompt`; openai/human-eval, MIT) and "gsm8k" (25 GSM8K test
questions; openai/grade-school-math, MIT). Read from a file (`read_suite_file`, bench's
`--prompts FILE --format F`): "spec-bench" (Spec-Bench's question.jsonl: `category` and `turns`;
its 8 MT-bench categories form one multi-turn group, `SPEC_BENCH_MULTI_TURN`), "mt-bench" (the
same rows, categories as written), "humaneval" (openai/human-eval's HumanEval.jsonl(.gz):
`prompt`) and "gsm8k" (`question`). Spec-Bench is not bundled: it states no data licenses (its
qa / rag rows come from Natural Questions, CC BY-SA 3.0).
"""

from __future__ import annotations

import gzip
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from specdraft.errors import SpecdraftError

MT_BENCH_CATEGORIES = (
    "writing",
    "roleplay",
    "reasoning",
    "math",
    "coding",
    "extraction",
    "stem",
    "humanities",
)
SPEC_BENCH_MULTI_TURN = "multi-turn"  # Spec-Bench's name for its MT-bench group
BUNDLED = {
    "mt-bench": ("mt_bench", "mt-bench"),
    "humaneval": ("humaneval", "humaneval"),
    "gsm8k": ("gsm8k", "gsm8k"),
}  # name -> (dir, format)
FORMATS = ("spec-bench", "mt-bench", "humaneval", "gsm8k")


class SuiteError(SpecdraftError, ValueError):
    """An unknown suite name (the message lists the suites) or a bad suite file (names file and line)."""


@dataclass(frozen=True)
class Question:
    """One suite item: its category and its user turns (one, or several asked turn by turn)."""

    category: str
    turns: tuple[str, ...]


@dataclass(frozen=True)
class Suite:
    """A named prompt set; `categories` in order of first appearance."""

    name: str
    questions: tuple[Question, ...]

    @property
    def categories(self) -> list[str]:
        return list(dict.fromkeys(q.category for q in self.questions))

    def in_category(self, category: str) -> list[Question]:
        return [q for q in self.questions if q.category == category]


def suite_names() -> list[str]:
    """The bundled suites' names."""
    return sorted(BUNDLED)


def load_suite(name: str) -> Suite:
    """A bundled suite by name; SuiteError listing the suites (and --prompts FILE --format) for
    any other name."""
    if name not in BUNDLED:
        raise SuiteError(
            f"no suite {name!r}: the suites are {', '.join(suite_names())}; give another "
            f"prompt set as --prompts FILE --format {'|'.join(FORMATS)}"
        )
    folder, fmt = BUNDLED[name]
    text = (resources.files("specdraft.assets") / "suites" / folder / "question.jsonl").read_text(
        "utf-8"
    )
    return Suite(name, _questions(text, fmt, f"suite {name}"))


def read_suite_file(path: str | Path, fmt: str) -> Suite:
    """The suite in a user's file of format `fmt` (`FORMATS`; .gz read as gzip). Raises
    SuiteError for an unknown format, a missing or unreadable file, or a row that is not of the
    format."""
    if fmt not in FORMATS:
        raise SuiteError(f"--format {fmt!r}: use one of {', '.join(FORMATS)}")
    path = Path(path)
    if not path.is_file():
        raise SuiteError(f"{path}: no such file (a {fmt} question file)")
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            text = f.read()
    except OSError as e:  # no permission; a .gz that is no gzip file (gzip.BadGzipFile)
        raise SuiteError(f"{path}: cannot be read ({e.strerror or e}); give a {fmt} file") from None
    except UnicodeDecodeError:
        raise SuiteError(f"{path}: not UTF-8 text; give a {fmt} file (JSONL)") from None
    return Suite(f"{fmt} ({path.name})", _questions(text, fmt, str(path)))


def _questions(text: str, fmt: str, name: str) -> tuple[Question, ...]:
    questions = []
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            questions.append(_question(line, fmt, f"{name}:{number}"))
    if not questions:
        raise SuiteError(f"{name}: no questions")
    return tuple(questions)


ROW_FIELDS = {
    "spec-bench": '{"category", "turns": [...]}',
    "mt-bench": '{"category", "turns": [...]}',
    "humaneval": '{"task_id", "prompt"}',
    "gsm8k": '{"question"}',
}


def _question(line: str, fmt: str, where: str) -> Question:
    from specdraft.data.records import json_line

    row = json_line(line, SuiteError, where, f"a {fmt} file has one {ROW_FIELDS[fmt]} per line")
    if not isinstance(row, dict):
        row = {}
    if fmt in ("spec-bench", "mt-bench"):
        category, turns = row.get("category"), row.get("turns")
        if fmt == "spec-bench" and category in MT_BENCH_CATEGORIES:
            category = SPEC_BENCH_MULTI_TURN
    else:
        category, turns = fmt, [row.get("prompt" if fmt == "humaneval" else "question")]
    if not (
        isinstance(category, str)
        and isinstance(turns, list)
        and turns
        and all(isinstance(t, str) and t for t in turns)
    ):
        raise SuiteError(f"{where}: expected {ROW_FIELDS[fmt]} with non-empty text (a {fmt} file)")
    return Question(category, tuple(turns))
