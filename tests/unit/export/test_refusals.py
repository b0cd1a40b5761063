"""export's refusals name the cause (issue #34 item 10): a target class no engine rule covers
(Qwen3.5's hybrid attention, Gemma 4) is named as such, with no "pass --target" advice when
--target was passed."""

from __future__ import annotations

import pytest

from specdraft.export import ExportError, export_draft
from tests.support.doctor_helpers import one_thread, unsupported_target  # noqa: F401


@pytest.mark.parametrize(
    ("config_class", "architecture"),
    [("Qwen3_5TextConfig", "Qwen3_5ForCausalLM"), ("Gemma4TextConfig", "Gemma4ForCausalLM")],
)
def test_export_names_a_target_class_without_engine_rule(tmp_path, config_class, architecture):
    draft, target = unsupported_target(tmp_path, config_class)
    with pytest.raises(ExportError) as err:
        export_draft(draft, tmp_path / "out", engine="sglang", target=target)
    message = str(err.value)
    assert f"no engine rule is known for the target class {architecture} (target {target})" in (
        message
    )
    assert "--target" not in message and not (tmp_path / "out").exists()
