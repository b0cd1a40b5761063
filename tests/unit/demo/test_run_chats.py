"""`specdraft demo --chat-template FILE --data chats.jsonl`: the bundled base target (no chat
template of its own) runs the pipeline on chats rendered with the file; the launch lines serve
it, and doctor's chat check passes on the drafter and on the vLLM export."""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from specdraft.capture.store import CaptureStore
from specdraft.data.template import template_fingerprint
from specdraft.demo.config import DemoConfig
from specdraft.demo.inputs import check_inputs
from specdraft.demo.run import run_demo
from specdraft.errors import UnusableInput
from tests.support.demo import tiny_demo_config

TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}\n"
)


def chat_demo(tmp_path, num_chats: int = 4) -> DemoConfig:
    data = tmp_path / "chats.jsonl"
    chat = lambda i: [  # noqa: E731
        {"role": "user", "content": f"Tell me about the cat number {i}."},
        {"role": "assistant", "content": "Once upon a time there was a cat."},
    ]
    data.write_text("".join(json.dumps({"messages": chat(i)}) + "\n" for i in range(num_chats)))
    template = tmp_path / "chat.jinja"
    template.write_text(TEMPLATE)
    return tiny_demo_config(tmp_path / "demo", data, chat_template=template)


def test_the_demo_trains_and_serves_chats_with_the_template_file(tmp_path):
    cfg = chat_demo(tmp_path)
    said = io.StringIO()
    report = run_demo(cfg, Console(file=said, width=400))
    assert f"data: 3 training and 1 held-out chats in {cfg.out / 'data'}" in said.getvalue()
    assert (cfg.out / "data" / "train.jsonl").is_file()
    fingerprint = template_fingerprint(TEMPLATE)
    for store in ("store", "store-heldout"):
        assert CaptureStore(cfg.out / store).meta["chat_template"]["hash"] == fingerprint
    assert all(
        c.endswith(f" --chat-template {cfg.chat_template}") for c in report.launch_commands.values()
    ), report.launch_commands
    chat_checks = [f for f in report.doctor if f["check"] == "chat_template_matches_manifest"]
    assert [f["verdict"] for f in chat_checks] == ["pass", "pass"], chat_checks
    lint = {e: {f["check"]: f for f in fs} for e, fs in report.lint.items()}
    assert lint["vllm"]["chat_template_matches_manifest"]["verdict"] == "pass"


def test_chats_are_checked_before_any_stage(tmp_path):
    cfg = chat_demo(tmp_path, num_chats=3)
    with pytest.raises(UnusableInput, match=r"holds 3 chat\(s\); the demo needs 4"):
        check_inputs(cfg)
    missing = DemoConfig(
        out=cfg.out, data=cfg.data, chat_template=tmp_path / "none.jinja", num_train=2
    )
    with pytest.raises(UnusableInput, match=r"--chat-template .*none.jinja: cannot read it"):
        check_inputs(missing)
    without = DemoConfig(out=cfg.out, data=cfg.data, num_train=2)
    with pytest.raises(UnusableInput, match=r'"messages" records need --chat-template FILE'):
        check_inputs(without)
