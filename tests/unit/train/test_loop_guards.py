"""`specdraft train` refuses what would silently train the wrong thing or lose work: a resume on
a store of another target or layers, or on other samples (another store or --online data file of
the same target: the checkpoint's data hash), a --target that is not the store's target, a run
directory of unrelated files; and Ctrl-C before the first --save-every checkpoint keeps the steps
done. A checkpoint that records no data hash (older specdraft) resumes as before."""

from __future__ import annotations

import json
import signal

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

import specdraft.train.loop as loop
import specdraft.train.run_dir as run_dir
from specdraft.capture.store import StoreSettings
from specdraft.capture.write import write_store
from specdraft.checkpoint import checkpoint_paths
from specdraft.cli import app
from specdraft.train.config import TrainConfig
from specdraft.train.loop import train
from specdraft.train.store_data import StoreData
from tests.support.cli import cli_args
from tests.support.tiny_models import save_tiny_model, tiny_config
from tests.support.tiny_tokenizer import save_tiny_tokenizer
from tests.support.train_world import make_samples, one_thread  # noqa: F401

VOCAB = 128
CFG = dict(total_steps=4, batch_size=4, ttt_steps=2, draft_vocab_size=96, warmup_steps=1)
CFG |= dict(save_every=100, val_fraction=0.0)


def make_store(
    root, name: str, num_layers: int, aux: tuple[int, ...], num_samples: int = 24, seed: int = 0
):
    """(target dir, store dir): a tiny Llama of `num_layers` saved under root/name-target (the same
    network for the same `num_layers`) and a capture store of `num_samples` samples
    (`make_samples(num_samples, seed)`) on layers `aux`."""
    from specdraft.targets import load_target

    target = load_target(
        tiny_config("llama", num_layers=num_layers, hidden_size=32, vocab_size=VOCAB), seed=0
    )
    target.model.save_pretrained(root / f"{name}-target")
    store = root / f"{name}-store"
    write_store(
        target,
        make_samples(num_samples, seed),
        store,
        StoreSettings(aux, dtype=torch.float32, shard_tokens=2048),
        extra={"target_path": str(root / f"{name}-target")},
    )
    return root / f"{name}-target", store


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """Stores "a" (24 samples) and, of the same target and layers, "a16", "a8" (16 and 8 samples)
    and "a_seed1" (24 other samples); "six" (another target) and "a_aux" (other layers)."""
    root = tmp_path_factory.mktemp("guards")
    return {
        "a": make_store(root, "a", 4, (1, 2, 3)),
        "six": make_store(root, "six", 6, (1, 2, 3)),
        "a_aux": make_store(root, "a_aux", 4, (1, 2, 4)),
        "a16": make_store(root, "a16", 4, (1, 2, 3), 16),
        "a8": make_store(root, "a8", 4, (1, 2, 3), 8),
        "a_seed1": make_store(root, "a_seed1", 4, (1, 2, 3), seed=1),
    }


@pytest.fixture(scope="module")
def trained(stores, tmp_path_factory):
    """A run of 2 steps on store "a" (its final checkpoint step-2)."""
    run = tmp_path_factory.mktemp("trained") / "run"
    train(TrainConfig.from_dict({**CFG, "total_steps": 2}), stores["a"][1], run, progress=False)
    return run


def resume_to_step_3(store, run):
    """`train(..., resume=True)` of `run` on `store` up to step 3 (CFG otherwise)."""
    return train(
        TrainConfig.from_dict({**CFG, "total_steps": 3}), store, run, resume=True, progress=False
    )


@pytest.mark.parametrize(
    "other, says", [("six", "6 layers"), ("a_aux", "aux layers 1,2,3 -> 1,2,4")]
)
def test_resume_refuses_a_store_of_another_target_or_layers(stores, trained, tmp_path, other, says):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(trained, run)
    before = (run / "draft" / "specdraft_manifest.json").read_text()
    with pytest.raises(ValueError, match="resume with the store") as e:
        resume_to_step_3(stores[other][1], run)
    assert says in str(e.value) and "\n" not in str(e.value)
    assert [p.name for p in checkpoint_paths(run)] == ["step-00000002.pt"]
    assert (run / "draft" / "specdraft_manifest.json").read_text() == before
    result = CliRunner().invoke(app, cli_args("train", stores[other][1], run, resume=True, steps=3))
    assert result.exit_code == 1 and "error:" in result.output and says in result.output, (
        result.output
    )
    ok = CliRunner().invoke(app, cli_args("train", stores["a"][1], run, resume=True, steps=3))
    assert ok.exit_code == 0, ok.output


