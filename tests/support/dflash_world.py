"""A DFlash drafter trained by `specdraft train --method dflash` on a tiny target's own greedy
outputs, for the doctor's block-acceptance tests: its training record holds per-position block
acceptance near 0.6 / 0.5 / 0.4 (block 4; held-out samples within 0.1 of it), which target layers
shifted by one, a wrong mask token or scrambled weights bring down by 0.25 or more."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from specdraft.data.render import Sample
from specdraft.train.loop import train
from tests.support.doctor_helpers import context_target, write_samples
from tests.support.train_world import small_config, write_fp32_store

LAYERS = (1, 2, 3)  # specdraft indices of the 12-layer target (DFlash ids 0, 1, 2)
MASK = 127
PROMPT, NEW = 6, 26
NUM_TRAIN = 600
DRAFT = {"mask_token_id": MASK, "num_hidden_layers": 1}
TRAINING = dict(method="dflash", block_size=4, num_anchors=8, draft_overrides=DRAFT) | dict(
    total_steps=1000, eval_every=1000, save_every=1000
)


@dataclass
class DFlashWorld:
    """The target directory, the trained drafter (RUN/draft), held-out samples (the target's
    greedy outputs of other prompts, JSONL) and the capture store it was trained on."""

    target: Path
    draft: Path
    samples: Path
    store: Path


_WORLD: dict[str, DFlashWorld] = {}


def greedy_samples(target, num: int, seed: int) -> list[Sample]:
    """`num` samples: PROMPT random ids, then the target's NEW greedy tokens (supervised)."""
    g = torch.Generator().manual_seed(seed)
    prompts = torch.randint(1, 128, (num, PROMPT), generator=g)
    with torch.no_grad():
        out = target.model.generate(
            prompts,
            attention_mask=torch.ones_like(prompts),
            do_sample=False,
            max_new_tokens=NEW,
            min_new_tokens=NEW,
            pad_token_id=0,
        )
    return [Sample(row.tolist(), [0] * PROMPT + [1] * NEW) for row in out]


def dflash_world(tmp_path_factory) -> DFlashWorld:
    """Build once per test process: `doctor_helpers.context_target`, NUM_TRAIN greedy samples
    captured on LAYERS (its first layers, whose states differ most from one to the next: each
    widens the context window), a 1-layer block-4 drafter trained 1000 steps on them (a
    validation split), and 40 held-out samples."""
    if "world" not in _WORLD:
        with torch.random.fork_rng(devices=[]):
            root = tmp_path_factory.mktemp("dflash-trained")
            target = context_target(root / "target")
            write_fp32_store(target, greedy_samples(target, NUM_TRAIN, 0), root, LAYERS, 8192)
            result = train(small_config(**TRAINING), root / "store", root / "run", progress=False)
            write_samples(root / "samples.jsonl", greedy_samples(target, 40, 1))
        _WORLD["world"] = DFlashWorld(
            root / "target", result.draft_dir, root / "samples.jsonl", root / "store"
        )
    return _WORLD["world"]


def served_dflash_world(root: Path, steps: int = 200) -> tuple[Path, Path, Path]:
    """(draft dir, target dir with a word tokenizer, samples.jsonl) under root for doctor --server
    tests of a DFlash drafter: the engine tests' tiny smooth Llama (`engine_helpers.tiny_setup`,
    which specdraft serve runs) and a block-4 drafter trained `steps` steps on its greedy
    continuations (`dflash.engine_dflash_draft`; 0: untrained), saved with a manifest, and 8
    token-id samples."""
    import json

    from tests.support.dflash import engine_dflash_draft, save_engine_dflash
    from tests.support.engine_helpers import (
        copy_with_word_tokenizer,
        greedy_sequences,
        random_prompts,
        tiny_setup,
    )

    setup = tiny_setup("llama", "smooth")
    target = root / "target"
    if not target.exists():
        copy_with_word_tokenizer(setup, target)
    sequences = greedy_sequences(setup.target, random_prompts(64, 8, seed=2), 24)
    draft = engine_dflash_draft(setup.target, sequences, 8, steps)
    draft_dir = save_engine_dflash(draft, setup.target, root / f"draft-{steps}")
    samples = root / "samples.jsonl"
    samples.write_text(
        "".join(
            json.dumps({"input_ids": p, "loss_mask": [1] * len(p)}) + "\n"
            for p in random_prompts(8, 16, seed=5)
        )
    )
    return draft_dir, target, samples
