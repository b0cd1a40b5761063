"""A --target whose config transformers reads but whose model it cannot load (issue #34 item 9:
a Kimi-K2.5-style wrapper saved by another transformers release) is one line naming the
directory and the loader's reason, and every check that needs no target weights still runs; a
config transformers rejects is one `error:` line (exit 2), never a traceback."""

from __future__ import annotations

from typer.testing import CliRunner

from specdraft.cli import app
from specdraft.doctor import run_doctor
from tests.support.doctor_helpers import draft_checkpoint, edit_config, one_thread  # noqa: F401


def doctor_cli(*args):
    return CliRunner().invoke(app, ["doctor", *map(str, args)], env={"COLUMNS": "200"})


def test_a_target_transformers_cannot_load_skips_only_what_runs_it(tmp_path):
    draft, target = draft_checkpoint(tmp_path, arch="kimi_k25", num_layers=7, aux=(2, 3, 5))
    # 3 heads where the weights hold 4: from_pretrained raises RuntimeError (mismatched sizes)
    edit_config(target, lambda c: c["text_config"].update(num_attention_heads=3))
    report = run_doctor(draft, target=target, engine="sglang")
    width = report.finding("aux_width_on_target")
    assert width.verdict == "skip", width
    assert width.evidence.startswith(
        f"transformers cannot load the target {target} (RuntimeError: "
    )
    assert len(width.evidence.splitlines()) == 1
    for check in ("specdraft_loads", "keys_match_engine", "aux_ids_read_alike", "vocab_map_valid"):
        assert report.finding(check).verdict == "pass", report.finding(check)
    (note,) = [n for n in report.notes if "cannot load" in n]
    assert note.endswith("skipped aux_width_on_target; the other checks ran")
    result = doctor_cli(draft, "--target", target, "--engine", "sglang")
    assert (
        "Traceback" not in result.output
        and result.exception is None
        or (isinstance(result.exception, SystemExit))
    ), result.output
    assert f"transformers cannot load the target {target}" in " ".join(result.output.split())


def test_a_target_config_transformers_rejects_is_one_error_line(tmp_path):
    draft, target = draft_checkpoint(tmp_path, arch="kimi_k25", num_layers=7, aux=(2, 3, 5))
    edit_config(target, lambda c: c["text_config"].update(n_routed_experts="4"))
    result = doctor_cli(draft, "--target", target)
    assert result.exit_code == 2, result.output
    (line,) = result.output.strip().splitlines()
    assert line.startswith(f"error: {target}/config.json: transformers cannot read it (")
    assert "n_routed_experts" in line


def test_doctor_says_it_is_loading_the_target_while_it_loads(tmp_path, monkeypatch):
    """doctor printed nothing for ~11 s before its table (#35 item 4): loading the target now
    gets a status line (off a terminal once it has run `STATUS_AFTER_S`, here 0 s)."""
    import specdraft.train.progress

    monkeypatch.setattr(specdraft.train.progress, "STATUS_AFTER_S", 0.0)
    draft, target = draft_checkpoint(tmp_path)
    result = doctor_cli(draft, "--target", target)
    assert f"doctor: loading the target {target} ..." in result.output, result.output
