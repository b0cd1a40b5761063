"""specdraft doctor on inputs it cannot judge: a corrupt config.json (the drafter's or the
--target's) or drafter weights cut short is an unusable input (one `error:` line, exit 2, no table), and too few scored
positions give no offline-acceptance verdict (a skip saying how many, not a fail)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from specdraft.cli import app
from specdraft.data.records import DataError
from specdraft.doctor import run_doctor
from specdraft.doctor.acceptance import MIN_SCORED
from specdraft.doctor.inputs import DoctorInputError
from specdraft.errors import SpecdraftError
from tests.support.doctor_helpers import draft_checkpoint, one_thread, random_samples  # noqa: F401

# A seeded (untrained) drafter whose manifest claims high training accuracy: offline far below.
TRAINING = {"validation": {"accuracy": [0.9, 0.8, 0.7]}}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """(draft dir, target dir) of a seeded drafter for a tiny 5-layer Llama."""
    return draft_checkpoint(tmp_path_factory.mktemp("inputs"), training=TRAINING)


def truncated_copy(src, dst):
    """A copy of directory `src` whose config.json lost its last 5 bytes (`truncate -s -5`)."""
    shutil.copytree(src, dst)
    file = dst / "config.json"
    file.write_bytes(file.read_bytes()[:-5])
    return dst


def doctor_cli(*args):
    return CliRunner().invoke(app, ["doctor", *map(str, args)], env={"COLUMNS": "200"})


@pytest.mark.parametrize("which", ["target", "draft"])
def test_corrupt_config_is_an_unusable_input(world, tmp_path, which):
    """A --target or CHECKPOINT whose config.json is not valid JSON: one line naming the file and
    the fix, exit 2, no table (run_doctor raises)."""
    draft, target = world
    bad = truncated_copy(target if which == "target" else draft, tmp_path / f"bad-{which}")
    result = (
        doctor_cli(draft, "--target", bad)
        if which == "target"
        else doctor_cli(bad, "--target", target)
    )
    assert result.exit_code == 2, result.output
    line = result.output.strip()
    assert len(line.splitlines()) == 1, result.output
    fix = "transformers model directory" if which == "target" else "re-export the drafter"
    assert line.startswith(f"error: {bad}/config.json: not valid JSON (") and fix in line
    assert not any(word in result.output for word in ("verdict", "SKIP", "FAIL", "point doctor at"))
    with pytest.raises(ValueError, match="config.json: not valid JSON"):
        run_doctor(draft, target=bad) if which == "target" else run_doctor(bad, target=target)


@pytest.mark.parametrize(
    "name, reading",
    [("model.safetensors", "safetensors"), ("pytorch_model.bin", "a PyTorch weights file")],
)
def test_truncated_drafter_weights_are_an_unusable_input_as_bad_json(
    world, tmp_path, name, reading
):
    """A CHECKPOINT whose weights file (model.safetensors or pytorch_model.bin) is cut short exits 2
    with one line, as bad JSON does (it was a FAIL row and exit 1)."""
    draft, target = world
    bad = tmp_path / "cut"
    shutil.copytree(draft, bad)
    weights = bad / name
    if name == "pytorch_model.bin":
        torch.save(load_file(str(bad / "model.safetensors")), weights)
        (bad / "model.safetensors").unlink()
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    result = doctor_cli(bad, "--target", target)
    assert result.exit_code == 2, result.output
    line = result.output.strip()
    assert len(line.splitlines()) == 1, result.output
    assert line.startswith(f"error: {weights}: cannot be read as {reading}, cut short or damaged (")
    assert line.endswith("restore the file from where the drafter came from, or re-export it")


def test_target_config_that_is_no_json_object_is_refused(world, tmp_path):
    draft, target = world
    shutil.copytree(target, tmp_path / "t")
    (tmp_path / "t" / "config.json").write_text("[]")
    with pytest.raises(
        ValueError, match=r"config.json: not a JSON object \(a list\); pass a transformers"
    ):
        run_doctor(draft, target=tmp_path / "t")


def write_samples(path, samples):
    path.write_text(
        "".join(
            json.dumps({"input_ids": s.input_ids, "loss_mask": s.loss_mask}) + "\n" for s in samples
        )
    )
    return path


def offline_finding(world, path: Path, num_samples: int):
    """Doctor's offline-acceptance finding on the world's drafter and target, over `num_samples`
    random samples (seed 3) written to `path`."""
    draft, target = world
    samples = write_samples(path, random_samples(num_samples, seed=3))
    report = run_doctor(draft, target=target, samples=samples)
    return report.finding("offline_acceptance_matches_training")


def test_one_tiny_sample_is_too_little_evidence_for_an_offline_verdict(world, tmp_path):
    finding = offline_finding(world, tmp_path / "one.jsonl", 1)
    assert finding.verdict == "skip", finding
    assert "positions scored over 1 samples" in finding.evidence
    assert f"at least {MIN_SCORED} needed" in finding.evidence
    assert "more samples" in finding.fix


def test_enough_samples_still_fail_the_same_drafter(world, tmp_path):
    finding = offline_finding(world, tmp_path / "many.jsonl", 16)
    assert finding.verdict == "fail", finding
    assert (
        "offline far below training" in finding.evidence and "positions scored" in finding.evidence
    )


def test_corrupt_manifest_names_a_fix_that_needs_no_manifest(world, tmp_path):
    """A drafter whose manifest is damaged fails key matching with the file in the evidence and
    the fix once: re-export from the run, or delete the manifest (not a bare "re-export")."""
    from specdraft.checkpoint import MANIFEST_FILE, MANIFEST_FIX

    draft, target = world
    shutil.copytree(draft, tmp_path / "bad")
    (tmp_path / "bad" / MANIFEST_FILE).write_text("{")
    finding = run_doctor(tmp_path / "bad", target=target).finding("keys_match_engine")
    assert finding.verdict == "fail", finding
    assert finding.evidence.startswith(f"{tmp_path / 'bad' / MANIFEST_FILE}: not valid JSON (")
    assert finding.fix == MANIFEST_FIX and "re-export" not in finding.evidence


def test_inputs_doctor_cannot_judge_are_doctor_input_errors(world, tmp_path):
    """Each is a SpecdraftError (one line at the CLI) and still a ValueError (exit 2)."""
    draft, target = world
    with pytest.raises(DoctorInputError, match=f"^{tmp_path / 'none'}: no such directory"):
        run_doctor(tmp_path / "none")
    with pytest.raises(DoctorInputError, match="max_samples must be >= 1"):
        run_doctor(draft, max_samples=0)
    with pytest.raises(DoctorInputError, match=f"^{tmp_path / 'x.jsonl'}: no such file"):
        run_doctor(draft, samples=tmp_path / "x.jsonl")
    assert issubclass(DoctorInputError, SpecdraftError) and issubclass(DoctorInputError, ValueError)


def test_samples_that_are_not_utf8_are_named_in_one_line(world, tmp_path):
    """A --samples file that is not UTF-8 text: a DataError naming it (was a bare decode error)."""
    draft, target = world
    bad = tmp_path / "chats.jsonl"
    bad.write_bytes(b'{"messages": [{"role": "user", "content": "\xff\xfe"}]}\n')
    with pytest.raises(DataError, match=f"^--samples {bad}: unreadable .*codec"):
        run_doctor(draft, target=target, samples=bad)
    result = doctor_cli(draft, "--target", target, "--samples", bad)
    assert result.exit_code == 2 and result.output.startswith(f"error: --samples {bad}: unreadable")
