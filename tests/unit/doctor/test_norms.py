"""doctor's `norms_as_trained` (specdraft/doctor/norms.py): an EAGLE-3.1 drafter (fc_norm +
norm_output) exported for each engine passes; its flags dropped from the exported config.json
(specdraft_loads fails it too, as the loader refuses it), or
served by an SGLang release that does not read them, fail naming the flags; a drafter without a
manifest skips."""

from __future__ import annotations

import pytest

from specdraft.doctor import run_doctor
from specdraft.draft_config import method_flags
from specdraft.export import export_draft
from tests.support.doctor_helpers import draft_checkpoint, edit_config, one_thread  # noqa: F401

EAGLE31 = {k: v for k, v in method_flags("eagle3.1").items() if v}
PASSES = {
    "sglang": "trained as eagle3.1 (fc_norm, norm_output); SGLang builds the same from config.json",
    "vllm": "trained as eagle3.1 (fc_norm, norm_output); vLLM builds the same from config.json",
}


@pytest.fixture(scope="module")
def eagle31(tmp_path_factory):
    """(draft dir, target dir) of a seeded EAGLE-3.1 drafter with its manifest."""
    return draft_checkpoint(tmp_path_factory.mktemp("e31") / "m", draft_kw=EAGLE31)


def norms(path, target, engine, **kw):
    return run_doctor(path, target=target, engine=engine, **kw).finding("norms_as_trained")


@pytest.mark.parametrize(
    ("layout", "engine"), [("sglang", "sglang"), ("vllm", "vllm"), ("speculators", "vllm")]
)
def test_an_exported_eagle31_drafter_passes(eagle31, tmp_path, layout, engine):
    draft, target = eagle31
    export_draft(draft, tmp_path / layout, engine=layout, target=target)
    finding = norms(tmp_path / layout, target, engine)
    assert finding.verdict == "pass" and finding.evidence == PASSES[engine]


@pytest.mark.parametrize(
    ("dropped", "applied"),
    [
        (("fc_norm", "norm_output"), "eagle3 (no norm flag), without fc_norm, norm_output"),
        (("fc_norm",), "EAGLE-3 variant (norm_output), without fc_norm"),
        (("norm_output",), "EAGLE-3 variant (fc_norm), without norm_output"),
    ],
)
@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_flags_dropped_from_the_config_fail_naming_them(
    eagle31, tmp_path, engine, dropped, applied
):
    """The fault injected: the exported config.json loses flags, so the engine (which reads
    config.json, not the manifest) builds another drafter than the one trained; specdraft's
    loader refuses the file alike (specdraft_loads)."""
    draft, target = eagle31
    export_draft(draft, tmp_path / engine, engine=engine, target=target)
    edit_config(tmp_path / engine, lambda c: [c.pop(k) for k in dropped])
    report = run_doctor(tmp_path / engine, target=target, engine=engine)
    loads, finding = report.finding("specdraft_loads"), report.finding("norms_as_trained")
    assert loads.verdict == "fail" and f"{dropped[0]} False (config.json) vs True" in loads.evidence
    assert finding.verdict == "fail"
    name = {"sglang": "SGLang", "vllm": "vLLM"}[engine]
    assert finding.evidence == (
        f"trained as eagle3.1 (fc_norm, norm_output), but {name} applies {applied}: the engine "
        "runs another drafter than was trained"
    )
    assert finding.fix.startswith("re-export the drafter from its training run")


def test_an_sglang_release_without_the_flags_fails(eagle31, tmp_path):
    """SGLang reads fc_norm and norm_output from 0.5.12 on (`conventions.FLAG_RULES`)."""
    draft, target = eagle31
    export_draft(draft, tmp_path / "s", engine="sglang", target=target)
    old = norms(tmp_path / "s", target, "sglang", sglang_version="0.5.10")
    assert old.verdict == "fail"
    assert "SGLang applies eagle3 (no norm flag), without fc_norm, norm_output" in old.evidence
    assert norms(tmp_path / "s", target, "sglang", sglang_version="0.5.12").verdict == "pass"


def test_the_legacy_fc_norm_key_is_applied_by_sglang_only(eagle31, tmp_path):
    draft, target = eagle31
    export_draft(draft, tmp_path / "s", engine="sglang", target=target)
    edit_config(tmp_path / "s", lambda c: c.update(use_aux_norm=c.pop("fc_norm")))
    assert norms(tmp_path / "s", target, "sglang").verdict == "pass"
    vllm = norms(tmp_path / "s", target, "vllm")
    assert (
        vllm.verdict == "fail"
        and "vLLM applies EAGLE-3 variant (norm_output), without fc_norm" in vllm.evidence
    )


def test_a_drafter_without_a_manifest_skips(eagle31, tmp_path):
    draft, target = eagle31
    export_draft(draft, tmp_path / "s", engine="sglang", target=target)
    (tmp_path / "s" / "specdraft_manifest.json").unlink()
    finding = norms(tmp_path / "s", target, "sglang")
    assert finding.verdict == "skip" and "has no specdraft_manifest.json" in finding.evidence
