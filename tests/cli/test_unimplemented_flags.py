"""A config flag specdraft's drafter does not implement is refused the same way by every command
that loads a drafter, manifest or not, naming the flag (issue #20 item 8); doctor's finding uses
the same rule and names the flag that is set."""

from __future__ import annotations

import pytest

from specdraft.checkpoint import UNIMPLEMENTED_FLAGS, unimplemented_flags
from specdraft.doctor import run_doctor
from tests.support.cli import cli_args, flat, invoke
from tests.support.doctor_helpers import draft_checkpoint, edit_config, one_thread  # noqa: F401
from tests.support.tiny_tokenizer import save_tiny_tokenizer


@pytest.fixture(scope="module")
def flagged(tmp_path_factory):
    """(drafter with its manifest, the same without, target): both set mlp_bias: true."""
    root = tmp_path_factory.mktemp("flags")
    draft, target = draft_checkpoint(root / "m")
    bare, _ = draft_checkpoint(root / "b")
    (bare / "specdraft_manifest.json").unlink()
    save_tiny_tokenizer(target)
    for d in (draft, bare):
        edit_config(d, lambda c: c.update(mlp_bias=True))
    return draft, bare, target


def commands(draft, target, out):
    return {
        "inspect": ["inspect", str(draft), "--target", str(target)],
        "export": cli_args("export", draft, out, engine="vllm", target=target),
        "convert": cli_args("convert", draft, out, layout="sglang", target=target),
        "generate": cli_args(
            "generate",
            target=target,
            draft=draft,
            prompt="hello how",
            max_new_tokens=2,
            max_seq_len=32,
        ),
    }


@pytest.mark.parametrize("with_manifest", [True, False])
@pytest.mark.parametrize("command", ["inspect", "export", "convert", "generate"])
def test_every_command_refuses_an_unimplemented_flag(flagged, tmp_path, command, with_manifest):
    draft, bare, target = flagged
    chosen = draft if with_manifest else bare
    result = invoke(commands(chosen, target, tmp_path / "out")[command])
    text = flat(result.output)
    assert result.exit_code == 1, result.output
    assert (
        f"{chosen}/config.json: sets mlp_bias: true, which specdraft's drafter does not implement"
        in text
    ), text
    assert "Traceback" not in result.output and not (tmp_path / "out").exists()


@pytest.mark.parametrize("with_manifest", [True, False])
def test_doctor_names_the_flag_that_is_set(flagged, with_manifest):
    draft, bare, target = flagged
    finding = run_doctor(draft if with_manifest else bare, target=target).finding(
        "variant_flags_implemented"
    )
    assert finding.verdict == "fail"
    assert "sets mlp_bias: true" in finding.evidence and finding.fix.startswith("mlp_bias: ")
    assert "norm_before_residual" not in finding.fix


def test_the_rule_reads_the_layer_config_of_a_speculators_file():
    assert unimplemented_flags(
        {"transformer_layer_config": {"mlp_bias": True}, "fc_norm": False}
    ) == {"mlp_bias": True}
    assert unimplemented_flags({"norm_before_residual": False}) == {}
    assert set(unimplemented_flags({k: 1 for k in UNIMPLEMENTED_FLAGS})) == set(UNIMPLEMENTED_FLAGS)
