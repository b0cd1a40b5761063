"""`specdraft doctor`'s table at a narrow terminal: nothing cut, nothing past the edge."""

from __future__ import annotations

import pytest
from rich.console import Console

from specdraft.doctor import Report, report_table
from specdraft.doctor.run import Finding

EVIDENCE = (
    "SGLang reads eagle_aux_hidden_state_layer_ids [1, 2, 3] as hidden_states indices [2, 3, 4] "
    "but the drafter was trained on [1, 2, 3], so every step it would see the layers shifted by one; "
    "config read from /ckpt/llama-3.1-8b-instruct/eagle3/sglang/config.json"
)
FIX = "re-export with `specdraft export --engine sglang`, which converts the ids to the engine's own reading"
LONG_TOKEN = (
    "/" + "/".join(f"folder{i:02d}" for i in range(12)) + "/config.json"
)  # longer than any column


def rendered(report: Report, width: int) -> list[str]:
    console = Console(width=width, record=True, file=open("/dev/null", "w"))
    console.print(report_table(report, "specdraft doctor /checkpoints/drafter"))
    return console.export_text().splitlines()


@pytest.mark.parametrize("width", [80, 120])
def test_table_keeps_every_word_of_evidence_and_fix_within_the_width(width):
    report = Report(
        [
            Finding("values_finite", "pass", "every weight is finite"),
            Finding("engine_captures_training_layers", "fail", EVIDENCE, FIX),
            Finding("online_acceptance", "skip", "no --server", "pass a live server URL"),
            Finding("target_matches_training", "pass", f"trained for target {LONG_TOKEN}"),
        ]
    )
    lines = rendered(report, width)
    assert max(len(line) for line in lines) <= width
    text = "\n".join(lines)
    assert "…" not in text
    cells = " ".join(
        " ".join(line.replace("│", " ").split()) for line in lines
    )  # cells, read across wraps
    assert " ".join(EVIDENCE.split()) in cells
    assert "fix: " + " ".join(FIX.split()) in cells
    assert "fix: pass a live server URL" in cells
    assert (
        "every weight is finite" in cells
        and "fix: " not in cells.split("values_finite")[1].split("FAIL")[0]
    )
    assert LONG_TOKEN in "".join(cells.split())  # folded across lines, never cut
    for check in (
        "values_finite",
        "engine_captures_training_layers",
        "online_acceptance",
        "FAIL",
        "SKIP",
    ):
        assert check in cells


def test_the_skips_hint_never_asks_for_an_input_the_run_was_given():
    """A skip whose fix names --target (e.g. a manifest's fix) is not counted as one --target
    would run when --target was given."""
    skips = [
        Finding("a", "skip", "no manifest", "delete it, then pass --target DIR"),
        Finding("b", "skip", "no --server", "pass --server URL"),
    ]
    assert Report(skips).skips_enabled_by() == {"--target": 1, "--server": 1}
    assert Report(skips, given=("--target",)).skips_enabled_by() == {"--server": 1}
