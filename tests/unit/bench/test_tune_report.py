"""tune recommends by demo's rule, with demo's code (specdraft.bench.speedup): median same-round speedup
with a lower quartile above 1x, ties within the noise go to the fewest draft tokens; and its
launch flags name an export, or the `specdraft export` to run first (fixed numbers, no model)."""

from __future__ import annotations

import json

import specdraft.bench.tune
import specdraft.bench.tune_report
import specdraft.demo.generation
import specdraft.demo.run
import specdraft.demo.verdict
from specdraft.bench import speedup
from specdraft.bench.tune_model import Candidate, Costs, TuneConfig
from specdraft.bench.tune_render import render
from specdraft.bench.tune_report import TuneReport, needs_export, settle
from specdraft.checkpoint import Manifest, describe_layout, save_draft
from specdraft.engine.spec_config import SpecConfig
from tests.support.engine_helpers import AUX_LAYERS, tiny_setup


def measured(spec: SpecConfig, speedups: list[float]) -> Candidate:
    """A candidate measured in len(speedups) rounds against plain decoding at 1000 tok/s."""
    timing = speedup.timing_summary([1000.0 * s for s in speedups], [1000.0] * len(speedups))
    return Candidate(spec, 1.5, 1000.0, 1.5, timing["tokens_per_s"], timing["speedup"], timing)


def report(
    candidates: list[Candidate], draft_path: str = "/ckpt/draft", target_path: str = "TARGET"
) -> TuneReport:
    cfg = TuneConfig(repeats=5)
    rec = settle(candidates, cfg.min_speedup)[0]
    chain = settle([c for c in candidates if c.spec.is_chain], cfg.min_speedup)[0]
    return TuneReport(
        cfg,
        2,
        {},
        Costs({1: 0.001}),
        1000.0,
        1000.0,
        candidates,
        None,
        rec,
        chain,
        draft_path,
        target_path,
    )


def test_demo_and_tune_share_one_implementation():
    for module, names in (
        (specdraft.demo.generation, ("timed_passes", "timing_summary")),
        (specdraft.demo.verdict, ("ties_at_top", "speedup_text")),
        (specdraft.demo.run, ("pick_setting",)),
    ):
        for name in names:  # each where the demo uses it
            assert getattr(module, name) is getattr(speedup, name)
    assert (
        specdraft.bench.tune.timed_passes is speedup.timed_passes
        and specdraft.bench.tune_report.pick_setting is speedup.pick_setting
    )


def test_ties_within_the_noise_go_to_the_fewest_draft_tokens():
    """The fresh-user case: steps 3 a hair faster than steps 2, well within the noise. The old rule
    (fastest wins) took steps 3; demo's picks steps 2, and tune now agrees and says why."""
    two = measured(SpecConfig.chain(2), [1.20, 1.10, 1.30, 1.15, 1.25])
    three = measured(SpecConfig.chain(3), [1.21, 1.12, 1.31, 1.16, 1.26])
    assert three.speedup > two.speedup
    rows = [two.row(), three.row()]
    assert speedup.pick_setting(rows, 1.05) is rows[0]
    assert settle([three, two], 1.05) == (two, [three, two])
    r = report([three, two])
    assert r.recommendation is two and r.vllm_recommendation is two
    text = render(r)
    assert (
        "recommendation: steps 2, topk 1, draft tokens 3: median 1200.0 tok/s measured, speedup 1.20x (1.15-1.25x)"
        in text
    )
    assert (
        "chosen among settings tied within the noise" in text
        and "steps 3, topk 1, draft tokens 4 1.21x" in text
    )
    assert (
        "the pick has the fewest draft tokens" in text
        and "lower quartile above 1x over 5 rounds" in text
    )
    data = json.loads(json.dumps(r.to_dict()))
    assert (
        data["recommendation"]["num_steps"] == 2
        and data["recommendation"]["timing"]["speedup_q1"] == 1.15
    )
    assert [t["num_steps"] for t in data["ties"]] == [3, 2]
    # clearly faster beyond the noise: the deeper setting wins, and no tie is mentioned
    fast = measured(SpecConfig.chain(3), [1.40, 1.38, 1.42, 1.39, 1.41])
    assert settle([two, fast], 1.05) == (fast, [fast])
    assert "tied within the noise" not in render(report([two, fast]))


