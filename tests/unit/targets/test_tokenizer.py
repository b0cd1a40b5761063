"""specdraft.targets.tokenizer.load_target_tokenizer: the one way a target's tokenizer is read; a
directory without one, or with files transformers cannot read, is one line naming the directory
and the fix (transformers' own words were several lines, cut to "from one of: ")."""

from __future__ import annotations

import pytest

from specdraft.errors import UnusableInput
from specdraft.targets.tokenizer import TargetTokenizerError, load_target_tokenizer
from tests.support.tiny_tokenizer import save_tiny_tokenizer


def test_a_saved_tokenizer_loads(tmp_path):
    assert len(load_target_tokenizer(save_tiny_tokenizer(tmp_path / "t"))) == 85


def test_a_directory_whose_tokenizer_json_was_deleted_names_the_files_and_the_fix(tmp_path):
    target = save_tiny_tokenizer(tmp_path / "t")
    (target / "tokenizer.json").unlink()  # tokenizer_config.json is left: no vocabulary
    with pytest.raises(TargetTokenizerError) as caught:
        load_target_tokenizer(target)
    assert str(caught.value) == (
        f"{target} has no tokenizer files (tokenizer.json / tokenizer.model); save the target's "
        "tokenizer into its directory"
    )
    assert isinstance(caught.value, UnusableInput)  # the CLI exits 2
    assert caught.value.fix == "save the target's tokenizer into its directory"


def test_a_damaged_tokenizer_file_gives_transformers_reason_on_one_line(tmp_path):
    target = save_tiny_tokenizer(tmp_path / "t")
    text = (target / "tokenizer.json").read_text()
    (target / "tokenizer.json").write_text(text[:100])
    with pytest.raises(TargetTokenizerError) as caught:
        load_target_tokenizer(target, fix="pass --tokenizer DIR")
    message = str(caught.value)
    assert message.startswith(f"{target}: transformers cannot read its tokenizer files (Expecting")
    assert message.endswith("); pass --tokenizer DIR") and "\n" not in message
