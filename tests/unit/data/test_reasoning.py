"""Reasoning and tool calls rendered through real chat templates (tests/unit/data/templates):
render parity with `apply_chat_template`, loss masks over exactly what the assistant emits,
`--reasoning drop` through the template's own switch, and records the template cannot render."""

from __future__ import annotations

import json

import pytest

from specdraft.data.records import BadRecord, DataError
from specdraft.data.render import load_dataset, render_chat
from tests.support.tiny_tokenizer import template_tokenizer

Q = {"role": "user", "content": "What is 2+2?"}
A = {"role": "assistant", "content": "4", "reasoning_content": "Add two and two."}
Q2 = {"role": "user", "content": "And 3+3?"}
A2 = {"role": "assistant", "content": "6", "reasoning_content": "Three and three."}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "weather",
            "description": "Weather of a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
CALL = {
    "role": "assistant",
    "content": "",
    "tool_calls": [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "weather", "arguments": '{"city": "Paris"}'},
        }
    ],
}
RESULT = {"role": "tool", "tool_call_id": "call_1", "name": "weather", "content": "sunny, 21C"}
FINAL = {"role": "assistant", "content": "It is sunny."}


def masked_text(tok, sample) -> str:
    return tok.decode([t for t, m in zip(sample.input_ids, sample.loss_mask) if m])


def parity(tok, sample, messages, **kwargs) -> bool:
    return (
        sample.input_ids == tok.apply_chat_template(messages, tokenize=True, **kwargs)["input_ids"]
    )


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_qwen3_trains_reasoning_and_answer_as_rendered():
    tok = template_tokenizer("qwen3")
    (s,) = render_chat(tok, [Q, A])
    assert parity(tok, s, [Q, A])
    assert masked_text(tok, s) == "<think>\nAdd two and two.\n</think>\n\n4<|im_end|>\n"
    # vLLM's `reasoning` field and a think block inside content give the same sample.
    vllm = {"role": "assistant", "content": "4", "reasoning": "Add two and two."}
    inline = {"role": "assistant", "content": "<think>\nAdd two and two.\n</think>\n\n4"}
    assert render_chat(tok, [Q, vllm]) == render_chat(tok, [Q, inline]) == [s]


def test_qwen3_multi_turn_drops_earlier_reasoning_as_the_template_does():
    tok = template_tokenizer("qwen3")
    first, second = render_chat(tok, [Q, A, Q2, A2])
    assert parity(tok, first, [Q, A]) and parity(tok, second, [Q, A, Q2, A2])
    assert "Add two" not in tok.decode(second.input_ids)  # the template drops turn 1's reasoning
    assert masked_text(tok, first) == "<think>\nAdd two and two.\n</think>\n\n4<|im_end|>\n"
    assert masked_text(tok, second) == "<think>\nThree and three.\n</think>\n\n6<|im_end|>\n"


def test_qwen3_drop_renders_with_enable_thinking_false(tmp_path):
    tok = template_tokenizer("qwen3")
    path = write_jsonl(tmp_path / "r.jsonl", [{"messages": [Q, A]}])
    data = load_dataset(path, tok, reasoning="drop")
    assert data.render_info.kwargs == {"enable_thinking": False}
    assert data.render_info.reasoning == "drop"
    (s,) = data.samples
    plain = [Q, {"role": "assistant", "content": "4"}]
    assert parity(tok, s, plain, enable_thinking=False)
    assert masked_text(tok, s) == "4<|im_end|>\n" and "Add two" not in tok.decode(s.input_ids)
    with pytest.raises(DataError, match="enable_thinking=True; drop one"):
        load_dataset(path, tok, reasoning="drop", template_kwargs={"enable_thinking": True})


def test_reasoning_the_template_cannot_render_names_the_record_and_drop(tmp_path):
    # V3.1 renders with thinking off by default.
    tok = template_tokenizer("deepseek_v3_1")
    path = write_jsonl(tmp_path / "r.jsonl", [{"messages": [Q, Q2, A]}])
    with pytest.raises(
        BadRecord,
        match=rf"^{path}:1: .*reasoning of message 2.*--reasoning drop to train on the answers",
    ):
        load_dataset(path, tok)
    with pytest.raises(BadRecord, match=r"""--template-kwargs '\{"thinking": true\}'"""):
        load_dataset(path, tok)


