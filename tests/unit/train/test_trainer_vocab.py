"""The draft vocabulary `train` builds (issue #20, items 2 and 4): by default the usable
vocabulary (the tokenizer's length, when the target's vocab_size pads past it), counted over the
training split only (the validation samples stay unseen, so validation metrics are not flattered).

The tiny target has 128 embedding rows, its tokenizer 85 tokens (recorded in the store, as
capture does). Training samples supervise ids 10..49 once each; the validation samples (the
split's seeded hold-out) supervise id 80 many times, which would enter a 40-id vocabulary if
they were counted.
"""

from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner

from specdraft.capture.store import StoreSettings
from specdraft.capture.write import write_store
from specdraft.checkpoint import load_draft
from specdraft.cli import app
from specdraft.data.render import Sample, tokenizer_fingerprint
from specdraft.data.vocab import target_ids_of_draft_vocab
from specdraft.targets import load_target
from specdraft.train.config import TrainConfig, split_samples
from tests.support.threads import one_thread  # noqa: F401
from tests.support.tiny_models import tiny_config
from tests.support.tiny_tokenizer import tiny_chat_tokenizer

NUM_SAMPLES = 40
TRAIN_IDS = list(range(10, 50))  # each supervised once per training sample
VAL_ID = 80  # supervised 40 times per validation sample


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A capture store of NUM_SAMPLES samples from a 128-row target with an 85-token tokenizer."""
    root = tmp_path_factory.mktemp("vocab")
    target = load_target(tiny_config("llama", num_layers=4, hidden_size=32, vocab_size=128), seed=0)
    target.model.save_pretrained(root / "target")
    _, val_ids = split_samples(NUM_SAMPLES, TrainConfig())  # the split train makes by default
    assert val_ids, "the default split holds samples out"
    samples = []
    for i in range(NUM_SAMPLES):
        answer = [VAL_ID] * 40 if i in val_ids else TRAIN_IDS
        samples.append(Sample([1, 2, 3] + answer, [0, 0, 0] + [1] * len(answer)))
    write_store(
        target,
        samples,
        root / "store",
        StoreSettings((1, 2, 3), dtype=torch.float32),
        extra={
            "target_path": str(root / "target"),
            "tokenizer": tokenizer_fingerprint(tiny_chat_tokenizer()),
        },
    )
    return root / "store"


def train(store, out, *flags: str):
    result = CliRunner().invoke(
        app,
        [
            "train",
            str(store),
            str(out),
            "--steps",
            "1",
            "--batch-size",
            "4",
            "--ttt-steps",
            "1",
            "--max-length",
            "64",
            *flags,
        ],
    )
    assert result.exit_code == 0, result.output
    return load_draft(out / "draft").model


def test_the_default_draft_vocabulary_is_the_tokenizers_length(store, tmp_path):
    """vocab_size 128 pads past the 85-token tokenizer: the default is 85, not 128 (which
    build_vocab_map refuses: 'draft_vocab_size 128 must be in 1..85')."""
    draft = train(store, tmp_path / "run")
    assert draft.cfg.vocab_size == 128 and draft.cfg.draft_vocab_size == 85
    assert target_ids_of_draft_vocab(draft.d2t).tolist() == list(range(85))


def test_the_draft_vocabulary_is_counted_on_the_training_split_only(store, tmp_path):
    draft = train(store, tmp_path / "run", "--draft-vocab-size", "40")
    assert target_ids_of_draft_vocab(draft.d2t).tolist() == TRAIN_IDS  # VAL_ID (held out) absent
