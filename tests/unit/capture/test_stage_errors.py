"""Bad capture input is a CaptureError (a SpecdraftError) naming the file and the fix."""

from __future__ import annotations

import pytest

from specdraft.capture.from_peer import target_text_config
from specdraft.capture.stage import CaptureConfig, load_samples
from specdraft.capture.store import CaptureError, read_index
from specdraft.data.render import Rendering
from specdraft.targets.tokenizer import TargetTokenizerError


def test_an_index_that_is_not_utf8_json_is_named(tmp_path):
    path = tmp_path / "index.json"
    path.write_bytes(b"\xff\xfe{")
    with pytest.raises(CaptureError, match=r"index.json: not valid JSON"):
        read_index(path)


def test_a_target_config_that_is_not_json_is_named(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(CaptureError, match=r"config.json: cannot be read as JSON .*--target"):
        target_text_config(tmp_path, "--target")
    (tmp_path / "config.json").write_text("[1]")
    with pytest.raises(CaptureError, match=r"config.json: not a JSON object"):
        target_text_config(tmp_path, "--target")


def test_an_unknown_engine_is_a_capture_error():
    with pytest.raises(CaptureError, match="capture engine 'sglang'"):
        CaptureConfig("t", "d", "o", engine="sglang")


def test_a_directory_without_a_tokenizer_is_named(tmp_path):
    with pytest.raises(TargetTokenizerError) as caught:
        load_samples(tmp_path, tmp_path / "data.jsonl", 128, Rendering(), tokenizer=str(tmp_path))
    assert str(caught.value) == (
        f"{tmp_path} has no tokenizer files (tokenizer.json / tokenizer.model); pass --tokenizer "
        "DIR, the target's tokenizer"
    )
