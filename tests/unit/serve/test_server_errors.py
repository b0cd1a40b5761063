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
from specdraft.targets.tokenizer import TargetTokenizerError
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
    with pytest.raises(TargetTokenizerError, match=f"^{target} has no tokenizer files"):
        build_app(str(target), None, None)


def test_unreadable_launch_flags_are_engine_args_errors():
    with pytest.raises(EngineArgsError, match="No closing quotation; quote the launch command"):
        parse_engine_args('vllm serve m --speculative-config \'{"method": 1}', "vllm")
    with pytest.raises(EngineArgsError, match="--speculative-num-steps 'x' is not an integer"):
        parse_engine_args("python -m sglang.launch_server --speculative-num-steps x", "sglang")
    incomplete = parse_engine_args("sglang --speculative-num-steps 3", "sglang")
    with pytest.raises(EngineArgsError, match="SGLang speculative settings are incomplete"):
        incomplete.spec_config()


def test_serve_reads_its_chat_template_file_before_the_model(tmp_path):
    """`serve --chat-template FILE` reaches the tokenizer: a file that cannot be read is one line
    naming it, before any model loads; a readable one replaces the tokenizer's template."""
    from typer.testing import CliRunner

    from specdraft.cli import app
    from specdraft.serve.server import target_tokenizer

    target = tmp_path / "target"
    shutil.copytree(tiny_setup("llama").target_dir, target)
    word_tokenizer().save_pretrained(target)
    missing = tmp_path / "missing.jinja"
    result = CliRunner().invoke(
        app, ["serve", "--target", str(target), "--no-spec", "--chat-template", str(missing)]
    )
    assert result.exit_code == 1, result.output
    assert result.output.startswith(f"error: --chat-template {missing}: cannot read it")
    template = tmp_path / "chat.jinja"
    template.write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    assert target_tokenizer(target, str(template)).chat_template == template.read_text()
