"""specdraft doctor: the case table, engine-argument parsing, verdicts on healthy and broken drafters."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from specdraft.cli import app
from specdraft.doctor import CASES, CHECKS, EXPORT_CASES, run_doctor
from specdraft.export import export_draft
from specdraft.serve.engine_args import detect_engine, parse_engine_args
from tests.support.cli import cli_args
from tests.support.doctor_helpers import (  # noqa: F401
    edit_config,
    edit_weights,
    one_thread,
    sglang_export,
    sglang_launch,
)

REQUIRED_CASES = (
    "S1",
    "S2",
    "S3",
    "S4",
    "S5",
    "S6",
    "FC-01",
    "FC-02",
    "FC-03",
    "FC-06",
    "FC-08",
    "FC-09",
)
GOOD_SGLANG = sglang_launch(num_steps=3, eagle_topk=1, num_draft_tokens=4)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """(sglang export dir, target dir) of a healthy 5-layer drafter on [2, 3, 4]."""
    root = tmp_path_factory.mktemp("healthy")
    return sglang_export(root)


def verdicts(report) -> dict[str, str]:
    return {f.check: f.verdict for f in report.findings}


def test_every_case_id_is_covered_by_a_check_or_export():
    names = {c.__name__ for c in CHECKS}
    for case in REQUIRED_CASES:
        assert CASES.get(case) or case in EXPORT_CASES, case
    for case, checks in CASES.items():
        assert checks and set(checks) <= names, (case, set(checks) - names)
    assert len(names) == len(CHECKS)


def test_parse_sglang_and_vllm_flags():
    sglang = parse_engine_args(GOOD_SGLANG + " --trust-remote-code --tp 2", "sglang")
    assert (sglang.algorithm, sglang.num_steps, sglang.topk, sglang.num_draft_tokens) == (
        "EAGLE3",
        3,
        1,
        4,
    )
    assert (sglang.target_model, sglang.draft_model) == ("T", "D") and sglang.uses_eagle3
    assert parse_engine_args("--speculative_num_steps=5", "sglang").num_steps == 5
    vllm = parse_engine_args(
        "vllm serve meta/llama --speculative-config "
        '\'{"method": "eagle3", "model": "/d", "num_speculative_tokens": 4}\''
        " --default-chat-template-kwargs '{\"enable_thinking\": false}'",
        "vllm",
    )
    assert (vllm.algorithm, vllm.num_steps, vllm.draft_model, vllm.target_model) == (
        "eagle3",
        4,
        "/d",
        "meta/llama",
    )
    assert vllm.template_kwargs == {"enable_thinking": False}
    assert vllm.spec_config().num_draft_tokens == 5
    dotted = parse_engine_args(
        "--speculative-config.method eagle --speculative-config.num_speculative_tokens 2", "vllm"
    )
    assert (dotted.algorithm, dotted.num_steps) == ("eagle", 2)
    assert detect_engine(GOOD_SGLANG) == "sglang" and detect_engine("vllm serve x") == "vllm"
    with pytest.raises(ValueError, match="--speculative-num-steps 'three' is not an integer"):
        parse_engine_args("--speculative-num-steps three", "sglang")
    with pytest.raises(ValueError, match="--speculative-config .* is not JSON"):
        parse_engine_args("--speculative-config {method:", "vllm")


def test_both_engines_launch_chat_template_is_read():
    sglang = parse_engine_args(GOOD_SGLANG + " --chat-template /t/chat.jinja", "sglang")
    vllm = parse_engine_args("vllm serve m --chat-template=/t/chat.jinja --model x", "vllm")
    assert sglang.chat_template == vllm.chat_template == "/t/chat.jinja"
    assert (
        vllm.target_model == "x" and parse_engine_args("vllm serve m", "vllm").chat_template is None
    )


def test_healthy_export_passes_and_every_skip_says_why(exported):
    out, target = exported
    report = run_doctor(out, target=target, engine="sglang", engine_args=GOOD_SGLANG)
    got = verdicts(report)
    assert report.ok, [f for f in report.failed]
    for check in (
        "keys_match_engine",
        "shapes_and_dtypes",
        "values_finite",
        "vocab_map_valid",
        "fc_width_matches_aux",
        "aux_ids_read_alike",
        "engine_captures_training_layers",
        "algorithm_is_eagle3",
        "speculative_settings_valid",
        "variant_flags_implemented",
        "draft_vocab_size_declared",
        "lm_head_untied",
        "rope_matches_training",
        "aux_width_on_target",
    ):
        assert got[check] == "pass", (check, report.finding(check))
    skips = [f for f in report.findings if f.verdict == "skip"]
    assert {f.check for f in skips} >= {"offline_acceptance_matches_training", "online_acceptance"}
    assert all(f.evidence for f in skips)
    assert "SGLang captures [2, 3, 4]" in report.finding("engine_captures_training_layers").evidence
    assert report.finding("variant_flags_implemented").evidence == (
        "no variant flag set (norm_before_residual false): the plain EAGLE-3 drafter"
    )


def test_missing_weights_file_is_a_failing_finding_not_a_crash(exported, tmp_path):
    out, _ = exported
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text((out / "config.json").read_text())
    report = run_doctor(broken, engine="sglang")
    finding = report.finding("keys_match_engine")
    assert finding.verdict == "fail" and "model.safetensors: missing" in finding.evidence
    assert report.finding("values_finite").verdict == "skip"


def edited_export(exported, dst, engine: str = "sglang", weights=None, config=None):
    """`exported`'s drafter exported again to dst for `engine`, then its tensors and / or its
    config.json edited in place (`edit_weights` / `edit_config` functions)."""
    out, target = exported
    export_draft(out, dst, engine=engine, target=target)
    if weights is not None:
        edit_weights(dst, weights)
    if config is not None:
        edit_config(dst, config)
    return dst


def test_case_fc02_doctor_names_a_zeroed_d2t(exported, tmp_path):
    target = exported[1]
    bad = edited_export(exported, tmp_path / "bad", weights=lambda t: t["d2t"].zero_())
    finding = run_doctor(bad, target=target, engine="sglang").finding("vocab_map_valid")
    assert finding.verdict == "fail" and "d2t is all zeros" in finding.evidence


def test_case_fc02_doctor_requires_draft_vocab_size(exported, tmp_path):
    target = exported[1]
    bad = edited_export(exported, tmp_path / "bad", config=lambda c: c.pop("draft_vocab_size"))
    finding = run_doctor(bad, target=target, engine="sglang").finding("draft_vocab_size_declared")
    assert finding.verdict == "fail"
    assert (
        "lm_head has 64 rows < vocabulary 128" in finding.evidence
        and "full head" in finding.evidence
    )


def test_speculators_config_without_norm_before_residual_fails(exported, tmp_path):
    target = exported[1]
    spec = edited_export(
        exported,
        tmp_path / "spec",
        engine="speculators",
        config=lambda c: c.pop("norm_before_residual"),
    )
    finding = run_doctor(spec, target=target).finding("variant_flags_implemented")
    assert finding.verdict == "fail" and "vLLM then assumes true" in finding.evidence


def test_tied_head_fails(exported, tmp_path):
    target = exported[1]
    bad = edited_export(
        exported, tmp_path / "tied", config=lambda c: c.update(tie_word_embeddings=True)
    )
    finding = run_doctor(bad, target=target, engine="sglang").finding("lm_head_untied")
    assert finding.verdict == "fail" and "drops the trained lm_head" in finding.evidence


def test_nan_weight_fails(exported, tmp_path):
    target = exported[1]
    bad = edited_export(
        exported, tmp_path / "nan", weights=lambda t: t["norm.weight"].__setitem__(0, float("nan"))
    )
    finding = run_doctor(bad, target=target, engine="sglang").finding("values_finite")
    assert finding.verdict == "fail" and "norm.weight" in finding.evidence


def test_unreachable_server_fails_naming_it(exported):
    out, target = exported
    finding = run_doctor(out, target=target, server="http://localhost:1", server_wait_s=0).finding(
        "online_acceptance"
    )
    assert finding.verdict == "fail" and "http://localhost:1" in finding.evidence


def test_cli_doctor_json_and_exit_codes(exported):
    out, target = exported
    runner = CliRunner()
    good = runner.invoke(app, cli_args("doctor", out, target=target, engine="sglang", json=True))
    assert good.exit_code == 0, good.output
    report = json.loads(good.stdout)
    assert report["ok"] and report["counts"]["fail"] == 0
    assert {f["check"] for f in report["findings"]} == {c.__name__ for c in CHECKS}
    bad = runner.invoke(
        app,
        [
            "doctor",
            str(out),
            "--engine-args",
            "--speculative-algorithm EAGLE --speculative-num-steps 2",
        ],
    )
    assert bad.exit_code == 1
    assert "algorithm_is_eagle3" in bad.output and "FAIL" in bad.output


def test_doctor_refuses_unknown_engine(exported):
    with pytest.raises(ValueError, match="choose one of sglang, vllm"):
        run_doctor(exported[0], engine="trt")
    assert torch.get_num_threads() == 1  # the module fixture is active


def test_paths_that_do_not_exist_are_errors_not_skips(tmp_path):
    from specdraft.doctor import run_doctor

    draft = tmp_path / "draft"
    draft.mkdir()
    with pytest.raises(ValueError, match="nope: no such directory"):
        run_doctor(tmp_path / "nope")
    with pytest.raises(ValueError, match="no config.json; pass the target"):
        run_doctor(draft, target=tmp_path / "missing-target")
    with pytest.raises(ValueError, match="missing.jsonl: no such file"):
        run_doctor(draft, samples=tmp_path / "missing.jsonl")


def test_missing_fc_weight_is_named_without_an_empty_skip_list(exported, tmp_path):
    """vLLM loads a checkpoint without fc.weight (leaving fc random); doctor names the one
    parameter and says nothing of tensors to skip when there are none."""
    import shutil

    draft, target = exported
    shutil.copytree(draft, tmp_path / "d")
    edit_weights(tmp_path / "d", lambda t: t.pop("fc.weight"))
    finding = run_doctor(tmp_path / "d", target=target, engine="vllm").finding("keys_match_engine")
    assert finding.verdict == "fail"
    assert finding.evidence.startswith(
        "vLLM would leave 1 parameters at their initial values [fc.weight]"
    )
    assert "skip" not in finding.evidence


def test_checks_of_the_engine_command_line_fail_on_an_unreadable_one_and_skip_without_one(exported):
    """algorithm_is_eagle3 and speculative_settings_valid read --engine-args alike: a command line
    that does not parse fails both (the user's input is at fault), none given skips both."""
    out, _ = exported
    unreadable = run_doctor(out, engine="sglang", engine_args="--speculative-num-steps three")
    absent = run_doctor(out, engine="sglang")
    for check in ("algorithm_is_eagle3", "speculative_settings_valid"):
        finding = unreadable.finding(check)
        assert finding.verdict == "fail" and finding.fix == "fix the command line", finding
        assert finding.evidence.startswith(
            "--engine-args: --speculative-num-steps 'three' is not an integer"
        )
        skipped = absent.finding(check)
        assert (skipped.verdict, skipped.evidence) == ("skip", "no --engine-args"), skipped
        assert (
            skipped.fix.startswith("pass the SGLang or vLLM launch command")
            and "specdraft serve needs none" in skipped.fix
        )
