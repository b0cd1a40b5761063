"""The demo pipeline end to end on the bundled stories260K, at a small budget."""

import json

import pytest

from specdraft.demo.config import DemoConfig
from specdraft.demo.inputs import split_documents
from specdraft.demo.report import summary
from specdraft.demo.run import run_demo


def test_split_documents_is_seeded_and_disjoint():
    text = "\n\n".join(f"doc {i}" for i in range(10))
    train, heldout = split_documents(text, 6, 2, seed=0)
    assert len(train) == 6 and len(heldout) == 2 and not set(train) & set(heldout)
    assert (train, heldout) == split_documents(text, 6, 2, seed=0)
    with pytest.raises(ValueError, match="holds 10 documents; the demo needs 11"):
        split_documents(text, 10, 1, seed=0)


def test_demo_runs_end_to_end_and_resumes(tmp_path):
    cfg = DemoConfig(
        out=tmp_path / "demo",
        num_train=48,
        num_heldout=3,
        train_steps=40,
        batch_size=8,
        max_new_tokens=24,
        sweep_steps=(1, 2),
        tree=(2, 2, 4),
        timing_repeats=3,
    )
    report = run_demo(cfg)  # raises if any speculative output differs from plain greedy decoding
    assert report.aux_layers == [2, 3, 4]
    assert {r["num_steps"] for r in report.sweep} == {1, 2}
    for run in [*report.sweep, report.tree]:
        assert run["accept_length"] == pytest.approx(1 + sum(run["acceptance"]))
    assert report.baseline["accept_length"] == 1.0
    assert not [f for f in report.doctor if f["verdict"] == "fail"], report.doctor
    assert {f["samples"] for f in report.doctor} == {"train", "held-out"}
    assert set(report.launch_commands) == {"vllm", "sglang", "speculators"}
    for name in ("report.md", "report.json", "acceptance.png", "throughput.png"):
        assert (cfg.out / name).stat().st_size > 0
    for run in [*report.sweep, report.tree, report.baseline]:
        assert (
            len(run["tokens_per_s_runs"]) == 3
            and run["speedup_low"] <= run["speedup"] <= run["speedup_high"]
        )
    chosen = json.loads((cfg.out / "report.json").read_text())["chosen"]
    if chosen:  # recommended only when faster than plain decoding in every round
        assert chosen["num_steps"] in (1, 2) and chosen["speedup_q1"] > 1.0
        assert report.verdict.startswith("Recommended setting")
    else:
        assert report.verdict.startswith("No setting is recommended")
    assert report.verdict in (cfg.out / "report.md").read_text()
    printed = summary(
        report, cfg.out
    )  # what the CLI prints last: the table, the verdict once, the paths
    assert printed.count(report.verdict) == 1 and "| num_steps | topk |" in printed
    assert f"drafter: {cfg.out / 'train' / 'draft'}" in printed
    assert f"plots: {cfg.out / 'acceptance.png'}, {cfg.out / 'throughput.png'}" in printed
    draft_files = sorted(p.name for p in (cfg.out / "train" / "draft").iterdir())
    again = run_demo(cfg)  # every stage cached: the same drafter, the same outputs
    assert sorted(p.name for p in (cfg.out / "train" / "draft").iterdir()) == draft_files
    assert again.baseline["outputs"] == report.baseline["outputs"]
    # the timing is reused too: the same measurement, hence the same recommendation and exports
    assert [r["tokens_per_s_runs"] for r in again.sweep] == [
        r["tokens_per_s_runs"] for r in report.sweep
    ]
    assert again.verdict == report.verdict and again.launch_commands == report.launch_commands
