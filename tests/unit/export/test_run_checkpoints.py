"""`specdraft export` of the intermediate checkpoints that `train --save-every` writes; inspect and
convert read them the same way (`checkpoint.load_draft`), doctor names the export that makes a
drafter of one.

Same tiny seeded target and synthetic store as tests/unit/train/test_loop.py.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from specdraft.checkpoint import CheckpointError, load_draft
from specdraft.export import export_draft
from specdraft.train.loop import train
from specdraft.train.run_dir import write_sharded_checkpoint
from specdraft.train.store_data import StoreData
from specdraft.train.trainer import Trainer
from tests.support.cli import flat, invoke
from tests.support.train_world import one_thread, small_config  # noqa: F401


@pytest.fixture(scope="module")
def run(store, tmp_path_factory):
    """A finished 6-step run with checkpoints at steps 3 and 6 (validation at both)."""
    out = tmp_path_factory.mktemp("export_ckpt") / "run"
    train(small_config(total_steps=6, save_every=3, eval_every=3), store, out, progress=False)
    return out


def checkpoint_weights(path) -> dict[str, torch.Tensor]:
    """The drafter tensors a step-N.pt holds, as an export names them (shared embedding left out)."""
    model = torch.load(path, weights_only=False)["model"]
    return {
        k.removeprefix("draft."): v for k, v in model.items() if k != "draft.embed_tokens.weight"
    }


def test_cli_exports_an_intermediate_checkpoint_and_its_manifest_says_which_step(run, tmp_path):
    step3 = run / "checkpoints" / "step-00000003.pt"
    result = invoke(["export", str(step3), str(tmp_path / "out"), "--engine", "sglang"])
    assert result.exit_code == 0, result.output
    assert (
        f"note: the drafter of training checkpoint {step3} (step 3); its manifest records the step"
        in flat(result.output)
    )
    written = load_file(str(tmp_path / "out" / "model.safetensors"))
    expected = checkpoint_weights(step3)
    assert written.keys() == expected.keys()
    for key, tensor in expected.items():
        assert torch.equal(written[key], tensor), key
    final = load_file(str(run / "draft" / "model.safetensors"))
    assert not torch.equal(
        final["fc.weight"], written["fc.weight"]
    )  # step 3's weights, not the end's

    manifest = json.loads((tmp_path / "out" / "specdraft_manifest.json").read_text())
    final_manifest = json.loads((run / "draft" / "specdraft_manifest.json").read_text())
    training = manifest.pop("training")
    assert training["steps"] == 3 and training["checkpoint"] == str(step3)
    assert training["train"]["step"] == 3 and training["validation"]["step"] == 3
    assert training["config"] == final_manifest["training"]["config"]
    assert manifest.pop("extra") == {"export": {"engine": "sglang"}}
    assert manifest == {k: v for k, v in final_manifest.items() if k not in ("training", "extra")}
    loaded = load_draft(tmp_path / "out")
    assert loaded.layout == "specdraft" and loaded.manifest.training["steps"] == 3


def test_a_sharded_checkpoint_exports_the_same_drafter(store, run, tmp_path):
    """The same step written as a torch.distributed.checkpoint directory (as several ranks write
    it) exports the same tensors and manifest as the step-N.pt file."""
    step3 = run / "checkpoints" / "step-00000003.pt"
    trainer = Trainer(small_config(total_steps=6, save_every=3, eval_every=3), StoreData(store))
    trainer.load_state(torch.load(step3, weights_only=False), step3)
    sharded = write_sharded_checkpoint(trainer, tmp_path / "sharded")
    assert sharded.name == "step-00000003" and (sharded / "trainer.pt").is_file()
    from_file = export_draft(step3, tmp_path / "a", engine="vllm")
    from_dir = export_draft(sharded, tmp_path / "b", engine="vllm")
    assert from_file.num_tensors == from_dir.num_tensors
    a, b = (
        load_file(str(tmp_path / "a" / "model.safetensors")),
        load_file(str(tmp_path / "b" / "model.safetensors")),
    )
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    ma, mb = (json.loads((tmp_path / d / "specdraft_manifest.json").read_text()) for d in "ab")
    assert mb["training"].pop("checkpoint") == str(sharded) and ma["training"].pop(
        "checkpoint"
    ) == str(step3)
    assert ma == mb


@pytest.mark.parametrize("command", ["export", "inspect", "convert"])
def test_a_checkpoint_without_manifest_names_the_command_that_makes_a_readable_drafter(
    run, tmp_path, command
):
    """Checkpoints of specdraft before they carried the manifest: a one-line error with the fix,
    true for every command that reads training checkpoints (it said "cannot be exported")."""
    state = torch.load(run / "checkpoints" / "step-00000003.pt", weights_only=False)
    del state["manifest"]
    old = tmp_path / "old" / "checkpoints" / "step-00000003.pt"
    old.parent.mkdir(parents=True)
    torch.save(state, old)
    args = {
        "export": ["export", str(old), str(tmp_path / "out"), "--engine", "sglang"],
        "inspect": ["inspect", str(old)],
        "convert": ["convert", str(old), str(tmp_path / "out"), "--layout", "speculators"],
    }[command]
    result = invoke(args)
    assert result.exit_code == 1
    assert result.output.startswith("error: ") and len(result.output.strip().splitlines()) == 1, (
        result.output
    )
    assert flat(result.output) == (
        f"error: {old}: this checkpoint carries no drafter manifest (written by an older specdraft), and its "
        f"drafter is built from one, so no command can read it; finish its run (specdraft train SOURCE "
        f"{tmp_path / 'old'} --resume) and pass {tmp_path / 'old' / 'draft'} instead"
    )
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("command", ["inspect", "export"])
def test_a_pt_file_that_is_no_specdraft_checkpoint_says_so(run, tmp_path, command):
    """A torch.save file of something else is named as no training checkpoint (it was told it came
    from an older specdraft and to resume a run in its grandparent folder); a .pt file that is no
    torch.save archive (cut short, damaged) is named as such, not as "a file" to replace by a directory."""
    foreign, junk = tmp_path / "dict.pt", tmp_path / "step-00000005.pt"
    torch.save({"a": 1}, foreign)
    junk.write_bytes(b"junk")
    tail = {"inspect": [], "export": [str(tmp_path / "out"), "--engine", "sglang"]}[command]
    result = invoke([command, str(foreign), *tail])
    assert result.exit_code == 1 and flat(result.output) == (
        f"error: {foreign}: a torch.save file but no specdraft training checkpoint (no step and config); "
        "pass a drafter directory (config.json, model.safetensors) or a training checkpoint "
        "(RUN/checkpoints/step-N.pt)"
    ), result.output
    result = invoke([command, str(junk), *tail])
    assert (
        result.exit_code == 2
        and "not a readable training checkpoint (no torch.save archive: cut short or "
        "damaged); pass another checkpoint of its run"
        in flat(result.output)
    ), result.output
    assert not (tmp_path / "out").exists()


def test_export_of_a_file_that_is_no_checkpoint_names_what_it_takes(run, tmp_path):
    weights = run / "draft" / "model.safetensors"
    with pytest.raises(
        CheckpointError,
        match=f"{weights} is a file but no training checkpoint; pass a drafter "
        r"directory .* or a training checkpoint \(RUN/checkpoints/step-N.pt\) "
        rf"\(a drafter here would be {run / 'draft'}\)",
    ):
        export_draft(weights, tmp_path / "out", engine="sglang")
    missing = invoke(
        ["export", str(tmp_path / "nowhere"), str(tmp_path / "out"), "--engine", "sglang"]
    )
    assert missing.exit_code == 2 and f"{tmp_path / 'nowhere'}: no such file or directory" in flat(
        missing.output
    )


@pytest.fixture(scope="module")
def sharded(store, run, tmp_path_factory):
    """Step 3 of `run` as a sharded step-N directory (as several ranks write it)."""
    step3 = run / "checkpoints" / "step-00000003.pt"
    trainer = Trainer(small_config(total_steps=6, save_every=3, eval_every=3), StoreData(store))
    trainer.load_state(torch.load(step3, weights_only=False), step3)
    return write_sharded_checkpoint(trainer, tmp_path_factory.mktemp("sharded"))


def convert_equals_export(ckpt, tmp_path, layout: str, engine: str) -> None:
    """`convert CKPT tmp_path/conv --layout LAYOUT` writes the tensors `export_draft` writes to
    tmp_path/exp for `engine`, bit for bit."""
    converted = invoke(["convert", str(ckpt), str(tmp_path / "conv"), "--layout", layout])
    assert converted.exit_code == 0, converted.output
    exported = export_draft(ckpt, tmp_path / "exp", engine=engine)
    a = load_file(str(tmp_path / "conv" / "model.safetensors"))
    b = load_file(str(tmp_path / "exp" / "model.safetensors"))
    assert a.keys() == b.keys() and exported.num_tensors == len(a)
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("form", ["file", "sharded"])
def test_inspect_and_convert_read_a_training_checkpoint_as_export_does(
    run, sharded, tmp_path, form
):
    ckpt = run / "checkpoints" / "step-00000003.pt" if form == "file" else sharded
    shown = invoke(["inspect", str(ckpt)])
    assert shown.exit_code == 0, shown.output
    assert flat(shown.output).startswith(
        f"{ckpt}: training checkpoint (step 3; export or convert writes its drafter files)"
    )
    assert "fc.weight" in shown.output and "audit: PASS" in shown.output
    keys = invoke(["inspect", str(ckpt), "--known-keys"])
    assert keys.exit_code == 0 and f"{ckpt}: a training checkpoint, no config.json" in flat(
        keys.output
    )
    convert_equals_export(ckpt, tmp_path, "specdraft", "sglang")
    manifest = json.loads((tmp_path / "conv" / "specdraft_manifest.json").read_text())
    assert manifest["training"]["steps"] == 3 and manifest["training"]["checkpoint"] == str(ckpt)


@pytest.mark.parametrize("form", ["file", "sharded"])
def test_doctor_refuses_a_training_checkpoint_with_the_export_that_makes_a_drafter(
    run, sharded, tmp_path, form
):
    ckpt = run / "checkpoints" / "step-00000003.pt" if form == "file" else sharded
    result = invoke(["doctor", str(ckpt)])
    assert result.exit_code == 2
    assert (
        f"{ckpt} is a training checkpoint, which no engine loads; doctor checks the files an engine does: "
        f"export it first (specdraft export {ckpt} OUT --engine sglang, vllm or speculators), then run doctor "
        "on OUT"
    ) in flat(result.output)
    out = tmp_path / "out"
    assert invoke(["export", str(ckpt), str(out), "--engine", "sglang"]).exit_code == 0
    followed = invoke(["doctor", str(out)])
    assert followed.exit_code == 0, followed.output


@pytest.mark.parametrize("form", ["file", "sharded"])
def test_a_training_checkpoint_converts_and_exports_to_the_speculators_layout(
    run, sharded, tmp_path, form
):
    """The speculators layout reads the source's verifier record: a training checkpoint has none
    (no config.json), so both write the target given, or null, without reading one."""
    ckpt = run / "checkpoints" / "step-00000003.pt" if form == "file" else sharded
    convert_equals_export(ckpt, tmp_path, "speculators", "speculators")
