"""regenerate keeps the reasoning the target produced (vLLM's `reasoning`, SGLang's
`reasoning_content`, a local target's think block), and --reasoning drop asks for the
template's non-thinking rendering."""

from __future__ import annotations

import json

import pytest

from specdraft.data.render import load_dataset
from specdraft.regenerate.backends import Completion, Sampling
from specdraft.regenerate.run import regenerate
from tests.support.regenerate import (
    FakeServer,
    backend,
    chat_records,
    last_user_turn,
    read_out,
    served,
)
from tests.support.tiny_tokenizer import template_tokenizer, turns

TWO_TURNS = [turns("one", "old", "two")]


class ReasoningServer(FakeServer):
    """Answers "re <word>" with reasoning "think <word>": under vLLM 0.32's `reasoning` for
    "one", SGLang 0.5.23's `reasoning_content` otherwise."""

    def answer(self, path, body):
        status, reply = super().answer(path, body)
        word = last_user_turn(body)
        key = "reasoning" if word == "one" else "reasoning_content"
        if status == 200:
            reply["choices"][0]["message"][key] = f"think {word}"
        return status, reply


@pytest.fixture
def rserver():
    yield from served(ReasoningServer())


def test_endpoint_keeps_the_reasoning_of_both_servers(rserver, tmp_path):
    out = tmp_path / "out.jsonl"
    regenerate(chat_records(tmp_path, TWO_TURNS), out, backend(rserver), Sampling())
    (row,) = read_out(out)
    assert row["messages"][1] == {
        "role": "assistant",
        "content": "re one",
        "reasoning_content": "think one",
    }
    assert row["messages"][3] == {
        "role": "assistant",
        "content": "re two",
        "reasoning_content": "think two",
    }
    second = next(b for _, b in rserver.requests if b["messages"][-1]["content"] == "two")
    assert (
        second["messages"][1]["reasoning_content"] == "think one"
    )  # the server's template decides
    tok = template_tokenizer("qwen3")
    masked = [
        tok.decode([t for t, m in zip(s.input_ids, s.loss_mask) if m])
        for s in load_dataset(out, tok).samples
    ]
    assert masked == [
        "<think>\nthink one\n</think>\n\nre one<|im_end|>\n",
        "<think>\nthink two\n</think>\n\nre two<|im_end|>\n",
    ]


def test_endpoint_drop_sends_the_template_switch_and_writes_no_reasoning(rserver, tmp_path):
    records = chat_records(tmp_path, TWO_TURNS)
    with pytest.raises(ValueError, match="--reasoning drop with --endpoint needs --tokenizer"):
        regenerate(records, tmp_path / "x.jsonl", backend(rserver), Sampling(), reasoning="drop")
    out = tmp_path / "out.jsonl"
    regenerate(
        records,
        out,
        backend(rserver),
        Sampling(),
        reasoning="drop",
        tokenizer=template_tokenizer("qwen3"),
    )
    (row,) = read_out(out)
    assert all("reasoning_content" not in m for m in row["messages"])
    assert {json.dumps(b["chat_template_kwargs"]) for _, b in rserver.requests} == {
        '{"enable_thinking": false}'
    }
    assert json.loads((tmp_path / "out.jsonl.settings.json").read_text())["reasoning"] == "drop"


class ThinkingTarget:
    """A local-backend stand-in: the Qwen3 tokenizer, answers "<think>\\nR\\n</think>\\n\\nA" raw."""

    batch_size = 4

    def __init__(self):
        self.tokenizer = template_tokenizer("qwen3")
        self.prompts = []

    def describe(self):
        return {"kind": "local", "model": "thinking"}

    def complete(self, prompts, sampling):
        self.prompts += prompts
        return [Completion(f"<think>\nwhy {p.index}\n</think>\n\nbecause") for p in prompts]


def test_local_think_block_becomes_the_reasoning_field(tmp_path):
    target, out = ThinkingTarget(), tmp_path / "out.jsonl"
    regenerate(chat_records(tmp_path, TWO_TURNS), out, target, Sampling())
    (row,) = read_out(out)
    assert row["messages"][1] == {
        "role": "assistant",
        "content": "\n\nbecause",
        "reasoning_content": "\nwhy 0\n",
    }
    # The second prompt is rendered by the template from the first turn's reasoning field
    # (Qwen3 drops it from the history): no think block leaks into the content.
    second = target.prompts[1]
    assert second.text == target.tokenizer.apply_chat_template(
        [TWO_TURNS[0][0], {"role": "assistant", "content": "\n\nbecause"}, TWO_TURNS[0][2]],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert "<think>" not in second.text


class ToolServer(FakeServer):
    """Answers the first turn with a tool call (content null), later turns with text."""

    def answer(self, path, body):
        status, reply = super().answer(path, body)
        if status == 200 and body["messages"][-1]["role"] == "user":
            reply["choices"][0]["message"] = {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "weather", "arguments": "{}"},
                    }
                ],
            }
        return status, reply


def test_endpoint_sends_the_tools_and_keeps_the_tool_calls(tmp_path):
    server = ToolServer()
    try:
        tools = [
            {"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}
        ]
        path = tmp_path / "t.jsonl"
        path.write_text(
            json.dumps({"messages": [{"role": "user", "content": "one"}], "tools": tools}) + "\n"
        )
        from specdraft.data.records import read_records

        out = tmp_path / "out.jsonl"
        regenerate(read_records(path, require_assistant=False), out, backend(server), Sampling())
    finally:
        server.httpd.shutdown()
        server.httpd.server_close()
    (row,) = read_out(out)
    assert server.requests[0][1]["tools"] == tools and row["tools"] == tools
    assert row["messages"][1]["tool_calls"][0]["function"]["name"] == "weather"
    assert row["messages"][1]["content"] == ""