def served(tok, prompt_messages, continuation, **kwargs) -> tuple[list[int], list[int]]:
    """(ids, mask) of a turn as a server produces it: the prompt rendered with the generation
    prompt, tokenized, then the target's continuation tokenized, the loss over it only."""
    prompt = tok.apply_chat_template(
        prompt_messages, tokenize=False, add_generation_prompt=True, **kwargs
    )
    head = tok(prompt, add_special_tokens=False)["input_ids"]
    tail = tok(continuation, add_special_tokens=False)["input_ids"]
    return head + tail, [0] * len(head) + [1] * len(tail)


def ids_mask(sample) -> tuple[list[int], list[int]]:
    return sample.input_ids, sample.loss_mask


def test_deepseek_r1_trains_the_turn_as_served():
    # R1's generation prompt opens "<think>\n"; the template strips reasoning from every turn.
    tok = template_tokenizer("deepseek_r1")
    (s,) = render_chat(tok, [Q, A])
    assert tok.apply_chat_template([Q], tokenize=False, add_generation_prompt=True).endswith(
        "<think>\n"
    )
    assert ids_mask(s) == served(tok, [Q], "Add two and two.</think>4<｜end▁of▁sentence｜>")
    # A think block inside content, as the server without a reasoning parser returns it.
    inline = {"role": "assistant", "content": "Add two and two.\n</think>\n\n4"}
    (s_inline,) = render_chat(tok, [Q, inline])
    assert ids_mask(s_inline) == served(
        tok, [Q], "Add two and two.\n</think>\n\n4<｜end▁of▁sentence｜>"
    )
    # Multi-turn: each turn as served, earlier turns as the template renders them (no reasoning).
    first, second = render_chat(tok, [Q, A, Q2, A2])
    assert first == s
    assert ids_mask(second) == served(
        tok, [Q, A, Q2], "Three and three.</think>6<｜end▁of▁sentence｜>"
    )
    assert "Add two" not in tok.decode(second.input_ids)


def test_deepseek_r1_turn_without_reasoning_is_refused():
    with pytest.raises(DataError, match="message 1 has no reasoning.*opens a think block"):
        render_chat(template_tokenizer("deepseek_r1"), [Q, {"role": "assistant", "content": "4"}])


def test_deepseek_r1_drop_is_refused_naming_why(tmp_path):
    tok = template_tokenizer("deepseek_r1")
    with pytest.raises(DataError, match="no non-thinking switch.*use --reasoning keep"):
        render_chat(tok, [Q, A], reasoning="drop")
    path = write_jsonl(tmp_path / "r.jsonl", [{"messages": [Q, A]}])
    with pytest.raises(DataError, match="^--reasoning drop: .*DeepSeek-R1"):
        load_dataset(path, tok, reasoning="drop", skip_bad=True)


def test_deepseek_v31_thinking_trains_the_turn_as_served():
    # thinking=True opens "<think>" in the generation prompt; the template writes "</think>A".
    tok = template_tokenizer("deepseek_v3_1")
    (s,) = render_chat(tok, [Q, A], {"thinking": True})
    assert ids_mask(s) == served(
        tok, [Q], "Add two and two.</think>4<｜end▁of▁sentence｜>", thinking=True
    )


def test_deepseek_v31_drop_renders_the_non_thinking_turn():
    tok = template_tokenizer("deepseek_v3_1")
    (s,) = render_chat(tok, [Q, A], {"thinking": False}, reasoning="drop")
    assert parity(tok, s, [Q, {"role": "assistant", "content": "4"}], thinking=False)
    assert masked_text(tok, s) == "4<｜end▁of▁sentence｜>"


def test_gpt_oss_trains_the_analysis_and_final_channels():
    tok = template_tokenizer("gpt_oss")
    a = {"role": "assistant", "content": "4", "thinking": "Add two and two."}
    (s,) = render_chat(tok, [Q, a])
    assert parity(tok, s, [Q, a])
    assert masked_text(tok, s) == (
        "<|channel|>analysis<|message|>Add two and two.<|end|>"
        "<|start|>assistant<|channel|>final<|message|>4<|return|>"
    )
    # SGLang's reasoning_content is handed to the template as `thinking`, the field it reads.
    assert render_chat(tok, [Q, A]) == [s]
    first, second = render_chat(tok, [Q, A, Q2, A2])  # earlier turns' analysis is dropped
    assert "Add two" not in tok.decode(second.input_ids) and "Add two" in masked_text(tok, first)


def test_kimi_k2_thinking_trains_reasoning_of_the_pending_tool_call():
    tok = template_tokenizer("kimi_k2_thinking")
    call = {**CALL, "reasoning_content": "Look it up."}
    (s,) = render_chat(tok, [Q, call, RESULT], tools=TOOLS)
    assert parity(tok, s, [Q, call, RESULT], tools=TOOLS)
    assert masked_text(tok, s) == (
        "<think>Look it up.</think><|tool_calls_section_begin|>"
        "<|tool_call_begin|>call_1<|tool_call_argument_begin|>"
        '{"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|><|im_end|>'
    )
    assert "sunny" in tok.decode(s.input_ids)  # the tool result is context, not a label


