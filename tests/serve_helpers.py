"""Helpers for the serve / bench / tune tests: a word tokenizer for the tiny targets, slow
targets (a memory-bound target simulated by a sleep per forward) and servers on loopback."""

from __future__ import annotations

import contextlib
import copy
import json
import time
from pathlib import Path
from typing import Iterator

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from specdraft.engine.fast_model import FastTarget
from specdraft.engine.spec_config import SpecConfig
from specdraft.engine.speculate import SpeculativeEngine
from specdraft.serve import RunningServer, create_app, serve_in_thread
from tests.engine_helpers import MAX_SEQ, VOCAB, random_prompts

CHAT_TEMPLATE = ("{% for m in messages %}{{ m['content'] }} {% endfor %}"
                 "{% if add_generation_prompt %}w3{% endif %}")


def word_tokenizer(eos: str | None = None) -> PreTrainedTokenizerFast:
    """Word-level tokenizer over the tiny vocabulary: "w<i>" = id i, whitespace separated."""
    backend = Tokenizer(models.WordLevel({f"w{i}": i for i in range(VOCAB)}, unk_token="w0"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="w0", eos_token=eos)
    tok.chat_template = CHAT_TEMPLATE
    return tok


def text_prompts(num: int, length: int, seed: int) -> list[str]:
    """Random prompts as text ("w12 w5 ...")."""
    return [" ".join(f"w{t}" for t in ids) for ids in random_prompts(num, length, seed)]


def write_prompts(path: Path, prompts: list[str]) -> Path:
    """A bench / tune prompt file (JSONL rows {"prompt": ...})."""
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    return path


def slow_target(target: FastTarget, seconds: float) -> FastTarget:
    """A copy of `target` whose every forward also sleeps `seconds` (a big memory-bound target
    on a GPU: a forward costs about the same for 1 or 16 tokens). Sleeping uses no CPU."""
    slow = copy.deepcopy(target)
    forward = slow.forward

    def sleepy_forward(*args, **kwargs):
        time.sleep(seconds)
        return forward(*args, **kwargs)

    slow.forward = sleepy_forward
    return slow


def engine(target: FastTarget, draft=None, spec: SpecConfig | None = None, tokenizer=None,
           max_seq_len: int = MAX_SEQ) -> SpeculativeEngine:
    """A SpeculativeEngine on the CPU (plain decoding without draft / spec)."""
    return SpeculativeEngine(target, draft, spec, None, max_seq_len, "cpu", tokenizer)


@contextlib.contextmanager
def running(eng: SpeculativeEngine, tokenizer, name: str = "tiny", **kwargs) -> Iterator[RunningServer]:
    """A specdraft server for `eng` on a free loopback port."""
    server = serve_in_thread(create_app(eng, tokenizer, name, **kwargs))
    try:
        yield server
    finally:
        server.stop()


def own_target(setup) -> FastTarget:
    """A private copy of the shared tiny target (two engines used at once must not share caches)."""
    return copy.deepcopy(setup.target)


def threads_one() -> None:
    torch.set_num_threads(1)
