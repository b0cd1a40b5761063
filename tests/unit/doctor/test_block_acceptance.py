"""The seeds' method for block drafters (`doctor.block_acceptance`, `doctor.block_replay`): a
DFlash drafter trained by `specdraft train --method dflash` replayed alone on held-out samples
matches its training record; a config whose target layer ids are shifted, a changed mask token
id or a draft layer's scrambled weights each fail it, naming the true cause."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from specdraft.doctor import run_doctor
from tests.support.dflash_world import LAYERS, MASK, dflash_world
from tests.support.doctor_helpers import edit_config, edit_weights, one_thread  # noqa: F401

CHECK = "block_acceptance_offline"


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return dflash_world(tmp_path_factory)


def doctor(world, draft=None, **given):
    given = {"target": world.target, "samples": world.samples, "max_samples": 40, **given}
    return run_doctor(draft or world.draft, **given)


def copy_of(world, tmp_path):
    return shutil.copytree(world.draft, tmp_path / "draft")


def rates(evidence: str) -> list[tuple[float, float]]:
    """The (training, drafter alone) pairs of a finding's "k: t / o" rows."""
    rows = evidence.split("drafter alone: ")[1].split("; tau")[0].split(", ")
    return [tuple(float(x) for x in row.split(": ")[1].split(" / ")) for row in rows]


def test_training_records_the_block_acceptance_the_replay_reproduces(world):
    manifest = json.loads((world.draft / "specdraft_manifest.json").read_text())
    record = manifest["training"]["validation"]
    p = record["replayed_acceptance"]
    assert len(p) == 3 and p[0] >= p[1] >= p[2] and p[0] > 0.5, record
    assert record["replayed_tau"] == pytest.approx(1 + sum(p))
    assert record["replayed_rounds"] == 60 * 8  # 60 validation samples x 8 anchors each
    report = doctor(world)
    found = report.finding(CHECK)
    assert found.verdict == "pass", found
    pairs = rates(found.evidence)
    assert [t for t, _ in pairs] == [round(x, 2) for x in p]
    # held-out samples of the training distribution: a little below the validation split's
    assert all(0 <= t - o < 0.12 and o > 0.25 for t, o in pairs), found.evidence
    assert f"target layers {list(LAYERS)} (the layers config.json names)" in found.evidence
    assert "920 blocks on 40 samples" in found.evidence  # 23 anchors in each 26-token answer


def test_the_capture_store_is_compared_with_the_training_split(world):
    found = doctor(world, samples=world.store, max_samples=200).finding(CHECK)
    assert found.verdict == "pass", found
    assert "p_k training (train split)" in found.evidence
    assert "the samples are the drafter's training data" in found.evidence


def test_an_engine_named_feeds_the_layers_it_captures(world):
    launch = "python -m sglang.launch_server --model-path T --speculative-algorithm DFLASH"
    found = doctor(world, engine_args=launch).finding(CHECK)
    assert found.verdict == "pass", found
    assert "the layers SGLang captures under this config" in found.evidence


def shift_layers(config):
    config["dflash_config"]["target_layer_ids"] = [
        i + 1 for i in config["dflash_config"]["target_layer_ids"]
    ]


def new_mask(config):
    config["dflash_config"]["mask_token_id"] = MASK - 1


def scramble_o_proj(tensors):
    g = torch.Generator().manual_seed(0)
    key = "layers.0.self_attn.o_proj.weight"
    flat = tensors[key].flatten()
    tensors[key] = flat[torch.randperm(flat.numel(), generator=g)].view(tensors[key].shape)


@pytest.mark.parametrize(
    "config_edit, weights_edit, failed_check, cause",
    [
        (
            shift_layers,
            None,
            "target_layers_as_engines_read",
            "layers (target_layers_as_engines_read",
        ),
        (None, scramble_o_proj, None, "the drafter's weights compute other drafts"),
    ],
    ids=["shifted-target-layers", "scrambled-draft-layer"],
)
def test_a_fault_fails_the_replay_naming_its_cause(
    world, tmp_path, config_edit, weights_edit, failed_check, cause
):
    draft = copy_of(world, tmp_path)
    if config_edit:
        edit_config(draft, config_edit)
    if weights_edit:
        edit_weights(draft, weights_edit)
    report = doctor(world, draft)
    found = report.finding(CHECK)
    assert found.verdict == "fail", found
    assert cause in found.fix, found.fix
    assert "far less than at training" in found.evidence
    below = [t - o for t, o in rates(found.evidence)]
    assert min(below) >= 0.25, found.evidence  # every position, well past the 0.2 margin
    failed = {f.check for f in report.failed}
    assert failed == {CHECK} | ({failed_check} if failed_check else set()), report.findings


def test_a_mask_token_edit_fails_the_load_and_the_mask_check(world, tmp_path):
    """config.json's mask token changed from training's: the one reader refuses it, so the load
    and the mask check fail with the cause and the replay (which needs the drafter) skips."""
    draft = copy_of(world, tmp_path)
    edit_config(draft, new_mask)
    report = doctor(world, draft)
    assert {f.check for f in report.failed} == {"dflash_files_load", "mask_token_matches_training"}
    assert "trained with mask token" in report.finding("dflash_files_load").evidence
    assert report.finding(CHECK).verdict == "skip"


def test_too_few_blocks_skip_with_the_figures(world):
    found = doctor(world, max_samples=3).finding(CHECK)
    assert found.verdict == "skip" and "69 blocks over the samples, at least 100" in found.evidence


def test_a_drafter_without_a_block_acceptance_record_skips_naming_it(world, tmp_path):
    draft = copy_of(world, tmp_path)
    file = draft / "specdraft_manifest.json"
    manifest = json.loads(file.read_text())
    for split in ("train", "validation"):
        manifest["training"][split]["replayed_acceptance"] = []
    file.write_text(json.dumps(manifest))
    found = doctor(world, draft).finding(CHECK)
    assert found.verdict == "skip", found
    assert "records no per-position block acceptance" in found.evidence
    assert "the drafter alone: p_k [" in found.evidence
