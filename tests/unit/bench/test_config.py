"""bench and tune inputs the user must fix are SpecdraftErrors (one line at the CLI, never a
traceback) that name the file or value: settings out of range, prompts and suite files that are
missing or unreadable, a report directory that cannot be made."""

from __future__ import annotations

import shutil

import pytest

from specdraft.bench.config import BenchConfig, BenchInputError
from specdraft.bench.prompts import load_prompts
from specdraft.bench.report import make_out_dir
from specdraft.bench.suites import SuiteError, read_suite_file
from specdraft.bench.tune import load_tuned
from specdraft.bench.tune_model import TuneConfig
from specdraft.errors import SpecdraftError
from specdraft.targets.tokenizer import TargetTokenizerError
from tests.support.engine_helpers import tiny_setup


def test_bad_settings_are_bench_input_errors_and_still_value_errors():
    with pytest.raises(BenchInputError, match=r"concurrency \[0\]: give positive integers"):
        BenchConfig("http://127.0.0.1:8000", concurrency=(0,))
    with pytest.raises(BenchInputError, match="repeats 0: must be >= 1"):
        BenchConfig("http://127.0.0.1:8000", repeats=0)
    with pytest.raises(BenchInputError, match=r"TuneConfig.num_measure = 0 is out of range"):
        TuneConfig(num_measure=0)
    assert issubclass(BenchInputError, SpecdraftError) and issubclass(BenchInputError, ValueError)


def test_a_missing_or_non_utf8_prompts_file_is_named(tmp_path):
    with pytest.raises(BenchInputError, match=f"^{tmp_path / 'missing.jsonl'}: prompt file not"):
        load_prompts(str(tmp_path / "missing.jsonl"))
    binary = tmp_path / "prompts.jsonl"
    binary.write_bytes(b'{"prompt": "\xff\xfe"}\n')
    with pytest.raises(
        BenchInputError, match=f"^{binary}: not UTF-8 text; a prompts file is JSONL"
    ):
        load_prompts(str(binary))


def test_a_report_directory_that_cannot_be_made_is_named(tmp_path):
    (tmp_path / "file").write_text("x")
    out = tmp_path / "file" / "bench-out"
    with pytest.raises(BenchInputError, match=f"^{out}: cannot create the report directory"):
        make_out_dir(out)
    assert make_out_dir(tmp_path / "a" / "b").is_dir()


def test_a_suite_file_that_cannot_be_read_is_named(tmp_path):
    fake = tmp_path / "questions.jsonl.gz"
    fake.write_text('{"category": "writing", "turns": ["hi"]}\n')  # not gzip
    with pytest.raises(SuiteError, match=f"^{fake}: cannot be read .*give a spec-bench file"):
        read_suite_file(fake, "spec-bench")
    binary = tmp_path / "questions.jsonl"
    binary.write_bytes(b'{"category": "\xff", "turns": ["hi"]}\n')
    with pytest.raises(SuiteError, match=f"^{binary}: not UTF-8 text"):
        read_suite_file(binary, "spec-bench")


def test_a_target_without_a_tokenizer_is_named_by_tune(tmp_path):
    target = tmp_path / "target"
    shutil.copytree(tiny_setup("llama").target_dir, target)  # config and weights, no tokenizer
    with pytest.raises(TargetTokenizerError, match=f"^{target} has no tokenizer files"):
        load_tuned(target, tmp_path / "draft", TuneConfig())