def test_a_lower_quartile_below_1x_is_never_recommended():
    """Median 1.30x, but slower than plain decoding in two rounds of five: the old rule
    (speedup > min_speedup) recommended it."""
    shaky = measured(SpecConfig(3, 2, 7), [1.30, 0.80, 1.35, 0.90, 1.40])
    assert shaky.speedup > 1.05 and shaky.timing["speedup_q1"] < 1.0
    assert (
        not speedup.beats_plain(shaky.row(), 1.05)
        and speedup.pick_setting([shaky.row()], 1.05) is None
    )
    slow = measured(
        SpecConfig.chain(1), [1.02, 1.03, 1.01, 1.04, 1.02]
    )  # steady, but below min_speedup
    assert settle([shaky, slow], 1.05) == (None, [])
    r = report([shaky, slow])
    assert r.recommendation is None and r.vllm_recommendation is None
    text = render(r)
    assert "recommendation: no speculation: none beat plain decoding beyond the noise" in text
    assert "the best measured, steps 3, topk 2, draft tokens 7, reached 1.30x (0.90-1.35x)" in text
    assert (
        "launch without --speculative-* flags" in r.launch_flags("sglang")
        and "specdraft export" not in text
    )


def test_flags_name_an_export_or_the_export_to_run_first(tmp_path):
    setup = tiny_setup("llama")
    args = setup.target.args
    manifest = Manifest(
        draft=setup.untrained.cfg.to_dict(),
        aux_layers=list(AUX_LAYERS),
        target={"hidden_size": args.hidden_size, "num_layers": args.num_layers},
    )
    trained = save_draft(
        setup.untrained, tmp_path / "train" / "draft", manifest=manifest
    )  # specdraft layout
    official = save_draft(setup.untrained, tmp_path / "official", layout="sglang")
    speculators = save_draft(setup.untrained, tmp_path / "spec", layout="speculators", verifier="t")
    assert needs_export(str(trained), "sglang") and needs_export(str(trained), "vllm")
    assert not needs_export(str(official), "sglang") and not needs_export(str(official), "vllm")
    assert needs_export(str(speculators), "sglang") and not needs_export(str(speculators), "vllm")
    assert not needs_export("/ckpt/draft", "sglang")  # not on disk: named as given
    marked = Manifest.read(
        trained / "specdraft_manifest.json"
    )  # as `specdraft export` marks its copy
    marked.extra["export"] = {"engine": "sglang"}  # (tests/unit/export/test_run.py checks it)
    exported = save_draft(setup.untrained, tmp_path / "exported", manifest=marked)
    assert not needs_export(str(exported), "sglang")

    rec = measured(SpecConfig(3, 2, 7), [1.30, 1.28, 1.32, 1.29, 1.31])
    chain = measured(SpecConfig.chain(2), [1.20, 1.18, 1.22, 1.19, 1.21])
    r = report([rec, chain], str(trained), "/models/target")
    assert r.recommendation is rec and r.vllm_recommendation is chain
    out = f"{trained}-sglang"
    assert r.launch_flags("sglang") == (
        "python -m sglang.launch_server --model-path /models/target "
        "--speculative-algorithm EAGLE3 --speculative-draft-model-path "
        f"{out} --speculative-num-steps 3 --speculative-eagle-topk 2 "
        "--speculative-num-draft-tokens 7"
    )
    assert r.export_command("sglang") == (
        f"specdraft export {trained} {out} --engine sglang --target "
        "/models/target --num-steps 3 --topk 2 --num-draft-tokens 7"
    )
    assert r.launch_flags("vllm").startswith(
        "vllm serve /models/target --speculative-config "
    )  # export's launch line
    assert (
        json.loads(r.launch_flags("vllm").split("--speculative-config ")[1].strip("'"))["model"]
        == f"{trained}-vllm"
    )
    assert r.export_command("vllm") == (
        f"specdraft export {trained} {trained}-vllm --engine vllm --target "
        "/models/target --num-steps 2"
    )
    text = render(r)
    assert (
        f"first run {r.export_command('sglang')}" in text
        and f"first run {r.export_command('vllm')}" in text
    )
    assert f"{trained}: {describe_layout('specdraft', True)}; `specdraft export` checks" in text
    assert f"writes {out}: first run" in text  # where the new export goes
    # an export (the official layout) is launched from where it is, with no export step
    r = report([rec, chain], str(official))
    assert f"--speculative-draft-model-path {official} " in r.launch_flags("sglang")
    assert r.export_command("sglang") is None and "specdraft export" not in render(r)
    assert r.to_dict()["export_commands"] == {"sglang": None, "vllm": None}


