"""export and the norm flags: each engine gets the flags it implements unchanged (top-level, as
SGLang, vLLM and speculators read them) and refuses those it does not, naming the engine file and
version (`conventions.FLAG_RULES`)."""

from __future__ import annotations

import pytest

from specdraft.checkpoint import load_draft
from specdraft.draft_config import NORM_FLAGS
from specdraft.export import EXPORT_ENGINES, ExportError, export_draft
from tests.support.doctor_helpers import draft_checkpoint
from tests.support.drafts import FLAG_COMBINATIONS, flag_id


def refusal(engine: str, flags: dict[str, bool]) -> str | None:
    """The reason the engine refuses, per the engines' sources (None = exported)."""
    if engine == "sglang" and flags["norm_before_residual"]:
        return r"sglang: SGLang does not implement norm_before_residual \(sglang 0.5.23 srt/models/llama_eagle3.py"
    if engine == "speculators" and flags["norm_before_fc"] and flags["fc_norm"]:
        return "speculators 0.9.0 refuses together"
    return None


@pytest.mark.parametrize("flags", FLAG_COMBINATIONS, ids=flag_id)
def test_each_engine_exports_the_flags_it_implements_and_refuses_the_rest(tmp_path, flags):
    draft, target = draft_checkpoint(tmp_path / "m", draft_kw=flags)
    for engine in EXPORT_ENGINES:
        out = tmp_path / engine
        reason = refusal(engine, flags)
        if reason:
            with pytest.raises(ExportError, match=reason):
                export_draft(draft, out, engine=engine, target=target)
            assert not out.exists()
            continue
        config = export_draft(draft, out, engine=engine, target=target).config
        assert {k: bool(config.get(k)) for k in NORM_FLAGS} == flags
        assert config["norm_before_residual"] is flags["norm_before_residual"]  # always explicit
        assert {k: getattr(load_draft(out).model.cfg, k) for k in NORM_FLAGS} == flags


def test_doctor_fails_a_flag_the_checked_engine_does_not_implement(tmp_path):
    """A vLLM export of a norm_before_residual drafter: doctor passes it for vLLM and fails it
    for SGLang, naming SGLang's file and version."""
    from specdraft.doctor import run_doctor

    draft, target = draft_checkpoint(
        tmp_path / "m", draft_kw={"norm_before_residual": True, "norm_output": True}
    )
    export_draft(draft, tmp_path / "v", engine="vllm", target=target)
    for_vllm = run_doctor(tmp_path / "v", target=target, engine="vllm").finding(
        "variant_flags_implemented"
    )
    assert for_vllm.verdict == "pass" and for_vllm.evidence == (
        "norm_before_residual true, norm_output true: implemented by vLLM and specdraft's drafter "
        "(EAGLE-3 variant (norm_before_residual, norm_output))"
    )
    for_sglang = run_doctor(tmp_path / "v", target=target, engine="sglang").finding(
        "variant_flags_implemented"
    )
    assert for_sglang.verdict == "fail"
    assert (
        "SGLang does not implement norm_before_residual (sglang 0.5.23 srt/models/llama_eagle3.py"
        in for_sglang.evidence
    )


def test_doctor_fails_the_legacy_fc_norm_key_for_vllm(tmp_path):
    """SGLang reads fc_norm under its legacy name use_aux_norm, vLLM 0.32 only as fc_norm."""
    from specdraft.doctor import run_doctor
    from tests.support.doctor_helpers import edit_config

    draft, target = draft_checkpoint(tmp_path / "m", draft_kw={"fc_norm": True})
    export_draft(draft, tmp_path / "s", engine="sglang", target=target)
    edit_config(tmp_path / "s", lambda c: c.update(use_aux_norm=c.pop("fc_norm")))
    assert load_draft(tmp_path / "s").model.cfg.fc_norm
    for_sglang = run_doctor(tmp_path / "s", target=target, engine="sglang").finding(
        "variant_flags_implemented"
    )
    assert for_sglang.verdict == "pass" and "fc_norm" in for_sglang.evidence
    for_vllm = run_doctor(tmp_path / "s", target=target, engine="vllm").finding(
        "variant_flags_implemented"
    )
    assert (
        for_vllm.verdict == "fail" and "vLLM does not implement use_aux_norm" in for_vllm.evidence
    )


