"""What `specdraft serve` cannot be built from is a SpecdraftError naming the value or the file
(one line at the CLI, never a traceback): a queue below 1, a target directory without a loadable
tokenizer, a launch command line whose speculative flags cannot be read."""

from __future__ import annotations

import shutil

import pytest

from specdraft.errors import SpecdraftError
from specdraft.serve.engine_args import EngineArgsError, parse_engine_args
from specdraft.serve.server import build_app, create_app
from specdraft.serve.worker import ServeError
from tests.support.engine_helpers import tiny_setup
from tests.support.serve_helpers import engine, own_target, word_tokenizer


def test_a_queue_below_one_is_a_serve_error():
    eng = engine(own_target(tiny_setup("llama")))
    with pytest.raises(ServeError, match=r"^max_queue 0: must be >= 1"):
        create_app(eng, word_tokenizer(), "tiny", max_queue=0, end_ids=())
    assert issubclass(ServeError, SpecdraftError) and issubclass(ServeError, ValueError)


def test_a_target_without_a_tokenizer_is_named(tmp_path):
    target = tmp_path / "target"
    shutil.copytree(tiny_setup("llama").target_dir, target)  # config and weights, no tokenizer
    with pytest.raises(ServeError, match=f"^{target}: no tokenizer could be loaded"):
        build_app(str(target), None, None)


def test_unreadable_launch_flags_are_engine_args_errors():
    with pytest.raises(EngineArgsError, match="No closing quotation; quote the launch command"):
        parse_engine_args('vllm serve m --speculative-config \'{"method": 1}', "vllm")
    with pytest.raises(EngineArgsError, match="--speculative-num-steps 'x' is not an integer"):
        parse_engine_args("python -m sglang.launch_server --speculative-num-steps x", "sglang")
    incomplete = parse_engine_args("sglang --speculative-num-steps 3", "sglang")
    with pytest.raises(EngineArgsError, match="SGLang speculative settings are incomplete"):
        incomplete.spec_config()