def test_kimi_k2_thinking_trains_the_answer_turn_as_served(tmp_path):
    # The template writes the last answer turn with an empty think block; the served target
    # emits "<think>" + reasoning + "</think>" + answer after the generation prompt.
    tok = template_tokenizer("kimi_k2_thinking")
    assert "<think></think>4<|im_end|>" in tok.apply_chat_template([Q, A], tokenize=False)
    (s,) = render_chat(tok, [Q, A])
    assert ids_mask(s) == served(tok, [Q], "<think>Add two and two.</think>4<|im_end|>")
    inline = {"role": "assistant", "content": "<think>Add two and two.</think>4"}
    assert render_chat(tok, [Q, inline]) == [s]
    # Multi-turn: each turn as served, earlier turns as the template renders them (empty think).
    first, second = render_chat(tok, [Q, A, Q2, A2])
    assert first == s
    assert ids_mask(second) == served(tok, [Q, A, Q2], "<think>Three and three.</think>6<|im_end|>")
    assert "Add two" not in tok.decode(second.input_ids)
    # --reasoning drop: the template's own rendering, unchanged.
    path = write_jsonl(tmp_path / "r.jsonl", [{"messages": [Q, A]}])
    (dropped,) = load_dataset(path, tok, reasoning="drop").samples
    assert parity(tok, dropped, [Q, {"role": "assistant", "content": "4"}])
    assert masked_text(tok, dropped) == "<think></think>4<|im_end|>"


def test_kimi_k2_thinking_answer_after_tool_calls_is_served_after_their_reasoning():
    # Once the answer exists the template drops the tool-call turn's reasoning; the server's
    # prompt for the answer still holds it (the call is pending there).
    tok = template_tokenizer("kimi_k2_thinking")
    call = {**CALL, "reasoning_content": "Look it up."}
    final = {**FINAL, "reasoning_content": "Report it."}
    first, second = render_chat(tok, [Q, call, RESULT, final], tools=TOOLS)
    assert parity(tok, first, [Q, call], tools=TOOLS)
    assert masked_text(tok, first).startswith(
        "<think>Look it up.</think><|tool_calls_section_begin|>"
    )
    assert ids_mask(second) == served(
        tok, [Q, call, RESULT], "<think>Report it.</think>It is sunny.<|im_end|>", tools=TOOLS
    )
    assert "Look it up." in tok.decode(second.input_ids)


def test_tool_calls_are_trained_and_tool_results_are_not(tmp_path):
    tok = template_tokenizer("deepseek_v3_1")
    chat = [Q, CALL, RESULT, FINAL]
    (s,) = render_chat(tok, chat, tools=TOOLS)
    assert parity(tok, s, chat, tools=TOOLS)
    assert masked_text(tok, s) == (
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>weather<｜tool▁sep｜>"
        '{"city": "Paris"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>'
        "<｜end▁of▁sentence｜>It is sunny.<｜end▁of▁sentence｜>"
    )
    # Qwen3 renders the call turn with an (empty) think block while it is the last turn: one
    # sample per turn, the tool response unmasked in the second.
    qwen = template_tokenizer("qwen3")
    path = write_jsonl(tmp_path / "t.jsonl", [{"messages": chat, "tools": TOOLS}])
    first, second = load_dataset(path, qwen).samples
    assert parity(qwen, first, chat[:2], tools=TOOLS) and parity(qwen, second, chat, tools=TOOLS)
    assert masked_text(qwen, first) == (
        '<think>\n\n</think>\n\n<tool_call>\n{"name": "weather", '
        '"arguments": {"city": "Paris"}}\n</tool_call><|im_end|>\n'
    )
    assert "sunny, 21C" in qwen.decode(second.input_ids)
    assert "sunny, 21C" not in masked_text(qwen, second)
    assert masked_text(qwen, second) == "<think>\n\n</think>\n\nIt is sunny.<|im_end|>\n"


def test_bad_tool_calls_name_the_record(tmp_path):
    from specdraft.data.records import read_records

    path = write_jsonl(tmp_path / "t.jsonl", [{"messages": [Q, {**CALL, "tool_calls": "weather"}]}])
    with pytest.raises(BadRecord, match=rf"{path}:1: turn 1 \(assistant\) has a bad 'tool_calls'"):
        read_records(path)