def copy_run(trained, tmp_path):
    import shutil

    shutil.copytree(trained, tmp_path / "run")
    return tmp_path / "run"


def data_hash(store) -> str:
    return json.loads((store / "index.json").read_text())["data_hash"]


@pytest.mark.parametrize(
    "other, counts",
    [
        ("a16", ("24 samples", "16 samples")),  # step 2 fits 16: resumed before
        ("a_seed1", ("24 samples", "24 samples")),
    ],
)
def test_resume_refuses_other_samples_of_the_same_target(stores, trained, tmp_path, other, counts):
    run = copy_run(trained, tmp_path)
    before = (run / "draft" / "specdraft_manifest.json").read_text()
    was, now = data_hash(stores["a"][1])[:12], data_hash(stores[other][1])[:12]
    with pytest.raises(ValueError) as e:
        resume_to_step_3(stores[other][1], run)
    says = (
        f"{run / 'checkpoints' / 'step-00000002.pt'}: this checkpoint was trained on other data (data hash "
        f"{was} ({counts[0]}) -> {now} ({counts[1]})): resume with the store (or --online data file and "
        f"--target) it was trained on, or train into a new OUT directory"
    )
    assert str(e.value) == says
    assert [p.name for p in checkpoint_paths(run)] == ["step-00000002.pt"]
    assert (run / "draft" / "specdraft_manifest.json").read_text() == before
    result = CliRunner().invoke(app, cli_args("train", stores[other][1], run, resume=True, steps=3))
    assert result.exit_code == 1 and f"error: {says}" in result.output, result.output
    assert [p.name for p in checkpoint_paths(run)] == ["step-00000002.pt"]


def test_resume_on_the_same_store_records_its_data(stores, trained, tmp_path):
    run = copy_run(trained, tmp_path)
    store = stores["a"][1]
    result = CliRunner().invoke(app, cli_args("train", store, run, resume=True, steps=3))
    assert result.exit_code == 0, result.output
    state = torch.load(checkpoint_paths(run)[-1], map_location="cpu", weights_only=False)
    assert state["step"] == 3 and state["num_samples"] == 24
    assert state["manifest"]["data_hash"] == data_hash(store)
    assert json.loads((run / "draft" / "specdraft_manifest.json").read_text())[
        "data_hash"
    ] == data_hash(store)


def forget_data(checkpoint):
    """Make `checkpoint` one of specdraft before checkpoints recorded their data (hash, sample count)."""
    state = torch.load(checkpoint, map_location="cpu", weights_only=False)
    state.pop("num_samples", None)  # absent from checkpoints that predate the data hash too
    state["manifest"]["data_hash"] = None
    torch.save(state, checkpoint)


@pytest.mark.parametrize("store", ["a", "a16"])
def test_a_checkpoint_without_data_hash_resumes_as_before(stores, trained, tmp_path, store):
    run = copy_run(trained, tmp_path)
    forget_data(checkpoint_paths(run)[-1])
    result = train(
        TrainConfig.from_dict({**CFG, "total_steps": 3}),
        stores[store][1],
        run,
        resume=True,
        progress=False,
    )
    assert result.steps == 3 and [p.name for p in checkpoint_paths(run)][-1] == "step-00000003.pt"


