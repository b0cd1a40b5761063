"""Tiny seeded targets and drafters for the engine tests (built once per test process).

`tiny_setup(arch, init)` saves a tiny transformers target (vocab 64, 4 layers), loads it as a
FastTarget, and builds two drafters for it: an untrained one (full vocabulary) and one
briefly trained (60 Adam steps of first-step cross-entropy to the target's argmax on the
target's own greedy continuations) with a 48-token draft vocabulary, so `d2t` is non-trivial.
init "smooth": weights std 0.02 and lm_head x30: peaked next-token distributions (entropy
~1.6 nats) that depend mostly on the last token, so the trained drafter is accepted often
(~50 %) and multi-token paths are exercised. init "chaotic": weights std 0.4 (entropy ~2.4
nats), outputs depend on the whole context, drafts are rarely accepted.
"""

from __future__ import annotations

import functools
import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from scipy.stats import chisquare
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from specdraft.data.vocab import build_vocab_map
from specdraft.draft import Eagle3Draft
from specdraft.draft_config import DraftConfig
from specdraft.engine.fast_load import load_fast_target
from specdraft.engine.fast_model import FastTarget, causal_mask
from specdraft.engine.sampling import (
    SamplingParams,
    logits_to_probs,
)
from specdraft.engine.spec_config import SpecConfig
from specdraft.engine.speculate import SpeculativeEngine
from tests.support.threads import one_thread  # noqa: F401 (a fixture, imported from here)
from tests.support.tiny_models import tiny_model

VOCAB = 64
AUX_LAYERS = (1, 2, 4)
TARGET_KW = dict(vocab_size=VOCAB, num_layers=4, hidden_size=32)
INITS = {"smooth": (0.02, 30.0), "chaotic": (0.4, 1.0)}  # weight std, lm_head scale
MAX_SEQ = 128


@dataclass
class TinySetup:
    """A saved target directory, its FastTarget and two drafters (embeddings loaded)."""

    target_dir: Path
    target: FastTarget
    untrained: Eagle3Draft
    trained: Eagle3Draft

    def engine(
        self, draft: Eagle3Draft | None, spec: SpecConfig | None, tokenizer=None
    ) -> SpeculativeEngine:
        """A fresh engine over this target (max_seq_len MAX_SEQ)."""
        return SpeculativeEngine(self.target, draft, spec, None, MAX_SEQ, "cpu", tokenizer)


def random_prompts(num: int, length: int, seed: int) -> list[list[int]]:
    """`num` prompts of `length` uniform random ids."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (num, length), generator=gen).tolist()


@functools.cache
def tiny_setup(arch: str = "llama", init: str = "smooth") -> TinySetup:
    """Build (once per process) the tiny target of `arch` / `init` and its two drafters."""
    std, head_scale = INITS[init]
    model = tiny_model(arch, seed=0, initializer_range=std, **TARGET_KW)
    with torch.no_grad():
        model.lm_head.weight.mul_(head_scale)
    target_dir = Path(tempfile.mkdtemp(prefix=f"engine-{arch}-{init}-")) / "target"
    model.save_pretrained(target_dir)
    target = load_fast_target(target_dir)
    hf_config = json.loads((target_dir / "config.json").read_text())
    untrained = make_draft(target, hf_config, seed=1)
    sequences = greedy_sequences(target, random_prompts(64, 8, seed=2), 24)
    trained = make_draft(target, hf_config, seed=3, draft_vocab_size=48, sequences=sequences)
    train_first_step(trained, target, sequences, steps=60)
    return TinySetup(target_dir, target, untrained, trained)


def make_draft(
    target: FastTarget,
    hf_config: dict,
    seed: int,
    draft_vocab_size: int | None = None,
    sequences: torch.Tensor | None = None,
) -> Eagle3Draft:
    """A seeded drafter for `target`; with draft_vocab_size, the vocabulary of the most frequent
    tokens of `sequences`."""
    cfg = DraftConfig.from_target(hf_config, AUX_LAYERS, draft_vocab_size=draft_vocab_size)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        draft = Eagle3Draft(cfg)
    if draft_vocab_size is not None:
        vmap = build_vocab_map(
            torch.bincount(sequences.reshape(-1), minlength=VOCAB), draft_vocab_size
        )
        draft.d2t.copy_(vmap.d2t)
        draft.t2d.copy_(vmap.t2d)
    draft.load_target_embedding(target.tok_embeddings.weight)
    return draft.eval()


@torch.no_grad()
def target_pass(target: FastTarget, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Full causal forward of ids [B, L]: (logits [B, L, V], aux [B, L, 3H])."""
    b, length = ids.shape
    target.setup_cache(b, length)
    out = target(
        ids,
        torch.arange(length)[None].expand(b, -1),
        torch.arange(length),
        causal_mask(0, length, length, b),
        AUX_LAYERS,
    )
    return out.logits, out.aux_hidden


@torch.no_grad()
def greedy_sequences(target: FastTarget, prompts: list[list[int]], num_new: int) -> torch.Tensor:
    """Prompts [B, P] followed by the target's greedy continuation: [B, P + num_new] long
    (recomputed from scratch each token: simple and independent of the engine)."""
    ids = torch.tensor(prompts)
    for _ in range(num_new):
        logits, _ = target_pass(target, ids)
        ids = torch.cat([ids, logits[:, -1].argmax(-1, keepdim=True)], 1)
    return ids


