"""specdraft.data.template: a --chat-template file read as vLLM and SGLang read it, set on the
tokenizer, fingerprinted as the tokenizer's own template is."""

from __future__ import annotations

import pytest

from specdraft.data.records import DataError
from specdraft.data.render import render_chat, template_hash
from specdraft.data.template import read_chat_template, template_fingerprint, use_chat_template
from tests.support.tiny_tokenizer import CHAT, TEMPLATE, tiny_chat_tokenizer


def test_a_template_file_renders_as_the_tokenizer_s_own_and_has_its_hash(tmp_path):
    file = tmp_path / "chat.jinja"
    file.write_text(TEMPLATE)
    own = tiny_chat_tokenizer()
    base = tiny_chat_tokenizer()
    base.chat_template = None
    with_file = use_chat_template(base, file)
    assert with_file is base and template_hash(with_file) == template_hash(own)
    assert template_hash(own) == template_fingerprint(TEMPLATE)
    assert render_chat(with_file, CHAT) == render_chat(own, CHAT)


def test_vllm_reads_the_file_as_written_sglang_strips_newlines_and_unescapes(tmp_path):
    file = tmp_path / "chat.jinja"
    file.write_text("\n{{ 'a\\nb' }}{% for m in messages %}{{ m['content'] }}{% endfor %}\n\n")
    assert read_chat_template(file) == file.read_text()
    assert read_chat_template(file, "sglang") == (
        "{{ 'a\nb' }}{% for m in messages %}{{ m['content'] }}{% endfor %}"
    )


def test_no_file_keeps_the_tokenizer_s_template():
    tok = tiny_chat_tokenizer()
    assert use_chat_template(tok, None).chat_template == TEMPLATE
    assert use_chat_template(tok, "").chat_template == TEMPLATE


@pytest.mark.parametrize(
    "name, content, words",
    [
        ("missing.jinja", None, "cannot read it (No such file or directory)"),
        ("empty.jinja", "\n", "the file is empty"),
        ("conv.json", '{"name": "x"}', "a JSON file (SGLang's conversation format)"),
    ],
)
def test_an_unusable_template_file_is_a_data_error_naming_it(tmp_path, name, content, words):
    file = tmp_path / name
    if content is not None:
        file.write_text(content)
    with pytest.raises(DataError) as info:
        read_chat_template(file)
    assert str(info.value).startswith(f"--chat-template {file}: {words}")


def test_a_template_with_no_chat_is_refused(tmp_path):
    file = tmp_path / "chat.jinja"
    file.write_text(TEMPLATE)
    with pytest.raises(DataError, match="with --no-chat: plain text is rendered without"):
        use_chat_template(tiny_chat_tokenizer(), file, chat=False)
