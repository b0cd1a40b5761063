"""A `--method dflash` run's training checkpoint (RUN/checkpoints/step-N.pt) taken as EAGLE-3's
are: `inspect` describes it, `export` writes the drafter it holds (bit for bit the export of the
run's RUN/draft when it is the last step), `generate --draft` runs it, losslessly."""

from __future__ import annotations

import pytest
from safetensors.torch import load_file
from typer.testing import CliRunner

from specdraft.checkpoint import checkpoint_paths
from specdraft.cli import app
from specdraft.train.loop import train
from tests.support.cli import cli_args
from tests.support.tiny_tokenizer import save_tiny_tokenizer
from tests.support.train_world import VOCAB, make_world, one_thread, small_config  # noqa: F401


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """(the run directory, the target directory with a tokenizer): 10 DFlash steps on the
    trainer's tiny store, a checkpoint every 5."""
    root = tmp_path_factory.mktemp("dflash-run")
    store = make_world(root)[2]
    save_tiny_tokenizer(root / "target")
    config = small_config(
        method="dflash",
        block_size=4,
        num_anchors=4,
        draft_overrides={"mask_token_id": VOCAB - 1, "num_hidden_layers": 1},
        total_steps=10,
        save_every=5,
        val_fraction=0.0,
    )
    train(config, store, root / "run", progress=False)
    return root / "run", root / "target"


def invoke(*args, **options):
    return CliRunner().invoke(app, cli_args(*args, **options))


def test_inspect_describes_the_checkpoint(run):
    step = checkpoint_paths(run[0])[0]
    result = invoke("inspect", step)
    assert result.exit_code == 0, result.output
    assert "DFlash drafter, training checkpoint (step 5" in result.output
    assert "block size 4 (anchor + 3 drafts); mask token 127" in result.output
    assert "audit: PASS" in result.output


def test_export_of_the_last_checkpoint_is_the_export_of_the_drafter(run, tmp_path):
    directory, target = run
    step = checkpoint_paths(directory)[-1]
    for source, out in ((step, tmp_path / "from-step"), (directory / "draft", tmp_path / "draft")):
        result = invoke("export", source, out, engine="sglang", target=target)
        assert result.exit_code == 0, result.output
        assert "--speculative-num-draft-tokens 4" in result.output
    a = load_file(str(tmp_path / "from-step" / "model.safetensors"))
    b = load_file(str(tmp_path / "draft" / "model.safetensors"))
    assert a.keys() == b.keys() and all(a[k].equal(b[k]) for k in a)


def test_generate_runs_the_checkpoint_losslessly(run):
    directory, target = run
    step = checkpoint_paths(directory)[0]
    options = dict(target=target, prompt="hello world", max_new_tokens=12, max_seq_len=64)
    speculative = invoke("generate", draft=step, **options)
    assert speculative.exit_code == 0, speculative.output
    assert "steps 3, topk 1, draft tokens 4" in speculative.stderr
    plain = CliRunner().invoke(app, [*cli_args("generate", **options), "--no-spec"])
    assert plain.exit_code == 0, plain.output
    assert plain.stdout.strip() and speculative.stdout.strip() == plain.stdout.strip()