def test_a_checkpoint_without_data_hash_on_a_smaller_split_says_what_changed(
    stores, trained, tmp_path
):
    run = copy_run(trained, tmp_path)
    forget_data(checkpoint_paths(run)[-1])
    says = (
        f"{run / 'checkpoints' / 'step-00000002.pt'}: the training split now has 2 batches of --batch-size 4 "
        f"per epoch (8 training samples), but had at least 3 when this checkpoint was written (its step 2 was "
        f"batch 3 of epoch 1): the data changed since; resume with the store (or --online data file) it was "
        f"trained on, or train into a new OUT directory"
    )
    with pytest.raises(ValueError) as e:
        train(
            TrainConfig.from_dict({**CFG, "total_steps": 3}),
            stores["a8"][1],
            run,
            resume=True,
            progress=False,
        )
    assert str(e.value) == says
    result = CliRunner().invoke(app, cli_args("train", stores["a8"][1], run, resume=True, steps=3))
    assert result.exit_code == 1 and f"error: {says}" in result.output, result.output
    assert [p.name for p in checkpoint_paths(run)] == ["step-00000002.pt"]


def test_target_flag_must_be_the_store_target(stores, tmp_path):
    target, store = stores["a"]
    assert StoreData(store, target).config.num_hidden_layers == 4  # the store's own target is taken
    with pytest.raises(ValueError, match="not the target this store was captured from"):
        StoreData(store, stores["six"][0])
    result = CliRunner().invoke(
        app,
        cli_args("train", store, tmp_path / "run", target=stores["six"][0], steps=1, batch_size=4),
    )
    assert (
        result.exit_code == 1 and "not the target this store was captured from" in result.output
    ), result.output
    assert not (tmp_path / "run" / "checkpoints").exists()


def interrupt_after(monkeypatch, steps: int):
    """Send this process SIGINT (as Ctrl-C does) inside step `steps`: training stops after it."""
    real = loop.Trainer.train_step

    def step(self, sample_ids):
        if self.step == steps - 1:
            signal.raise_signal(signal.SIGINT)
        return real(self, sample_ids)

    monkeypatch.setattr(loop.Trainer, "train_step", step)


def test_ctrl_c_before_the_first_checkpoint_saves_one_and_resume_continues(
    stores, tmp_path, monkeypatch
):
    store = stores["a"][1]
    cfg = TrainConfig.from_dict(CFG)
    train(cfg, store, tmp_path / "whole", progress=False)
    with monkeypatch.context() as m:
        interrupt_after(m, 2)
        with pytest.raises(KeyboardInterrupt):
            train(cfg, store, tmp_path / "run", progress=False)
    assert [p.name for p in checkpoint_paths(tmp_path / "run")] == ["step-00000002.pt"]
    assert not list((tmp_path / "run" / "checkpoints").glob(".*"))  # no temp file left
    train(cfg, store, tmp_path / "run", resume=True, progress=False)
    whole = load_file(tmp_path / "whole" / "draft" / "model.safetensors")
    resumed = load_file(tmp_path / "run" / "draft" / "model.safetensors")
    assert all(torch.equal(whole[k], resumed[k]) for k in whole)


def test_cli_ctrl_c_names_the_checkpoint_it_saved(stores, tmp_path, monkeypatch):
    run = tmp_path / "run"
    interrupt_after(monkeypatch, 3)
    result = CliRunner().invoke(
        app,
        cli_args(
            "train", stores["a"][1], run, steps=4, batch_size=4, ttt_steps=2, draft_vocab_size=96
        ),
    )
    assert result.exit_code == 130, result.output
    assert (
        f"interrupted; newest checkpoint: {run / 'checkpoints' / 'step-00000003.pt'}"
        in result.output
    )
    assert "nothing to resume" not in result.output


