"""`specdraft demo --method dflash` (`demo.dflash`) on the bundled stories260K in seconds: it trains
a DFlash drafter beside the EAGLE-3 one on the same store, times plain decoding, EAGLE-3 chains and
DFlash blocks (every output the plain one), prints tau and the speedup of each, and a re-run
reuses both drafters."""

from __future__ import annotations

import io
import json
from dataclasses import replace

from rich.console import Console
from typer.testing import CliRunner

import specdraft.demo.config
import specdraft.demo.dflash
from specdraft.cli import app
from specdraft.demo.dflash import (
    EAGLE_CHAINS,
    REPORT_FILE,
    DFlashDemo,
    dflash_summary,
    run_dflash_demo,
)
from tests.support.demo import tiny_demo_config


def _data(tmp_path):
    data = tmp_path / "docs.txt"
    data.write_text(
        "\n\n".join(
            f"Once upon a time there was a cat number {i} who liked fish." for i in range(4)
        )
    )
    return data


def test_dflash_beside_eagle3_on_the_same_data(tmp_path):
    cfg = tiny_demo_config(  # blocks of 4 inside 6 new tokens: anchors to train on
        tmp_path / "demo", _data(tmp_path), method="dflash", dflash_steps=2, block_size=4
    )
    cfg = replace(cfg, max_new_tokens=6)
    said = io.StringIO()
    result = run_dflash_demo(cfg, Console(file=said, width=400))
    text = said.getvalue()
    assert "train: training the drafter" in text and "train: training the DFlash drafter" in text
    assert f"DFlash drafter: block size {cfg.block_size}, 2 layer(s), 2 optimizer steps" in text
    settings = [r["setting"] for r in result.rows]
    assert settings == [
        "plain",
        *(f"EAGLE-3 chain {n}" for n in EAGLE_CHAINS),
        "DFlash 3 drafts",  # 3 drafts, the whole block of 4
    ]
    assert result.rows[0]["accept_length"] == 1.0 and result.rows[0]["speedup"] == 1.0
    dflash = result.rows[-1]
    assert dflash["num_steps"] == 3 and len(dflash["acceptance"]) == 3
    summary = dflash_summary(result, cfg.out)
    assert "fastest EAGLE-3: EAGLE-3 chain" in summary and "fastest DFlash: DFlash" in summary
    saved = json.loads((cfg.out / REPORT_FILE).read_text())
    assert [r["setting"] for r in saved["rows"]] == settings
    for engine in ("vllm", "sglang"):  # exported, and doctor passes each export's own launch line
        deployed = saved["deployments"][engine]
        assert deployed["failed"] == [] and deployed["doctor"]["pass"] >= 5, deployed
        assert (cfg.out / "export-dflash" / engine / "config.json").is_file()
        assert f"DFlash for {engine}: " in summary and deployed["launch_command"] in summary
    assert "--speculative-num-draft-tokens 4" in saved["deployments"]["sglang"]["launch_command"]
    assert '"num_speculative_tokens": 3' in saved["deployments"]["vllm"]["launch_command"]
    again = io.StringIO()
    run_dflash_demo(cfg, Console(file=again, width=400))
    assert again.getvalue().count("train: reused from") == 2  # both drafters


def _row(setting: str, method: str, num_steps: int, tau: float, speedup: float) -> dict:
    timing = {"speedup": speedup, "speedup_q1": speedup, "speedup_q3": speedup}
    return {
        "setting": setting,
        "method": method,
        "num_steps": num_steps,
        "accept_length": tau,
        "tokens_per_s": 100.0 * speedup,
        "tokens_per_s_runs": [100.0 * speedup] * 2,
        **timing,
    }


def test_the_cli_runs_it_and_prints_the_comparison(tmp_path, monkeypatch):
    small = tiny_demo_config(tmp_path / "demo", _data(tmp_path), method="dflash")
    monkeypatch.setattr(specdraft.demo.config, "DemoConfig", lambda **kw: small)
    measured = DFlashDemo(
        "E",
        "D",
        2,
        [
            _row("plain", "plain", 0, 1.0, 1.0),
            _row("EAGLE-3 chain 3", "eagle3", 3, 2.0, 1.4),
            _row("DFlash 7 drafts", "dflash", 7, 2.5, 1.6),
        ],
    )
    seen = []
    monkeypatch.setattr(
        specdraft.demo.dflash, "run_dflash_demo", lambda cfg, console: seen.append(cfg) or measured
    )
    result = CliRunner().invoke(app, ["demo", "--out", str(small.out), "--method", "dflash"])
    assert result.exit_code == 0, result.output
    assert seen == [small]
    assert "fastest EAGLE-3: EAGLE-3 chain 3, tau 2.00, speedup 1.40x (1.40-1.40x)" in result.output
    assert "fastest DFlash: DFlash 7 drafts, tau 2.50, speedup 1.60x (1.60-1.60x)" in result.output


def test_the_summary_says_when_dflash_lost_to_plain_decoding(tmp_path):
    rows = [
        _row("plain", "plain", 0, 1.0, 1.0),
        _row("EAGLE-3 chain 3", "eagle3", 3, 2.0, 1.4),
        _row("DFlash 7 drafts", "dflash", 7, 1.5, 0.9),
    ]
    lost = dflash_summary(DFlashDemo("E", "D", 2, rows), tmp_path)
    assert "DFlash was not faster than plain decoding here (best 0.90x" in lost
    assert "without --method dflash" in lost  # where the EAGLE-3 report and launch lines are
    rows[-1] = _row("DFlash 7 drafts", "dflash", 7, 2.5, 1.6)
    assert "not faster" not in dflash_summary(DFlashDemo("E", "D", 2, rows), tmp_path)


def test_the_summary_warns_when_plain_decoding_varied_as_the_eagle3_demo_does(tmp_path):
    rows = [
        _row("plain", "plain", 0, 1.0, 1.0),
        _row("EAGLE-3 chain 3", "eagle3", 3, 2.0, 1.4),
        _row("DFlash 7 drafts", "dflash", 7, 2.5, 1.6),
    ]
    assert "varied" not in dflash_summary(DFlashDemo("E", "D", 2, rows), tmp_path)
    rows[0]["tokens_per_s_runs"] = [393.0, 969.0]
    summary = dflash_summary(DFlashDemo("E", "D", 2, rows), tmp_path)
    assert "Warning: plain decoding itself varied 147% between rounds" in summary
