"""doctor's chat_template_matches_manifest with a served template file (--chat-template, or the
launch line's): plain text served plain passes, SGLang's reading of the training file passes only
when the sample chats render alike, and a launch line's file that is not here is a skip."""

from __future__ import annotations

import json

import pytest

from specdraft.data.template import template_fingerprint
from specdraft.doctor import run_doctor
from tests.support.doctor_helpers import draft_checkpoint, one_thread  # noqa: F401
from tests.support.tiny_tokenizer import CHAT, TEMPLATE, tiny_chat_tokenizer


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """(drafter dir, base target dir, chats file, root): the target's tokenizer has no template."""
    root = tmp_path_factory.mktemp("parity")
    draft, target = draft_checkpoint(root)
    tiny_chat_tokenizer(template=None).save_pretrained(target)  # a base model
    chats = root / "chats.jsonl"
    chats.write_text(json.dumps({"messages": CHAT}) + "\n")
    return draft, target, chats, root


CHECK = "chat_template_matches_manifest"
SGLANG = "python -m sglang.launch_server --model-path T --speculative-algorithm EAGLE3"


def trained_with(draft, render_info: dict) -> None:
    """Make the manifest say the drafter was rendered as `render_info` (RenderInfo.to_dict)."""
    file = draft / "specdraft_manifest.json"
    manifest = json.loads(file.read_text())
    manifest["chat_template"] = {"kwargs": {}, "reasoning": "keep", **render_info}
    file.write_text(json.dumps(manifest))


def template_file(root, name: str, text: str):
    path = root / name
    path.write_text(text)
    return path


def test_plain_text_served_plain_passes_and_served_with_a_template_fails(world):
    draft, target, _, root = world
    trained_with(draft, {"hash": None, "chat": False})
    plain = run_doctor(draft, target=target, engine="vllm").finding(CHECK)
    assert plain.verdict == "pass", plain
    assert plain.evidence == "trained on plain text (--no-chat) and served without --chat-template"
    file = template_file(root, "served.jinja", TEMPLATE)
    served = run_doctor(draft, target=target, engine="vllm", chat_template=file).finding(CHECK)
    assert served.verdict == "fail" and f"served with chat template {file}" in served.evidence


def test_sglang_reading_the_training_file_passes_when_the_chats_render_alike(world):
    draft, target, chats, root = world
    file = template_file(root, "trailing.jinja", TEMPLATE + "\n")  # Jinja drops one trailing \n
    trained_with(draft, {"hash": template_fingerprint(file.read_text()), "chat": True})
    launch = f"{SGLANG} --chat-template {file}"
    finding = run_doctor(draft, target=target, engine_args=launch, samples=chats).finding(CHECK)
    assert finding.verdict == "pass", finding
    assert finding.evidence == (
        "the training template file as SGLang reads it; 1 chats render identically"
    )
    without_chats = run_doctor(draft, target=target, engine_args=launch).finding(CHECK)
    assert without_chats.verdict == "skip" and "as written is the training template" in (
        without_chats.evidence
    )
    as_written = run_doctor(draft, target=target, engine="vllm", chat_template=file)
    assert as_written.finding(CHECK).verdict == "pass"


def test_sglang_reading_the_training_file_otherwise_fails_naming_the_difference(world):
    draft, target, chats, root = world
    file = template_file(
        root, "escaped.jinja", "\\n" + TEMPLATE
    )  # SGLang: a newline, as written: "\\n"
    trained_with(draft, {"hash": template_fingerprint(file.read_text()), "chat": True})
    finding = run_doctor(
        draft, target=target, engine="sglang", chat_template=file, samples=chats
    ).finding(CHECK)
    served = template_fingerprint("\n" + TEMPLATE)[:12]
    assert finding.verdict == "fail", finding
    assert finding.evidence.startswith(
        f"chat template hash {served} (serving: {file} as SGLang reads it) vs "
        f"{template_fingerprint(file.read_text())[:12]} (training): {file} as SGLang reads it "
        "renders otherwise: chat 0 (full chat)"
    )
    assert finding.fix.startswith(f"drop {file}'s outer newlines")


def test_a_launch_line_template_not_here_is_a_skip_naming_it(world):
    draft, target, chats, _ = world
    trained_with(draft, {"hash": template_fingerprint(TEMPLATE), "chat": True})
    launch = "vllm serve T --chat-template /serving/host/chat.jinja"
    finding = run_doctor(draft, target=target, engine_args=launch).finding(CHECK)
    assert finding.verdict == "skip"
    assert "the served chat template: --chat-template /serving/host/chat.jinja: cannot read" in (
        finding.evidence
    )
    assert finding.fix == "pass --chat-template FILE, the file it names"


def test_a_doctor_chat_template_that_cannot_be_read_is_refused(world, tmp_path):
    draft, target, _, _ = world
    with pytest.raises(ValueError, match=r"--chat-template .*missing.jinja: cannot read it"):
        run_doctor(draft, target=target, chat_template=tmp_path / "missing.jinja")
