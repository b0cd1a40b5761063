"""The demo reuses a cached stage only when its recorded settings are the requested ones (else it
redoes that stage and every later one, saying which settings changed), a moved demo directory
resumes, the batch adapts to few training documents, and the report names a drafter that barely
accepts and how many steps it was trained."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from specdraft.demo import cache, generation, stages
from specdraft.demo.cache import reconcile_cache, stages_to_redo
from specdraft.demo.config import DemoConfig
from specdraft.demo.report import (
    DemoReport,
    generate_command,
    report_markdown,
    summary,
    verdict_text,
)
from specdraft.demo.stages import train_batch_size
from specdraft.bench.speedup import timing_summary


def fake_outputs(out):
    """The files each cached stage leaves under out."""
    files = ["data/train.txt", "data/heldout.txt", "data/train.regen.jsonl", "data/train.regen.jsonl.settings.json",
             "store/index.json", "store-heldout/index.json", "train/draft/specdraft_manifest.json",
             "export/sglang/config.json", "target/config.json"]
    for name in files:
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text("{}")


def existing(out):
    return sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file() and p.name != "demo_settings.json")


def test_other_train_steps_redo_training_and_keep_the_earlier_stages(tmp_path):
    cfg = DemoConfig(out=tmp_path, train_steps=1000)
    reconcile_cache(cfg, lambda text: pytest.fail(f"a fresh directory needs no note: {text}"))
    fake_outputs(tmp_path)
    said = []
    reconcile_cache(replace(cfg, train_steps=200), said.append)
    assert len(said) == 1 and "--train-steps 1000 -> 200" in said[0]
    assert "redoing the train stage and every later one" in said[0]
    assert existing(tmp_path) == ["data/heldout.txt", "data/train.regen.jsonl", "data/train.regen.jsonl.settings.json",
                                  "data/train.txt", "store-heldout/index.json", "store/index.json", "target/config.json"]
    reconcile_cache(replace(cfg, train_steps=200), lambda text: pytest.fail(f"same settings: {text}"))
    fake_outputs(tmp_path)
    said = []
    reconcile_cache(cfg, said.append)  # and back: the 200-step drafter is not reused for 1000 either
    assert "--train-steps 200 -> 1000" in said[0] and not (tmp_path / "train").exists()


def test_other_num_train_redoes_every_stage_but_the_target(tmp_path):
    cfg = DemoConfig(out=tmp_path, num_train=800)
    reconcile_cache(cfg, print)
    fake_outputs(tmp_path)
    said = []
    reconcile_cache(replace(cfg, num_train=40, max_new_tokens=24), said.append)
    assert "--num-train 800 -> 40" in said[0] and "redoing the data stage" in said[0]
    assert existing(tmp_path) == ["target/config.json"]


def test_other_lengths_redo_regeneration_capture_and_training():
    old = cache.stage_settings(DemoConfig())
    stage, diffs = stages_to_redo(old, cache.stage_settings(DemoConfig(max_new_tokens=24)))
    assert (stage, diffs) == ("regenerate", ["max_new_tokens 96 -> 24"])
    assert stages_to_redo(old, cache.stage_settings(DemoConfig())) == (None, [])


def test_a_demo_directory_without_a_settings_record_is_redone(tmp_path):
    fake_outputs(tmp_path)  # made by a specdraft that recorded no settings
    said = []
    reconcile_cache(DemoConfig(out=tmp_path), said.append)
    assert "no demo_settings.json records the settings" in said[0]
    assert existing(tmp_path) == ["target/config.json"]


def test_the_record_names_paths_relative_to_out(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    cfg = DemoConfig(out=a, target=a / "target")
    assert cache.stage_settings(cfg)["regenerate"]["target"] == "--out/target"
    reconcile_cache(cfg, print)
    fake_outputs(a)
    shutil.copytree(a, b)
    reconcile_cache(DemoConfig(out=b, target=b / "target"), lambda text: pytest.fail(f"moved, not changed: {text}"))
    assert existing(b) == existing(a)


def test_a_copied_demo_directory_resumes_regeneration(tmp_path):
    data = tmp_path / "docs.txt"
    data.write_text("\n\n".join(f"Once upon a time there was a cat number {i} who liked fish." for i in range(3)))
    a, b = tmp_path / "a", tmp_path / "b"
    cfg = DemoConfig(out=a, data=data, num_train=2, num_heldout=1, max_new_tokens=4)
    target = stages.stage_target(cfg)
    reconcile_cache(cfg, print)
    train_file, _ = stages.stage_data(cfg)
    regen = stages.stage_regenerate(cfg, target, train_file)
    text = regen.read_text()
    shutil.copytree(a, b)
    shutil.rmtree(a)  # the old absolute paths no longer exist
    moved = replace(cfg, out=b)
    reconcile_cache(moved, lambda line: pytest.fail(f"moved, not changed: {line}"))
    train_file, _ = stages.stage_data(moved)
    # before the fix: "train.regen.jsonl was produced with other settings (backend, input differ)"
    regen = stages.stage_regenerate(moved, stages.stage_target(moved), train_file)
    assert regen.read_text() == text
    sidecar = json.loads((b / "data" / "train.regen.jsonl.settings.json").read_text())
    assert sidecar["input"] == str(train_file.resolve())


@pytest.mark.parametrize("num_samples,batch", [(2, 1), (3, 2), (8, 7), (9, 8), (10, 8), (800, 8)])
def test_the_batch_adapts_to_the_training_split(num_samples, batch):
    from specdraft.train.loop import TrainConfig, split_samples

    assert train_batch_size(num_samples, 8) == batch
    train_ids, _ = split_samples(num_samples, TrainConfig(val_fraction=stages.VAL_FRACTION, batch_size=batch))
    assert len(train_ids) >= batch  # at least one batch per epoch: the trainer accepts it


def test_two_training_documents_train_with_batch_one(tmp_path, monkeypatch):
    import specdraft.train.loop as loop

    seen = {}

    def train(config, store, out, **kwargs):
        seen["config"] = config
        raise RuntimeError("stop here")
    monkeypatch.setattr(loop, "train", train)
    store = tmp_path / "store"
    store.mkdir()
    (store / "index.json").write_text(json.dumps({"num_samples": 2}))
    with pytest.raises(RuntimeError, match="stop here"):
        stages.stage_train(DemoConfig(out=tmp_path, num_train=2, train_steps=5), store)
    assert seen["config"].batch_size == 1 and seen["config"].val_fraction == stages.VAL_FRACTION
    with pytest.raises(ValueError, match="at least 2 training documents"):
        DemoConfig(num_train=1)


def row(steps, tau, speedups):
    return {"num_steps": steps, "topk": 1, "num_draft_tokens": steps + 1, "accept_length": tau,
            "acceptance": [0.0] * steps, **timing_summary([1000.0 * s for s in speedups], [1000.0] * len(speedups))}


def test_a_drafter_that_accepts_nothing_is_named_not_a_busy_machine():
    rows = [row(1, 1.0, [0.8, 0.82, 0.79]), row(2, 1.01, [0.7, 0.72, 0.69])]
    text = verdict_text(rows, None, 3, 1.05, train_steps=5, num_train=10)
    assert text.startswith("No setting is recommended: the drafter barely accepts any draft token (best tau 1.01")
    assert "Train the drafter longer (--train-steps) or on more data (--num-train) (now --train-steps 5, " \
           "--num-train 10)" in text
    assert "busy" not in text
    accepting = [row(2, 2.1, [0.95, 0.97, 0.96])]  # a drafter that accepts: the timing is to blame
    assert "The machine may be busy" in verdict_text(accepting, None, 3, 1.05, train_steps=5, num_train=10)


def test_the_report_states_the_drafters_training_steps(tmp_path):
    sweep = [row(1, 1.0, [0.9, 0.9, 0.9])]
    baseline = {"accept_length": 1.0, "acceptance": [], **timing_summary([1000.0] * 3, [1000.0] * 3)}
    report = DemoReport(target="t", aux_layers=[2, 3, 4], baseline=baseline, sweep=sweep, tree=sweep[0],
                        verdict="v", drafter={"steps": 200, "batch_size": 8, "num_train": 800})
    text = report_markdown(report, DemoConfig(out=tmp_path))
    assert "Drafter: 200 optimizer steps (batch 8) on 800 training documents." in text


def test_the_drafter_path_is_as_given_under_out_on_the_first_run_and_a_rerun(tmp_path, monkeypatch):
    """The first run printed train's absolute path, a cached re-run the relative one: both now
    name it as the report path does, under the --out the user passed."""
    import specdraft.train.loop as loop

    def train(config, store, out, **kwargs):  # what train returns: the drafter under out, resolved
        (out / "draft").mkdir(parents=True)
        (out / "draft" / "specdraft_manifest.json").write_text(json.dumps({"training": {"steps": 5}}))
        return loop.TrainResult(5, 1.0, None, (out / "draft").resolve(), out / "metrics.jsonl")
    monkeypatch.setattr(loop, "train", train)
    monkeypatch.chdir(tmp_path)
    cfg = DemoConfig(out=Path("demo"), num_train=2, train_steps=5)
    said: list[str] = []
    first = stages.stage_train(cfg, tmp_path / "store", say=said.append)
    again = stages.stage_train(cfg, tmp_path / "store", say=said.append)
    assert first == again == (Path("demo/train/draft"), {"steps": 5}), said


def test_the_summary_names_a_generate_command_with_the_measured_setting(tmp_path):
    """The demo's last lines give a `generate` command with the recommended setting (generate's
    default, 3 steps, is another one), or the fastest one, said to be unrecommended."""
    sweep = [row(1, 1.8, [1.2, 1.2, 1.2]), row(4, 3.3, [1.5, 1.5, 1.5])]
    tree = {**row(4, 3.6, [1.3, 1.3, 1.3]), "topk": 2, "num_draft_tokens": 8}
    baseline = {"accept_length": 1.0, "acceptance": [], **timing_summary([1000.0] * 3, [1000.0] * 3)}
    report = DemoReport(target="demo/target", aux_layers=[2, 3, 4], baseline=baseline, sweep=sweep, tree=tree,
                        verdict="v", chosen={k: v for k, v in sweep[1].items()},
                        drafter={"dir": "demo/train/draft"})
    flags = "--target demo/target --draft demo/train/draft --num-steps 4 --topk 1 --num-draft-tokens 5"
    lines = summary(report, tmp_path).splitlines()
    assert f'try: specdraft generate {flags} --threads 1 --prompt "Once upon a time"' in lines
    assert f"serve: specdraft serve {flags} --threads 1 --port 8000" in lines
    report.chosen, report.tree = {}, {**tree, "speedup": 2.0}
    generate, serve = generate_command(report)
    assert generate.startswith("try: specdraft generate --target demo/target --draft "
                               "demo/train/draft --num-steps 4 --topk 2 --num-draft-tokens 8")
    assert generate.endswith("(the fastest setting here; none is recommended)")
    assert "--num-steps 4 --topk 2 --num-draft-tokens 8" in serve and serve.endswith("none is recommended)")
    report.threads = 4  # demo --threads 4: the printed lines run as the timing did
    assert all(" --threads 4 " in line for line in generate_command(report))


def test_a_rerun_reuses_the_timing_of_the_same_drafter_and_settings(tmp_path, monkeypatch):
    """The settings' timing (which picks the recommendation and the exports' setting) is cached in
    generation.json: a re-run with the same drafter, prompts and settings reuses it instead of a
    new noisy pick; a changed drafter file, other prompts, other timing settings or a file that
    does not parse are timed again."""
    timed: list[int] = []

    def stage_generate(cfg, target_dir, draft_dir, prompts):
        timed.append(len(timed))
        return {"tokens_per_s": 100.0 + len(timed)}, [{"num_steps": 1, "round": len(timed)}], {"topk": 2}

    monkeypatch.setattr(generation, "stage_generate", stage_generate)
    cfg = DemoConfig(out=tmp_path / "demo", num_train=2)
    draft = tmp_path / "demo" / "train" / "draft"
    draft.mkdir(parents=True)
    (draft / "model.safetensors").write_bytes(b"weights")
    said: list[str] = []
    run = lambda c=cfg, prompts=[[1, 2, 3]]: generation.stage_generation(c, tmp_path / "t", draft, prompts, said.append)
    first = run()
    assert run() == first and len(timed) == 1
    assert said == [f"generation: reused the timing in {cfg.out / 'generation.json'} (same drafter, prompts and "
                    "settings; delete it to time the settings again)"]
    (draft / "model.safetensors").write_bytes(b"retrained")
    assert run()[1] == [{"num_steps": 1, "round": 2}] and len(timed) == 2
    run(prompts=[[1, 2, 4]])
    run(replace(cfg, timing_repeats=3))
    assert len(timed) == 4
    (cfg.out / "generation.json").write_text("{not json")
    run(replace(cfg, timing_repeats=3))
    assert len(timed) == 5 and json.loads((cfg.out / "generation.json").read_text())["baseline"]["tokens_per_s"] == 105
