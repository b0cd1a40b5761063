"""A demo re-run with the same settings says, in one line per stage, which cached outputs it
reuses, and shows no empty progress bar for them (fresh-user trial: bars stuck at 0%)."""

from __future__ import annotations

import io
import re

from rich.console import Console

from specdraft.demo.config import DemoConfig
from specdraft.demo.run import run_demo
from tests.support.demo import tiny_demo_config


def tiny_demo(tmp_path) -> DemoConfig:
    data = tmp_path / "docs.txt"
    data.write_text(
        "\n\n".join(
            f"Once upon a time there was a cat number {i} who liked fish." for i in range(4)
        )
    )
    return tiny_demo_config(tmp_path / "demo", data)


def demo_output(cfg: DemoConfig, capsys, width: int = 400) -> tuple[str, str]:
    """(what run_demo said on its console, what the stages wrote to stderr)."""
    said = io.StringIO()
    run_demo(cfg, Console(file=said, width=width))
    return said.getvalue(), capsys.readouterr().err


def test_a_cached_rerun_says_each_stage_is_reused_and_shows_no_bars(tmp_path, capsys):
    cfg = tiny_demo(tmp_path)
    said, err = demo_output(cfg, capsys)
    assert (
        "reused" not in said
        and "convert: the bundled stories260K (llama2.c) -> transformers Llama at " in said
    )
    assert (
        "regenerate: continuations of train.txt" in said and "train: training the drafter" in said
    )
    data, capture = (
        said.index(f"data: {cfg.num_train} training and "),
        said.index("capture: the target's aux states"),
    )
    assert (
        data < said.index("regenerate: continuations") < capture < said.index("train: training")
    )  # every stage said, in order
    exports = [
        f"{engine} -> {cfg.out / 'export' / engine} ("
        for engine in ("vllm", "sglang", "speculators")
    ]
    assert (
        all(e in said for e in exports) and "tensors bit-identical" in said
    )  # the export stage says so
    assert "100%" in err and "capture" in err  # the first run shows its bars
    counted = re.search(
        r"doctor: (\d+) checks, run on each of 2 sample sets \([^)]+\): (\d+) pass, 0 fail, "
        r"(\d+) skipped "
        r"\(report.md has the evidence\)",
        said,
    )
    assert counted and int(counted[1]) == int(counted[2]) + int(counted[3]), (
        said
    )  # it counts what it says
    # the stages print in the order they run: generation (which picks the exported setting) ends with
    # its result line before export and doctor start (it printed only its heading before them)
    order = [
        said.index(line)
        for line in (
            "speculative generation vs plain decoding",
            "speculative generation: plain decoding",
            "export: vllm ->",
            "doctor: ",
        )
    ]
    assert order == sorted(order), said

    said, err = demo_output(
        cfg, capsys, width=80
    )  # rich's width when stdout is no terminal: no wrapped lines
    out = cfg.out
    for stage, path in [
        ("convert", out / "target"),
        ("data", out / "data"),
        ("regenerate", out / "data" / "train.regen.jsonl"),
        ("capture", out / "store"),
        ("regenerate", out / "data" / "heldout.regen.jsonl"),
        ("capture", out / "store-heldout"),
        ("train", out / "train" / "draft"),
    ]:
        assert f"{stage}: reused from {path} (settings unchanged)" in said, said
    assert (
        "continuations of" not in said
        and "training the drafter" not in said
        and "-> transformers" not in said
    )
    # before the fix: "regenerate ━━━ 0% -:--:--" and "capture ━━━ 0/0 tokens -:--:--" on stderr
    assert "0%" not in err and "0/0" not in err and "━" not in err, err


def test_a_store_is_reused_only_when_finished_with_every_shard(tmp_path, capsys):
    import json

    from specdraft.demo.stages import store_complete

    cfg = tiny_demo(tmp_path)
    demo_output(cfg, capsys)
    store = cfg.out / "store"
    index = json.loads((store / "index.json").read_text())
    assert store_complete(store)
    (store / index["shards"][0]["file"]).rename(store / "moved")
    assert not store_complete(store)  # a shard file gone
    (store / "moved").rename(store / index["shards"][0]["file"])
    (store / "index.json").write_text(json.dumps({**index, "complete": False}))
    assert not store_complete(store)  # an interrupted capture
    assert not store_complete(tmp_path / "nothing")


def test_the_doctor_line_names_failed_checks_and_lint():
    from specdraft.demo.report import DemoReport, doctor_line

    report = DemoReport(
        target="t",
        aux_layers=[1],
        doctor=[
            {
                "samples": "train",
                "check": "keys",
                "verdict": "pass",
            },  # the same on both sets: one check
            {"samples": "train", "check": "acceptance", "verdict": "pass"},
            {"samples": "train", "check": "template", "verdict": "skip"},
            {"samples": "held-out", "check": "keys", "verdict": "pass"},
            {"samples": "held-out", "check": "acceptance", "verdict": "fail"},
            {"samples": "held-out", "check": "template", "verdict": "skip"},
        ],
        lint={
            "vllm": [{"check": "keys", "verdict": "fail"}],
            "sglang": [{"check": "keys", "verdict": "pass"}],
        },
    )
    assert doctor_line(report) == (
        "doctor: 3 checks, run on each of 2 sample sets (train, held-out): 1 pass, 1 fail, "
        "1 skipped; failed: acceptance (held-out), lint vllm: keys (report.md has the "
        "evidence)"
    )


def test_an_eagle31_demo_trains_exports_and_passes_the_norms_check(tmp_path):
    """--method eagle3.1 end to end: the drafter line names the method, every export carries its
    norms, and doctor's lint of the SGLang and vLLM exports passes norms_as_trained."""
    import json
    from dataclasses import replace

    cfg = replace(tiny_demo(tmp_path), method="eagle3.1")
    said = io.StringIO()
    report = run_demo(cfg, Console(file=said, width=400))
    assert "drafter: eagle3.1 (fc_norm, norm_output), 2 optimizer steps, at " in said.getvalue()
    for engine in ("vllm", "sglang", "speculators"):
        config = json.loads((cfg.out / "export" / engine / "config.json").read_text())
        assert config["fc_norm"] is True and config["norm_output"] is True, engine
    for engine in ("sglang", "vllm"):
        [norms] = [f for f in report.lint[engine] if f["check"] == "norms_as_trained"]
        assert norms["verdict"] == "pass" and norms["evidence"].startswith(
            "trained as eagle3.1 (fc_norm, norm_output); "
        ), norms
