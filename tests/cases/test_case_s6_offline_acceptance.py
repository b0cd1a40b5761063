"""Case S6, the seed's method: the drafter alone on samples, teacher-forced with the target's aux
states and its own states fed back, per position side by side with the training metrics. A
wiring fault (S1, S3) shows as a large gap, a quality problem as none. S5: the same per-position
acceptance says how many chain steps pay."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from specdraft.cli import app
from specdraft.doctor import run_doctor
from specdraft.export import export_draft
from tests.support.cli import cli_args
from tests.support.doctor_helpers import (
    edit_config,
    edit_weights,
    one_thread,  # noqa: F401
    rename_layer,
    trained_world,
)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return trained_world(tmp_path_factory)


@pytest.fixture(scope="module")
def healthy(world, tmp_path_factory):
    out = tmp_path_factory.mktemp("s6") / "vllm"
    export_draft(world.draft, out, engine="vllm", target=world.target)
    return out


def side_by_side(evidence: str) -> list[tuple[float, float]]:
    return [(float(t), float(o)) for t, o in re.findall(r"\d: ([\d.]+) / ([\d.]+)", evidence)]


def test_case_s6_healthy_wiring_matches_training(world, healthy):
    report = run_doctor(healthy, target=world.target, engine="vllm", samples=world.samples)
    finding = report.finding("offline_acceptance_matches_training")
    assert finding.verdict == "pass", finding
    assert "per position training (validation split) / offline" in finding.evidence
    rows = side_by_side(finding.evidence)
    assert len(rows) == 3 and all(abs(t - o) < 0.15 for t, o in rows), rows
    assert rows[0][0] > 0.6


def test_case_s6_s1_wiring_shows_as_a_large_gap(world, tmp_path):
    # SGLang >= 0.5.22 captures the embeddings on Llama-class targets, so it can serve [0, 3, 7]; it
    # also loads layers.0.* (>= 0.5.12, conventions.DRAFT_LOADING), so the layer is stored under a
    # prefix no engine reads
    export_draft(
        world.draft, tmp_path / "s", engine="sglang", target=world.target, sglang_version="0.5.22"
    )
    edit_weights(tmp_path / "s", lambda t: rename_layer(t, "midlayer.", "decoder."))
    report = run_doctor(
        tmp_path / "s",
        target=world.target,
        engine="sglang",
        sglang_version="0.5.22",
        samples=world.samples,
    )
    finding = report.finding("offline_acceptance_matches_training")
    assert finding.verdict == "fail"
    assert "10 parameters left at their initial values" in finding.evidence
    # fc and the head still carry the first step; the random layer collapses the later ones
    (_, first), *later = side_by_side(finding.evidence)
    assert all(t >= 0.5 and o < 0.2 for t, o in later) and first < 0.6, finding.evidence
    assert "keys (keys_match_engine failed)" in finding.fix
    assert report.finding("engine_captures_training_layers").verdict == "pass"


def test_case_s6_s3_wiring_shows_as_a_large_gap(world, healthy, tmp_path):
    export_draft(healthy, tmp_path / "w", engine="vllm", target=world.target)
    edit_config(tmp_path / "w", lambda c: c.update(eagle_aux_hidden_state_layer_ids=[3, 7, 10]))
    finding = run_doctor(
        tmp_path / "w", target=world.target, engine="vllm", samples=world.samples
    ).finding("offline_acceptance_matches_training")
    assert (
        finding.verdict == "fail"
        and "offline far below training at positions [1" in finding.evidence
    )
    assert "layers (engine_captures_training_layers failed)" in finding.fix


def test_case_s6_held_out_samples_show_no_gap(world, healthy, tmp_path):
    import json

    from tests.support.doctor_helpers import random_samples

    held_out = tmp_path / "held_out.jsonl"
    held_out.write_text(
        "".join(
            json.dumps({"input_ids": s.input_ids, "loss_mask": s.loss_mask}) + "\n"
            for s in random_samples(24, seed=7)
        )
    )
    finding = run_doctor(healthy, target=world.target, engine="vllm", samples=held_out).finding(
        "offline_acceptance_matches_training"
    )
    assert finding.verdict == "pass", finding


def test_case_s6_capture_store_as_samples(world, healthy):
    """The store the drafter was trained on (its data_hash is the manifest's) is compared with the
    training split's accuracy, not the validation split's, and the finding says it is training data."""
    finding = run_doctor(
        healthy, target=world.target, engine="vllm", samples=world.store, max_samples=16
    ).finding("offline_acceptance_matches_training")
    assert finding.verdict == "pass" and "16 samples" in finding.evidence
    assert "per position training (train split) / offline" in finding.evidence
    assert (
        "the samples are the drafter's training data (their data_hash is the manifest's): an optimistic "
        "check, held-out samples test what serving sees"
    ) in finding.evidence
    other = run_doctor(healthy, target=world.target, engine="vllm", samples=world.samples)
    assert "training data" not in other.finding("offline_acceptance_matches_training").evidence


def test_case_s6_the_training_data_as_input_ids_rows_is_named_training_data(
    world, healthy, tmp_path
):
    """The store's samples written as {"input_ids", "loss_mask"} rows, all of them: the same data_hash,
    so the finding says they are training data (token rows were never recognised)."""
    import json

    from specdraft.capture.store import CaptureStore

    store = CaptureStore(world.store)
    rows = tmp_path / "train_ids.jsonl"
    rows.write_text(
        "".join(
            json.dumps(
                {
                    "input_ids": store[i]["input_ids"].tolist(),
                    "loss_mask": store[i]["loss_mask"].int().tolist(),
                }
            )
            + "\n"
            for i in range(len(store))
        )
    )
    finding = run_doctor(
        healthy, target=world.target, engine="vllm", samples=rows, max_samples=16
    ).finding("offline_acceptance_matches_training")
    assert (
        "the samples are the drafter's training data (their data_hash is the manifest's)"
        in finding.evidence
    )


def test_case_s6_training_data_without_a_training_split_record_is_skipped(world, healthy, tmp_path):
    import json
    import shutil

    shutil.copytree(healthy, tmp_path / "d")
    manifest_file = tmp_path / "d" / "specdraft_manifest.json"
    manifest = json.loads(manifest_file.read_text())
    manifest["training"]["train"] = None
    manifest_file.write_text(json.dumps(manifest))
    finding = run_doctor(
        tmp_path / "d", target=world.target, engine="vllm", samples=world.store, max_samples=16
    ).finding("offline_acceptance_matches_training")
    assert finding.verdict == "skip", finding
    assert (
        "--samples is the drafter's training data (its data_hash is the manifest's) and the manifest records "
        "no training-split rates to compare with"
    ) in finding.evidence
    assert finding.fix == "pass held-out samples"


def test_case_s5_depth_past_useful_acceptance_fails(world, healthy):
    args = (
        'vllm serve T --speculative-config \'{"method": "eagle3", "num_speculative_tokens": 15}\''
    )
    finding = run_doctor(
        healthy, target=world.target, engine="vllm", engine_args=args, samples=world.samples
    ).finding("draft_depth_pays_off")
    assert finding.verdict == "fail" and "add < 0.1 expected tokens each" in finding.evidence
    assert re.search(r"use \d steps \(expected accept length [\d.]+\)", finding.fix)
    assert "specdraft bench" in finding.fix
    short = run_doctor(
        healthy,
        target=world.target,
        engine="vllm",
        samples=world.samples,
        engine_args=args.replace("15", "2"),
    ).finding("draft_depth_pays_off")
    assert short.verdict == "pass"


def test_case_s6_cli_prints_both_side_by_side(world, healthy):
    result = CliRunner().invoke(
        app,
        cli_args("doctor", healthy, target=world.target, engine="vllm", samples=world.samples),
        env={"COLUMNS": "240"},
    )
    assert result.exit_code == 0, result.output
    assert "offline_acceptance_matches_training" in result.output
    assert "training (validation split) / offline" in result.output


def test_case_s6_gap_without_a_static_fault_points_at_the_samples(world, healthy, tmp_path):
    """A gap that no wiring check explains (here: a damaged midlayer, every key, shape and id
    in order) names the samples as a cause, besides the wiring to look at."""
    import shutil

    import torch

    shutil.copytree(healthy, tmp_path / "d")

    def damage(tensors):
        gen = torch.Generator().manual_seed(0)
        for name in [k for k in tensors if k.startswith("midlayer.") and k.endswith("proj.weight")]:
            tensors[name] = torch.randn(
                tensors[name].shape, generator=gen, dtype=tensors[name].dtype
            )

    edit_weights(tmp_path / "d", damage)
    report = run_doctor(tmp_path / "d", target=world.target, engine="vllm", samples=world.samples)
    finding = report.finding("offline_acceptance_matches_training")
    assert finding.verdict == "fail", finding
    assert not [f.check for f in report.failed if f.check != "offline_acceptance_matches_training"]
    assert "none of the static checks failed" in finding.fix
    assert "samples unlike the training data" in finding.fix