@pytest.mark.parametrize(
    ("flag", "old", "new"),
    [("fc_norm", "0.5.10", "0.5.12"), ("norm_before_fc", "0.5.12", "0.5.17")],
)
def test_an_sglang_release_older_than_a_flag_is_refused_by_export_and_failed_by_doctor(
    tmp_path, flag, old, new
):
    """SGLang reads fc_norm / norm_output from 0.5.12 and norm_before_fc from 0.5.17 on (run in
    tests/sglang_tier): an older release builds the drafter without the flag, silently. export
    --sglang-version OLD refuses it naming both releases; doctor --sglang-version OLD fails it;
    NEW passes both."""
    from specdraft.doctor import run_doctor

    draft, target = draft_checkpoint(tmp_path / "m", draft_kw={flag: True})
    with pytest.raises(
        ExportError, match=f"SGLang {old} does not implement {flag}: it reads it from {new} on"
    ):
        export_draft(draft, tmp_path / "old", engine="sglang", target=target, sglang_version=old)
    assert not (tmp_path / "old").exists()
    export_draft(draft, tmp_path / "new", engine="sglang", target=target, sglang_version=new)
    finding = lambda v: run_doctor(  # noqa: E731
        tmp_path / "new", target=target, engine="sglang", sglang_version=v
    ).finding("variant_flags_implemented")
    assert finding(new).verdict == "pass"
    failed = finding(old)
    assert failed.verdict == "fail" and f"SGLang {old} does not implement {flag}" in failed.evidence


def test_an_eagle31_drafter_exports_to_each_engine_under_eagle3(tmp_path):
    """--method eagle3.1's drafter (fc_norm + norm_output): each engine gets both keys top-level,
    norm_before_residual false, and is served under its EAGLE-3 method (vLLM `method: eagle3`,
    SGLang EAGLE3; speculators_model_type eagle3); the config written names the method."""
    from specdraft.draft_config import method_flags, method_label

    flags = method_flags("eagle3.1")
    draft, target = draft_checkpoint(tmp_path / "m", draft_kw={k: v for k, v in flags.items() if v})
    served = {
        "sglang": "--speculative-algorithm EAGLE3",
        "vllm": '"method": "eagle3"',
        "speculators": "vllm serve",
    }
    for engine in EXPORT_ENGINES:
        result = export_draft(draft, tmp_path / engine, engine=engine, target=target)
        assert method_label(result.config) == "eagle3.1 (fc_norm, norm_output)"  # export's line
        assert {k: result.config.get(k, False) for k in NORM_FLAGS} == flags
        assert served[engine] in result.launch_command
    assert result.config["speculators_model_type"] == "eagle3"


def test_an_eagle31_drafter_is_refused_for_an_sglang_release_without_its_norms(tmp_path):
    draft, target = draft_checkpoint(
        tmp_path / "m", draft_kw={"fc_norm": True, "norm_output": True}
    )
    with pytest.raises(ExportError) as refused:
        export_draft(
            draft, tmp_path / "old", engine="sglang", target=target, sglang_version="0.5.11"
        )
    message = str(refused.value)
    assert message.startswith(
        "cannot export this eagle3.1 (fc_norm, norm_output) drafter for sglang: SGLang 0.5.11 "
        "does not implement fc_norm: it reads it from 0.5.12 on"
    )
    assert "SGLang 0.5.11 does not implement norm_output" in message and "\n" not in message
    export_draft(draft, tmp_path / "new", engine="sglang", target=target, sglang_version="0.5.12")
