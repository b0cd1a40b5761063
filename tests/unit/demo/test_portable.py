"""report.md carries no path of the machine it was written on: launch lines and doctor evidence
name the demo's files relative to the report (a report copied to a GPU host with its folder
still runs), a target outside --out as $TARGET with one line saying what to set."""

from __future__ import annotations

from pathlib import Path

from specdraft.bench.speedup import timing_summary
from specdraft.demo.config import DemoConfig
from specdraft.demo.portable import portable_paths
from specdraft.demo.report import DemoReport, report_markdown, write_report
from specdraft.demo.stages import served_command


def demo_report(out: Path, target: Path) -> DemoReport:
    """A report whose launch lines and doctor evidence name `out` resolved, as export and
    doctor write them, and as given (relative to the working directory)."""
    row = {
        "num_steps": 1,
        "topk": 1,
        "num_draft_tokens": 2,
        "accept_length": 1.5,
        "acceptance": [0.5],
        **timing_summary([1500.0] * 3, [1000.0] * 3),
    }
    vllm = (
        f"vllm serve {target.resolve()} --speculative-config "
        f'\'{{"method": "eagle3", "model": "{(out / "export" / "vllm").resolve()}"}}\''
    )
    return DemoReport(
        target=str(target),
        aux_layers=[2, 3, 4],
        baseline={
            "accept_length": 1.0,
            "acceptance": [],
            **timing_summary([1000.0] * 3, [1000.0] * 3),
        },
        sweep=[row],
        tree=row,
        chosen=row,
        launch_commands={
            "vllm": vllm,
            "speculators": f"vllm serve {out.resolve()}/export/speculators",
        },
        doctor=[
            {
                "samples": "held-out",
                "check": "target_matches_training",
                "verdict": "pass",
                "evidence": f"trained for target {target.resolve()}; --target {target} is the same model.",
            }
        ],
        drafter={"dir": str(out / "train" / "draft"), "steps": 5},
    )


def test_report_paths_are_relative_to_the_report(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = Path("specdraft-demo")
    text = report_markdown(demo_report(out, out / "target"), DemoConfig(out=out))
    assert str(tmp_path) not in text and "specdraft-demo" not in text, text
    assert '"model": "./export/vllm"' in text and "vllm serve ./target --speculative-config" in text
    assert "`vllm serve ./export/speculators`" in text
    assert "(`speculators_config.verifier.name_or_path`: the target's path on this machine)" in text
    assert "trained for target ./target; --target ./target is the same model." in text
    assert "run these from inside it: every path in this report is relative to the folder" in text
    assert "$TARGET" not in text


def test_a_target_outside_the_demos_folder_is_a_placeholder_with_what_to_set(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out, target = Path("demo"), Path("models") / "pycode-25m"
    text = report_markdown(demo_report(out, target), DemoConfig(out=out, target=target))
    assert str(tmp_path) not in text and "models/pycode-25m" not in text, text
    assert "vllm serve $TARGET --speculative-config" in text
    assert "trained for target $TARGET; --target $TARGET is the same model." in text
    assert "Set `TARGET` to the target's directory on the machine that runs these" in text


def test_only_whole_paths_are_rewritten(tmp_path):
    out = tmp_path / "demo"
    text = f"{out}x/a, {out}.json, my{out}/b, {out}/c, {out}. end, {out}"
    assert portable_paths(text, out, None) == f"{out}x/a, {out}.json, my{out}/b, ./c, .. end, ."


def test_a_chat_template_outside_the_folder_is_copied_into_it_and_named_relatively(
    tmp_path, monkeypatch
):
    """demo --chat-template FILE: report.md's serve line names the copy in the demo's folder,
    relative to the report, never this machine's path to FILE."""
    monkeypatch.chdir(tmp_path)
    out, template = Path("demo"), (tmp_path / "templates" / "chat.jinja")
    template.parent.mkdir()
    template.write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    report = demo_report(out, out / "target")
    cfg = DemoConfig(out=out, chat_template=template)
    report.launch_commands["vllm"] = served_command(cfg, report.launch_commands["vllm"])
    write_report(report, cfg)
    text = (out / "report.md").read_text()
    assert str(tmp_path) not in text and "templates/chat.jinja" not in text, text
    assert "}' --chat-template ./chat_template/chat.jinja`" in text
    assert (out / "chat_template" / "chat.jinja").read_text() == template.read_text()
