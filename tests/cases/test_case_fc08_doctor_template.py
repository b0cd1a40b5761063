"""FC-08: the chat template rendered differently in training and serving (a thinking switch).
Doctor compares the serving tokenizer's fingerprint and template hash with the manifest and
renders sample chats with the training and the serving kwargs."""

from __future__ import annotations

import json

import pytest

from specdraft.data.render import template_hash, tokenizer_fingerprint
from specdraft.doctor import run_doctor
from specdraft.export import export_draft
from tests.support.doctor_helpers import draft_checkpoint, one_thread  # noqa: F401
from tests.support.tiny_tokenizer import CHAT, tiny_chat_tokenizer


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """(export trained with enable_thinking=True, target dir with its tokenizer, chats file)."""
    root = tmp_path_factory.mktemp("fc08")
    draft, target = draft_checkpoint(root)
    tokenizer = tiny_chat_tokenizer()
    tokenizer.save_pretrained(target)
    export_draft(draft, root / "out", engine="vllm", target=target)
    file = root / "out" / "specdraft_manifest.json"
    manifest = json.loads(file.read_text())
    manifest["tokenizer"] = tokenizer_fingerprint(tokenizer)
    manifest["chat_template"] = {
        "hash": template_hash(tokenizer),
        "kwargs": {"enable_thinking": True},
        "chat": True,
    }
    file.write_text(json.dumps(manifest))
    chats = root / "chats.jsonl"
    chats.write_text(json.dumps({"messages": CHAT}) + "\n")
    return root / "out", target, chats


def test_case_fc08_thinking_switch_off_at_serving_fails_render_parity(world):
    ckpt, target, chats = world
    finding = run_doctor(ckpt, target=target, engine="vllm", samples=chats).finding(
        "chat_template_matches_manifest"
    )
    assert finding.verdict == "fail"
    assert "{'enable_thinking': True} (training) vs {} (serving)" in finding.evidence
    assert "chat 0 (full chat)" in finding.evidence and "<think>" in finding.evidence


def test_case_fc08_same_kwargs_pass(world):
    ckpt, target, chats = world
    args = (
        'vllm serve T --speculative-config \'{"method": "eagle3", "num_speculative_tokens": 3}\' '
        "--default-chat-template-kwargs '{\"enable_thinking\": true}'"
    )
    report = run_doctor(ckpt, target=target, engine="vllm", engine_args=args, samples=chats)
    assert report.finding("chat_template_matches_manifest").verdict == "pass"
    assert report.finding("tokenizer_matches_manifest").verdict == "pass"


def test_case_fc08_kwargs_differ_without_chats_is_a_skip_not_a_pass(world):
    ckpt, target, _ = world
    finding = run_doctor(ckpt, target=target, engine="vllm").finding(
        "chat_template_matches_manifest"
    )
    assert finding.verdict == "skip" and "template kwargs differ" in finding.evidence


def test_case_fc08_other_template_or_tokenizer_fails(world, tmp_path):
    ckpt, target, chats = world
    other = tmp_path / "target"
    other.mkdir()
    (other / "config.json").write_text((target / "config.json").read_text())
    (other / "model.safetensors").write_bytes((target / "model.safetensors").read_bytes())
    tokenizer = tiny_chat_tokenizer(
        template="{% for m in messages %}{{ m['content'] }}{% endfor %}"
    )
    tokenizer.add_tokens(["extra"])
    tokenizer.save_pretrained(other)
    report = run_doctor(ckpt, target=other, engine="vllm", samples=chats)
    template = report.finding("chat_template_matches_manifest")
    assert template.verdict == "fail" and "chat template hash" in template.evidence
    fingerprint = report.finding("tokenizer_matches_manifest")
    assert (
        fingerprint.verdict == "fail"
        and "vocab_hash" in fingerprint.evidence
        and "length 86" in fingerprint.evidence
    )