def saved_with_manifest(setup, directory, export_engine: str | None = None):
    """The tiny untrained drafter saved with a manifest at `directory`; with export_engine, the
    manifest marked as `specdraft export` marks its copy (extra["export"])."""
    args = setup.target.args
    manifest = Manifest(
        draft=setup.untrained.cfg.to_dict(),
        aux_layers=list(AUX_LAYERS),
        target={"hidden_size": args.hidden_size, "num_layers": args.num_layers},
    )
    if export_engine:
        manifest.extra["export"] = {"engine": export_engine}
    return save_draft(setup.untrained, directory, manifest=manifest)


def test_flags_name_the_demos_export_when_it_is_on_disk(tmp_path):
    """tune after the demo: the launch lines name OUT/export/ENGINE, the exports the demo wrote,
    with no export step (they named new folders DRAFT-sglang / DRAFT-vllm); an export of
    another drafter there is not taken for it."""
    setup = tiny_setup("llama")
    draft = saved_with_manifest(setup, tmp_path / "out" / "train" / "draft")
    sglang = saved_with_manifest(setup, tmp_path / "out" / "export" / "sglang", "sglang")
    other = saved_with_manifest(setup, tmp_path / "out" / "export" / "vllm", "vllm")
    manifest = Manifest.read(other / "specdraft_manifest.json")
    manifest.data_hash = "another drafter's data"
    (other / "specdraft_manifest.json").write_text(manifest.to_json())
    rec = measured(SpecConfig.chain(2), [1.20, 1.18, 1.22, 1.19, 1.21])
    r = report([rec], str(draft), "/models/target")
    assert r.export_command("sglang") is None
    assert f"--speculative-draft-model-path {sglang} " in r.launch_flags("sglang")
    assert f"the line names its SGLang export, already at {sglang}" in render(r)
    assert r.served_path("vllm") == f"{draft}-vllm" and r.export_command("vllm") is not None


def test_inspect_doctor_and_tune_describe_the_training_layout_alike(tmp_path):
    """One truth: inspect's first line, doctor's specdraft_loads evidence and tune's line on the
    drafter it names all say what `checkpoint.describe_layout` says (tune said "not an export"
    while inspect and doctor said SGLang and vLLM load it)."""
    from typer.testing import CliRunner

    from specdraft.cli import app
    from specdraft.doctor import run_doctor

    setup = tiny_setup("llama")
    draft = saved_with_manifest(setup, tmp_path / "train" / "draft")
    described = describe_layout("specdraft", True)
    inspected = CliRunner().invoke(app, ["inspect", str(draft)], env={"COLUMNS": "300"}).output
    assert inspected.splitlines()[0] == f"{draft}: {described}"
    loads = run_doctor(draft).finding("specdraft_loads")
    assert f"({described})" in loads.evidence, loads
    rec = measured(SpecConfig.chain(2), [1.20, 1.18, 1.22, 1.19, 1.21])
    assert f"{draft}: {described}; " in render(report([rec], str(draft), "/models/target"))
