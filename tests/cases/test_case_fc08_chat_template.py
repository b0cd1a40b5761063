"""FC-08: the chat template rendered differently in training and serving (thinking switch).

The render info that goes to the manifest stores the template hash and kwargs; the render-parity
check tokenizes sample chats both ways and fails on any difference.
"""

from __future__ import annotations

import json

from specdraft.data.render import RenderInfo, load_dataset, render_parity, template_hash
from tests.support.tiny_tokenizer import CHAT, tiny_chat_tokenizer


def test_case_fc08_render_info_stores_hash_and_kwargs(tmp_path):
    tok = tiny_chat_tokenizer()
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"messages": CHAT}) + "\n")
    on = load_dataset(path, tok, template_kwargs={"enable_thinking": True})
    off = load_dataset(path, tok, template_kwargs={"enable_thinking": False})
    assert on.render_info.kwargs == {"enable_thinking": True}
    assert on.render_info.template_hash == template_hash(tok) is not None
    assert RenderInfo.from_dict(json.loads(json.dumps(on.render_info.to_dict()))) == on.render_info
    think = tok.convert_tokens_to_ids("<think>")
    assert think in on.samples[0].input_ids and think not in off.samples[0].input_ids


def test_case_fc08_render_parity_fails_on_thinking_switch():
    tok = tiny_chat_tokenizer()
    diffs = render_parity(tok, [CHAT, CHAT[:3]], {"enable_thinking": True}, {})
    assert len(diffs) == 4  # both chats, full render and serving prompt
    assert diffs[0].startswith("chat 0 (full chat):") and "<think>" in diffs[0]
    assert any(d.startswith("chat 1 (prompt):") for d in diffs)


def test_case_fc08_render_parity_passes_when_equal():
    tok = tiny_chat_tokenizer()
    assert render_parity(tok, [CHAT], {"enable_thinking": False}, {}) == []
    assert render_parity(tok, [CHAT], {"enable_thinking": True}, {"enable_thinking": True}) == []
