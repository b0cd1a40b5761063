"""The engine's refusals of user input are SpecdraftErrors (the CLI's one-line user errors) and
still the builtin they were (ValueError, FileNotFoundError), so callers catching those keep working."""

from __future__ import annotations

import dataclasses

import pytest

from specdraft.draft_config import DraftConfig, DraftError
from specdraft.engine.errors import EngineError, EngineFileMissing
from specdraft.engine.fast_config import ModelArgs
from specdraft.engine.fast_load import load_fast_target
from specdraft.engine.fast_model import FastTarget
from specdraft.engine.requests import check_request
from specdraft.engine.sampling import SamplingParams
from specdraft.engine.spec_config import SpecConfig, SpecConfigError
from specdraft.engine.speculate import check_pairing
from specdraft.errors import SpecdraftError
from tests.support.drafts import tiny_draft

ARGS = ModelArgs("llama", 32, 5, 4, 2, 8, 64, 128, max_position_embeddings=64)


def _refused(error: type, builtin: type, call, match: str) -> None:
    with pytest.raises(error, match=match) as caught:
        call()
    assert isinstance(caught.value, SpecdraftError) and isinstance(caught.value, builtin)


def test_a_bad_speculative_setting_is_a_spec_config_error():
    _refused(SpecConfigError, ValueError, lambda: SpecConfig(2, 1, 5), "num_draft_tokens must be")
    _refused(SpecConfigError, ValueError, lambda: SpecConfig(0, 1, 1), "positive integer")


def test_a_bad_request_or_sampling_parameter_is_an_engine_error():
    _refused(EngineError, ValueError, lambda: SamplingParams(-1.0), "temperature -1.0")
    _refused(EngineError, ValueError, lambda: SamplingParams(top_p=0.0), "top_p 0.0")
    _refused(EngineError, ValueError, lambda: check_request([], 4, None, None), "empty prompt")
    _refused(EngineError, ValueError, lambda: check_request([1], 0, None, None), "max_new_tokens 0")


def test_an_unsupported_target_or_a_missing_directory_is_refused(tmp_path):
    config = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}
    _refused(EngineError, ValueError, lambda: ModelArgs.from_hf_config(config), "GPT2LMHeadModel")
    _refused(
        EngineFileMissing, FileNotFoundError, lambda: load_fast_target(tmp_path), "config.json"
    )
    target = FastTarget(ARGS)
    _refused(EngineError, ValueError, lambda: target.setup_cache(1, 65), "max_position_embeddings")


def test_a_drafter_that_does_not_fit_the_target_is_an_engine_error():
    draft = tiny_draft(num_layers=5, aux_layers=(2, 3, 4))
    _refused(
        EngineError,
        ValueError,
        lambda: check_pairing(FastTarget(ARGS), draft, (1, 2, 3), SpecConfig.chain(2)),
        "aux layers",
    )


def test_a_bad_drafter_config_is_a_draft_error():
    cfg = tiny_draft().cfg
    _refused(
        DraftError,
        ValueError,
        lambda: dataclasses.replace(cfg, draft_vocab_size=cfg.vocab_size + 1),
        "exceeds the target vocab_size",
    )
    _refused(DraftError, ValueError, lambda: DraftConfig.from_dict({"bogus": 1}), "unknown keys")