def test_a_checkpoint_write_interrupted_keeps_the_previous_one(stores, tmp_path, monkeypatch):
    run = tmp_path / "run"
    train(TrainConfig.from_dict({**CFG, "total_steps": 2}), stores["a"][1], run, progress=False)

    def broken_save(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(run_dir.torch, "save", broken_save)
    with pytest.raises(KeyboardInterrupt):
        run_dir.write_checkpoint({"step": 3}, run, keep=2)
    assert [p.name for p in checkpoint_paths(run)] == ["step-00000002.pt"]


@pytest.fixture(scope="module")
def online_target(tmp_path_factory):
    return save_tiny_tokenizer(
        save_tiny_model("llama", tmp_path_factory.mktemp("online") / "target", num_layers=4)
    )


def test_online_aux_layers_out_of_range_are_named_by_the_flag(online_target, tmp_path):
    data = tmp_path / "texts.jsonl"
    data.write_text("".join('{"text": "the cat sat on the mat"}\n' for _ in range(8)))
    result = CliRunner().invoke(
        app,
        cli_args(
            "train",
            data,
            tmp_path / "run",
            online=True,
            target=online_target,
            aux_layers="1,2,7",
            no_chat=True,
            batch_size=4,
        ),
    )
    assert result.exit_code == 1, result.output
    assert (
        "error: --aux-layers 1,2,7: aux layers [1, 2, 7] must increase strictly within 0..4"
        in result.output
    )
    assert "DraftConfig" not in result.output


def test_online_resume_refuses_another_data_file(online_target, tmp_path):
    from tests.support.tiny_tokenizer import WORDS

    def texts(name: str, n: int, offset: int):
        path = tmp_path / name
        path.write_text(
            "".join(
                json.dumps(
                    {"text": " ".join(WORDS[(offset + i + k) % len(WORDS)] for k in range(8))}
                )
                + "\n"
                for i in range(n)
            )
        )
        return path

    run, trained_on, other = tmp_path / "run", texts("a.jsonl", 12, 0), texts("b.jsonl", 8, 5)
    args = [
        str(run),
        "--online",
        "--target",
        str(online_target),
        "--no-chat",
        "--aux-layers",
        "1,2,3",
        "--batch-size",
        "4",
        "--ttt-steps",
        "2",
        "--draft-vocab-size",
        "64",
    ]
    first = CliRunner().invoke(app, ["train", str(trained_on), *args, "--steps", "2"])
    assert first.exit_code == 0, first.output
    was = json.loads((run / "draft" / "specdraft_manifest.json").read_text())["data_hash"][:12]
    refused = CliRunner().invoke(app, ["train", str(other), *args, "--steps", "3", "--resume"])
    assert refused.exit_code == 1, refused.output
    assert (
        f"error: {run / 'checkpoints' / 'step-00000002.pt'}: this checkpoint was trained on other data (data "
        f"hash {was} (12 samples) -> "
        in refused.output
        and " (8 samples)): resume with the store" in refused.output
    )
    assert [p.name for p in checkpoint_paths(run)] == ["step-00000002.pt"]
    ok = CliRunner().invoke(app, ["train", str(trained_on), *args, "--steps", "3", "--resume"])
    assert ok.exit_code == 0, ok.output


def test_online_on_a_capture_store_says_to_drop_online(stores, online_target, tmp_path):
    result = CliRunner().invoke(
        app,
        cli_args("train", stores["a"][1], tmp_path / "run", online=True, target=online_target),
    )
    assert result.exit_code == 1, result.output
    assert "is a capture store" in result.output and "drop --online" in result.output
    assert "save_to_disk" not in result.output


@pytest.mark.parametrize("resume", [False, True])
def test_train_refuses_a_directory_of_unrelated_files(stores, tmp_path, resume):
    out = tmp_path / "out"
    out.mkdir()
    (out / "important.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="holds no training run"):
        train(TrainConfig.from_dict(CFG), stores["a"][1], out, resume=resume, progress=False)
    assert sorted(p.name for p in out.iterdir()) == ["important.txt"]
    result = CliRunner().invoke(
        app,
        cli_args("train", stores["a"][1], out, steps=1, batch_size=4)
        + (["--resume"] if resume else []),
    )
    assert result.exit_code == 1 and "holds no training run" in result.output, result.output
    assert (
        "no checkpoint in" not in result.output
    )  # --resume says nothing of a directory it refuses
    assert sorted(p.name for p in out.iterdir()) == ["important.txt"]
    (tmp_path / "empty").mkdir()  # an empty directory is a new run
    train(
        TrainConfig.from_dict({**CFG, "total_steps": 1}),
        stores["a"][1],
        tmp_path / "empty",
        progress=False,
    )
