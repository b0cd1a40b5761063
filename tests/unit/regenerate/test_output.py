"""Bad regenerate input is a RegenerationError (a SpecdraftError) naming the value or file."""

from __future__ import annotations

import pytest

from specdraft.errors import SpecdraftError
from specdraft.regenerate.backends import RegenerationError, RegenerationSettingError, Sampling
from specdraft.regenerate.output import check_settings, settings_path


def test_a_sampling_value_out_of_range_is_a_setting_error():
    with pytest.raises(RegenerationSettingError, match=r"Sampling.top_p = 2: must be in") as caught:
        Sampling(top_p=2)
    assert isinstance(caught.value, SpecdraftError) and isinstance(caught.value, ValueError)


def test_a_damaged_settings_sidecar_is_named(tmp_path):
    out = tmp_path / "out.jsonl"
    out.write_text("")
    settings_path(out).write_text("{cut")
    with pytest.raises(RegenerationError, match=r"out.jsonl.settings.json: cannot be read as JSON"):
        check_settings(out, {"chat": True})
