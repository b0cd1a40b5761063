"""A target directory whose tokenizer.json was deleted: every command that reads the target's
tokenizer prints one line naming the directory and the fix and exits 2, as for other unusable
inputs (generate printed a traceback, serve a reason cut to "from one of: ")."""

from __future__ import annotations

import pytest

from tests.support.cli import cli_args, invoke, one_error
from tests.support.doctor_helpers import draft_checkpoint, one_thread  # noqa: F401
from tests.support.tiny_tokenizer import save_tiny_tokenizer


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """(drafter dir, its target dir: a tokenizer_config.json but no tokenizer.json)."""
    root = tmp_path_factory.mktemp("no-tokenizer")
    draft, target = draft_checkpoint(root)
    save_tiny_tokenizer(target)
    (target / "tokenizer.json").unlink()
    return draft, target


COMMANDS = {
    "generate": ["generate", "--target", "{target}", "--prompt", "hi", "--max-seq-len", "32"],
    "generate --draft": [
        "generate",
        "--target",
        "{target}",
        "--draft",
        "{draft}",
        "--prompt",
        "hi",
    ],
    "serve": ["serve", "--target", "{target}", "--no-spec"],
    "tune": cli_args("tune", target="{target}", draft="{draft}", max_tokens=2),
}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_target_without_tokenizer_files_is_one_line_and_exit_2(world, command):
    draft, target = world
    args = [word.format(draft=draft, target=target) for word in COMMANDS[command]]
    text = one_error(invoke(args), code=2)
    assert text == (
        f"error: {target} has no tokenizer files (tokenizer.json / tokenizer.model); save the "
        "target's tokenizer into its directory"
    )


def test_doctor_skips_what_needs_the_tokenizer_with_the_same_reason(world):
    """doctor's evidence: Unavailable (its checks skip) with the loader's reason and fix."""
    from specdraft.doctor.evidence import Evidence
    from specdraft.doctor.file_evidence import Unavailable
    from specdraft.doctor.inputs import DoctorInputs

    draft, target = world
    with pytest.raises(Unavailable) as caught:
        _ = Evidence(DoctorInputs(draft, target=target)).tokenizer
    assert caught.value.reason == (
        f"{target} has no tokenizer files (tokenizer.json / tokenizer.model)"
    )
    assert caught.value.fix == "save the target's tokenizer into its directory"
