"""FC-09: training accuracy high, serving acceptance collapsing at later positions (rope settings
differing between trainer and engine). Doctor lints rope theta / scaling, partial rotary and max
positions against training and the target, and its offline multi-step run (own states fed back)
flags the positions that fall far below training."""

from __future__ import annotations

import json

import pytest

from specdraft.doctor import run_doctor
from specdraft.export import export_draft
from tests.support.doctor_helpers import draft_checkpoint, edit_config, one_thread, trained_world  # noqa: F401


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    root = tmp_path_factory.mktemp("fc09")
    draft, target = draft_checkpoint(root)
    return draft, target


def rope(draft, target, tmp_path, edit):
    export_draft(draft, tmp_path / "out", engine="vllm", target=target)
    edit_config(tmp_path / "out", edit)
    return run_doctor(tmp_path / "out", target=target, engine="vllm").finding(
        "rope_matches_training"
    )


def test_case_fc09_rope_theta_differs(ckpt, tmp_path):
    finding = rope(*ckpt, tmp_path, lambda c: c.update(rope_theta=500000.0))
    assert finding.verdict == "fail"
    assert (
        "rope_theta 500000.0 (config.json, what the engines use) vs 10000.0 (training)"
        in finding.evidence
    )
    assert finding.fix.startswith("write the trained values into config.json, or re-export it")


def test_case_fc09_a_target_with_another_rope_names_the_target_as_the_fix(ckpt, tmp_path):
    """The drafter's config is as trained and the target's rope differs: re-exporting cannot help."""
    import shutil

    draft, target = ckpt
    moved = shutil.copytree(target, tmp_path / "target")

    def set_theta(config):
        if isinstance(config.get("rope_parameters"), dict):
            config["rope_parameters"]["rope_theta"] = 500000.0
        config["rope_theta"] = 500000.0

    edit_config(moved, set_theta)
    finding = run_doctor(draft, target=moved).finding("rope_matches_training")
    assert finding.verdict == "fail", finding
    assert "the target's rope_theta 500000.0 (target " in finding.evidence
    assert "vs 10000.0 (the target at training)" in finding.evidence
    assert finding.fix.startswith(
        "serve the target the drafter was trained on, or train a drafter for this target"
    )
    assert rope(
        draft, target, tmp_path / "x", lambda c: c.update(rope_theta=500000.0)
    ).fix.startswith("write the trained")


def test_case_fc09_only_rope_parameters_is_flagged_unless_the_legacy_default(ckpt, tmp_path):
    """Rope only under rope_parameters: older loaders ignore it and build rope_theta 10000 without
    scaling, so theta 10000 is the same rope (issue #34 item 7: it failed); another theta fails."""

    def only_parameters(theta):
        def edit(config):
            del config["rope_theta"], config["rope_scaling"]
            config["rope_parameters"] = {"rope_theta": theta, "rope_type": "default"}

        return edit

    finding = rope(*ckpt, tmp_path / "default", only_parameters(10000.0))
    assert finding.verdict == "pass", finding
    assert "given under rope_parameters only, which older loaders ignore" in finding.evidence
    finding = rope(*ckpt, tmp_path / "moved", only_parameters(500000.0))
    assert (
        finding.verdict == "fail"
        and "older loaders ignore it and use rope_theta 10000" in finding.evidence
    )
    assert finding.fix.startswith(
        "write rope_theta 500000.0 and rope_scaling None at the top level of config.json"
    )


def test_case_fc09_scaling_positions_and_partial_rotary(ckpt, tmp_path):
    finding = rope(
        *ckpt,
        tmp_path,
        lambda c: c.update(
            rope_scaling={"rope_type": "linear", "factor": 4.0},
            max_position_embeddings=1024,
            partial_rotary_factor=0.5,
        ),
    )
    assert finding.verdict == "fail" and "partial_rotary_factor 0.5" in finding.evidence
    finding = rope(
        *ckpt,
        tmp_path / "s",
        lambda c: c.update(
            rope_scaling={"rope_type": "linear", "factor": 4.0}, max_position_embeddings=1024
        ),
    )
    assert finding.verdict == "fail"
    assert (
        'rope_scaling {"factor": 4.0, "rope_type": "linear"} (config.json, what the engines use) vs None '
        "(training)" in finding.evidence
    )
    assert (
        "max_position_embeddings 1024 (config.json, what the engines use) vs 256 (training)"
        in finding.evidence
    )


def test_case_fc09_matching_rope_passes(ckpt, tmp_path):
    assert rope(*ckpt, tmp_path, lambda c: None).verdict == "pass"


def test_case_fc09_offline_run_flags_later_positions(tmp_path_factory, tmp_path):
    world = trained_world(tmp_path_factory)
    export_draft(world.draft, tmp_path / "out", engine="vllm", target=world.target)
    file = tmp_path / "out" / "specdraft_manifest.json"
    manifest = json.loads(file.read_text())
    first = manifest["training"]["validation"]["accuracy"][0]
    # training reported (as with a trainer whose attention differs from the engine's) near-perfect
    # later steps: the offline run, which feeds back the drafter's own states, does not reach them
    manifest["training"]["validation"]["accuracy"] = [first, 0.98, 0.98]
    file.write_text(json.dumps(manifest))
    finding = run_doctor(
        tmp_path / "out", target=world.target, engine="vllm", samples=world.samples
    ).finding("offline_acceptance_matches_training")
    assert (
        finding.verdict == "fail" and "far below training at positions [2, 3]" in finding.evidence
    )


def test_case_fc09_a_drafters_own_rope_is_its_own_choice(ckpt, tmp_path):
    """SpecForge's Llama-3-8B config: no rope keys (10000), 2048 positions, under a target of other
    rope and reach; no manifest. Its config is its only record: a pass that names the shorter reach
    (this failed before: "no rope_theta key (only rope_parameters)", then rope vs the target)."""
    import shutil

    draft, target = ckpt
    bare = shutil.copytree(draft, tmp_path / "bare")
    (bare / "specdraft_manifest.json").unlink()
    edit_config(
        bare,
        lambda c: (
            c.pop("rope_theta"),
            c.pop("rope_scaling"),
            c.update(max_position_embeddings=128),
        ),
    )
    moved = shutil.copytree(target, tmp_path / "target")
    edit_config(
        moved,
        lambda c: c.update(
            rope_theta=500000.0, rope_parameters={"rope_theta": 500000.0, "rope_type": "default"}
        ),
    )
    finding = run_doctor(bare, target=moved).finding("rope_matches_training")
    assert finding.verdict == "pass", finding
    assert (
        "rope_theta 10000.0, rope_scaling None, max positions 128: as its config.json declares"
        in finding.evidence
    )
    assert (
        "the drafter's own 128 positions are fewer than the target's 256: keep prompt + output within 128"
        in finding.evidence
    )
    assert "rope_parameters" not in finding.evidence