def train_first_step(draft: Eagle3Draft, target: FastTarget, ids: torch.Tensor, steps: int) -> None:
    """Fit the drafter's first step to the target's argmax: at position t (aux_t, token t+1)
    predict argmax of the target logits at t+1, in the draft vocabulary (other labels ignored)."""
    logits, aux = target_pass(target, ids)
    labels_target = logits[:, 1:].argmax(-1)  # [B, L-1], target ids
    to_draft = torch.full((VOCAB,), -100, dtype=torch.long)
    draft_ids = torch.arange(draft.cfg.draft_vocab_size)
    to_draft[draft.draft_to_target(draft_ids)] = draft_ids
    labels = to_draft[labels_target]
    positions = torch.arange(ids.shape[1] - 1)[None].expand(ids.shape[0], -1)
    params = [p for p in draft.parameters() if p.requires_grad]
    opt = torch.optim.Adam(params, lr=1e-2)
    draft.train()
    with torch.enable_grad():
        for _ in range(steps):
            out = draft(ids[:, 1:], aux[:, :-1], positions, first_step=True)
            loss = F.cross_entropy(out.logits.reshape(-1, out.logits.shape[-1]), labels.reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
    draft.eval()


@functools.cache
def hf_setup(arch: str) -> TinySetup:
    """`tiny_setup`'s "smooth" target of any `tests.support.tiny_models` arch behind the transformers-backed
    engine target (`engine.hf_target.HFTarget`), with an untrained drafter and one trained 30 steps;
    target_dir is None (built in code)."""
    from specdraft.engine.hf_target import HFTarget
    from specdraft.targets import Target

    std, head_scale = INITS["smooth"]
    model = tiny_model(arch, seed=0, initializer_range=std, **TARGET_KW)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(head_scale)
    target = HFTarget(Target(model))
    hf_config = model.config.get_text_config().to_dict()
    untrained = make_draft(target, hf_config, seed=1)
    sequences = greedy_sequences(target, random_prompts(32, 8, seed=2), 16)
    trained = make_draft(target, hf_config, seed=3, draft_vocab_size=48, sequences=sequences)
    train_first_step(trained, target, sequences, steps=30)
    return TinySetup(None, target, untrained, trained)


def copy_with_word_tokenizer(setup, path):
    """setup's target copied to path with a word-level tokenizer of its VOCAB ids (w0 .. w{VOCAB-1});
    returns the tokenizer."""
    shutil.copytree(setup.target_dir, path)
    words = models.WordLevel({f"w{i}": i for i in range(VOCAB)}, unk_token="w0")
    tok = Tokenizer(words)
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="w0").save_pretrained(path)
    return PreTrainedTokenizerFast.from_pretrained(path)


NUM_PROMPTS, SAMPLES_PER_PROMPT, PROMPT_LEN = 3, 400, 6


PASS_P, FAIL_P = 1e-3, 1e-6


MIN_EXPECTED = 5.0


def chi_square_prompts() -> list[list[int]]:
    """The prompts `chi_square_pvalue` samples from."""
    return random_prompts(NUM_PROMPTS, PROMPT_LEN, seed=20)


@torch.no_grad()
def exact_joint(setup, prompt: list[int], params: SamplingParams) -> np.ndarray:
    """P(x1, x2 | prompt) [V, V] from the target's logits (the same logits_to_probs)."""
    logits, _ = target_pass(setup.target, torch.tensor([prompt]))
    first = logits_to_probs(logits[0, -1], params)
    batch = torch.tensor([prompt + [x] for x in range(VOCAB)])
    logits, _ = target_pass(setup.target, batch)
    second = logits_to_probs(logits[:, -1], params)
    joint = (first[:, None] * second).double().numpy()
    return joint / joint.sum()


def chi_square_pvalue(setup, spec: SpecConfig, params: SamplingParams, draft=None) -> float:
    """Pooled chi-square p-value of the engine's first two tokens against the exact joint, with
    `draft` (default: setup's trained EAGLE-3 drafter) on `chi_square_prompts`; cells expected
    below MIN_EXPECTED are merged per prompt."""
    engine = setup.engine(setup.trained if draft is None else draft, spec)
    observed, expected = [], []
    for i, prompt in enumerate(chi_square_prompts()):
        joint = exact_joint(setup, prompt, params).reshape(-1) * SAMPLES_PER_PROMPT
        counts = np.zeros(VOCAB * VOCAB)
        for s in range(SAMPLES_PER_PROMPT):
            x1, x2 = engine.generate(
                prompt, 2, params.temperature, params.top_p, params.top_k, seed=1000 * i + s
            ).token_ids
            counts[x1 * VOCAB + x2] += 1
        big = joint >= MIN_EXPECTED
        observed += [*counts[big], counts[~big].sum()]
        expected += [*joint[big], joint[~big].sum()]
    return chisquare(observed, expected, ddof=NUM_PROMPTS - 1).pvalue
