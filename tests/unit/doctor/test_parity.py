"""aux_width_on_target's fix names the cause of an aux width other than fc's input (issue #34
item 8): a drafter built for another hidden size, an engine's default ids naming fewer than 3
layers, or no aux capture at all."""

from __future__ import annotations

from specdraft.doctor import run_doctor
from specdraft.export import export_draft
from tests.support.doctor_helpers import (  # noqa: F401
    draft_checkpoint,
    edit_config,
    one_thread,
    sglang_launch,
)
from tests.support.tiny_models import save_tiny_model

KEY = "eagle_aux_hidden_state_layer_ids"
EAGLE = sglang_launch("{}", num_steps=3, eagle_topk=1, num_draft_tokens=4)


def width_finding(draft, target, **kw):
    return run_doctor(draft, target=target, engine="sglang", **kw).finding("aux_width_on_target")


def test_a_drafter_for_another_hidden_size_is_named(tmp_path):
    draft, _ = draft_checkpoint(tmp_path / "wide", hidden_size=48)
    other = save_tiny_model("llama", tmp_path / "narrow", num_layers=5)  # hidden 32
    finding = width_finding(draft, other)
    assert finding.verdict == "fail", finding
    assert "fc takes 144 = 3 x 48" in finding.evidence
    assert finding.fix.startswith("the drafter was built for a target of hidden size 48, not")
    assert "aux capture" not in finding.fix


def test_default_ids_that_name_fewer_layers_are_named(tmp_path):
    """A 5-layer target, a config without ids: SGLang's default [2, L//2, L-3] is [2, 2, 2]."""
    draft, target = draft_checkpoint(tmp_path)
    export_draft(draft, tmp_path / "out", engine="sglang", target=target)
    edit_config(tmp_path / "out", lambda c: (c.pop(KEY, None), c.pop("eagle_config")))
    finding = width_finding(tmp_path / "out", target)
    assert finding.verdict == "fail", finding
    assert finding.fix.startswith(
        "SGLang captures 1 layers (no eagle_config ids: SGLang's default), not the 3 fc fuses"
    )
    assert "aux capture" not in finding.fix


def test_no_aux_capture_is_named(tmp_path):
    draft, target = draft_checkpoint(tmp_path)
    export_draft(draft, tmp_path / "out", engine="sglang", target=target)
    finding = width_finding(tmp_path / "out", target, engine_args=EAGLE.format("EAGLE"))
    assert finding.verdict == "fail", finding
    assert finding.fix.startswith("serve with EAGLE-3 aux capture")
    assert width_finding(tmp_path / "out", target, engine_args=EAGLE.format("EAGLE3")).verdict == (
        "pass"
    )
