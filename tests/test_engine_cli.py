"""`specdraft generate`: loads the tokenizer from the target dir, streams the text, prints the
metrics table; speculative, --no-spec and draft-less runs print the target's greedy text."""

from __future__ import annotations

import shutil

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast
from typer.testing import CliRunner

from specdraft.checkpoint import Manifest, save_draft
from specdraft.cli import app
from tests.engine_helpers import VOCAB, AUX_LAYERS, greedy_sequences, one_thread, tiny_setup  # noqa: F401


def _target_with_tokenizer(setup, path):
    shutil.copytree(setup.target_dir, path)
    words = models.WordLevel({f"w{i}": i for i in range(VOCAB)}, unk_token="w0")
    tok = Tokenizer(words)
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="w0").save_pretrained(path)
    return PreTrainedTokenizerFast.from_pretrained(path)


def test_generate_streams_text_and_prints_metrics(tmp_path):
    setup = tiny_setup("llama")
    tokenizer = _target_with_tokenizer(setup, tmp_path / "target")
    args = setup.target.args
    manifest = Manifest(draft=setup.trained.cfg.to_dict(), aux_layers=list(AUX_LAYERS),
                        target={"hidden_size": args.hidden_size, "num_layers": args.num_layers})
    draft_dir = save_draft(setup.trained, tmp_path / "draft", manifest=manifest)
    prompt = "w1 w5 w9 w13 w2 w7"
    ids = tokenizer(prompt)["input_ids"]
    expected = tokenizer.decode(greedy_sequences(setup.target, [ids], 12)[0, len(ids):].tolist())
    common = ["generate", "--target", str(tmp_path / "target"), "--prompt", prompt,
              "--max-new-tokens", "12", "--max-seq-len", "64"]
    spec = CliRunner().invoke(app, common + ["--draft", str(draft_dir), "--topk", "2", "--num-steps",
                                             "3", "--num-draft-tokens", "6"])
    assert spec.exit_code == 0, spec.output
    assert expected in spec.output.replace("\n", "")
    assert "accept length tau" in spec.output and "steps 3, topk 2, draft tokens 6" in spec.output
    defaults = CliRunner().invoke(app, common + ["--draft", str(draft_dir)])  # topk 1, num_steps 3
    assert defaults.exit_code == 0, defaults.output
    assert expected in defaults.output.replace("\n", "")
    assert "steps 3, topk 1, draft tokens 4" in defaults.output
    plain = CliRunner().invoke(app, common + ["--no-spec", "--topk", "2"])  # a baseline of the same command
    assert plain.exit_code == 0, plain.output
    assert expected in plain.output.replace("\n", "") and "plain decoding" in plain.output
    no_draft = CliRunner().invoke(app, common)  # --help: "omit for plain decoding"
    assert no_draft.exit_code == 0, no_draft.output
    assert expected in no_draft.output.replace("\n", "") and "plain decoding (no --draft)" in no_draft.output
    on_cpu = CliRunner().invoke(app, common + ["--compile"])  # CUDA graphs: refused, not ignored
    assert on_cpu.exit_code == 1 and "--compile needs a CUDA device" in on_cpu.output


@pytest.mark.parametrize("flags, named", [
    (["--topk", "1"], "--topk"),
    (["--num-steps", "3"], "--num-steps"),
    (["--num-draft-tokens", "0"], "--num-draft-tokens"),
    (["--num-steps", "5", "--topk", "2", "--num-draft-tokens", "8"], "--topk, --num-steps, --num-draft-tokens"),
])
def test_generate_refuses_drafting_flags_without_a_draft(tmp_path, flags, named):
    """Even a flag given at its default value is refused: without --draft it would be ignored."""
    (tmp_path / "config.json").write_text("{}")  # refused before the target is loaded
    result = CliRunner().invoke(app, ["generate", "--target", str(tmp_path), "--prompt", "hi", *flags])
    assert result.exit_code == 1, result.output
    text = " ".join(result.output.split())
    assert text == (f"error: {named} set the drafter's speculation, but no --draft is given (plain decoding): "
                    f"add --draft CKPT, or drop {named}")
