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
from tests.support.dflash_world import LAYERS, MASK, NEW, PROMPT, dflash_world
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


def rates(evidence: str, section: int = 0) -> list[tuple[float, float]]:
    """The (training, drafter alone) pairs of a finding's "k: t / o" rows: the blocks' (section
    0) or the engine's rounds' (1)."""
    rows = evidence.split("drafter alone: ")[1 + section].split("; tau")[0].split(", ")
    return [tuple(float(x) for x in row.split(": ")[1].split(" / ")) for row in rows]


def test_training_records_the_block_acceptance_the_replay_reproduces(world):
    manifest = json.loads((world.draft / "specdraft_manifest.json").read_text())
    record = manifest["training"]["validation"]
    p = record["block_acceptance"]
    assert len(p) == 3 and p[0] >= p[1] >= p[2] and p[0] > 0.5, record
    assert record["block_tau"] == pytest.approx(1 + sum(p))
    assert record["blocks"] == 60 * 8  # 60 validation samples x 8 anchors each
    report = doctor(world)
    found = report.finding(CHECK)
    assert found.verdict == "pass", found
    pairs = rates(found.evidence)
    assert [t for t, _ in pairs] == [round(x, 2) for x in p]
    # held-out samples of the training distribution: a little below the validation split's
    assert all(0 <= t - o < 0.12 and o > 0.25 for t, o in pairs), found.evidence
    assert f"target layers {list(LAYERS)} (the layers config.json names)" in found.evidence
    assert "920 blocks:" in found.evidence  # 23 anchors in each 26-token answer of 40 samples


def engine_counts(world) -> tuple[int, list[int]]:
    """(rounds, accepted per position) of specdraft's engine at T = 0, the whole block's 3 drafts
    a round, on the held-out samples' prompts, counting the drafts inside the samples' text (the
    last round may accept drafts past max_new_tokens, which the engine's metrics count and no
    text holds); asserts it produces the samples' text. The target runs on the transformers path
    (its sliding window is not the fast path's)."""
    from specdraft.engine.hf_target import HFTarget
    from specdraft.engine.load import load_paired_draft
    from specdraft.engine.spec_config import SpecConfig
    from specdraft.engine.speculate import SpeculativeEngine
    from specdraft.targets import load_target

    target = HFTarget(load_target(world.target))
    draft = load_paired_draft(world.draft, target, world.target, "cpu", torch.float32).model
    engine = SpeculativeEngine(target, draft, SpecConfig.chain(3), None, PROMPT + NEW + 8, "cpu")
    rounds, accepted = 0, [0, 0, 0]
    kept = engine.proposer.accepted

    def accepted_in_text(req, emitted, path, aux) -> None:
        nonlocal rounds
        anchor = req.length - len(emitted)  # the round's root
        rounds += 1
        for k in range(min(len(emitted) - 1, PROMPT + NEW - 1 - anchor)):
            accepted[k] += 1
        kept(req, emitted, path, aux)

    engine.proposer.accepted = accepted_in_text
    for line in world.samples.read_text().splitlines():
        ids = json.loads(line)["input_ids"]
        out = engine.generate(ids[:PROMPT], NEW)
        assert ids[:PROMPT] + out.token_ids == ids  # the samples are the target's greedy text
    return rounds, accepted


def test_the_rounds_the_check_reports_are_the_engines_on_the_same_text(world):
    """On the target's greedy outputs the engine's rounds are the replay's, round for round (the
    engine's block at an anchor is the teacher-forced block there; fp32 both): the check reports
    exactly what the engine measures, beside the blocks at every anchor, whose uniform anchors
    give more (a round starts after a rejected draft)."""
    rounds, accepted = engine_counts(world)
    found = doctor(world).finding(CHECK)
    assert found.verdict == "pass", found
    assert f"{rounds} rounds:" in found.evidence
    engine = [a / rounds for a in accepted]
    assert [o for _, o in rates(found.evidence, 1)] == [round(p, 2) for p in engine]
    blocks = [o for _, o in rates(found.evidence)]
    assert all(b - e > 0.05 for b, e in zip(blocks, engine)), found.evidence


def test_training_records_the_rounds_the_engine_runs(world):
    """Training's validation walk (`replayed_acceptance`) is an engine's rounds: within 0.1 of the
    engine's own acceptance on held-out text of the same distribution (some 500 rounds on each
    side: a rate's standard error <= 0.5/sqrt(500) = 0.022, a difference's 0.032: 3 of them),
    and the check compares it with the rounds on the samples."""
    rounds, accepted = engine_counts(world)
    record = json.loads((world.draft / "specdraft_manifest.json").read_text())["training"]
    walked = record["validation"]["replayed_acceptance"]
    assert record["validation"]["replayed_rounds"] >= 500 and rounds >= 400
    assert all(abs(w - a / rounds) < 0.1 for w, a in zip(walked, accepted)), (walked, accepted)
    assert record["train"]["replayed_rounds"] == 0  # walked at validation only
    pairs = rates(doctor(world).finding(CHECK).evidence, 1)
    assert [t for t, _ in pairs] == [round(w, 2) for w in walked]


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
        manifest["training"][split]["block_acceptance"] = []  # as a record of an older specdraft
    file.write_text(json.dumps(manifest))
    found = doctor(world, draft).finding(CHECK)
    assert found.verdict == "skip", found
    assert "records no per-position block acceptance" in found.evidence
    assert "the drafter alone: p_k [" in found.evidence
