"""A tiny chat tokenizer built in code, shared by the data, capture, regenerate and doctor tests.

WordLevel over a small vocabulary, with a jinja chat template that has an `enable_thinking`
switch (case FC-08).
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

SPECIAL = ["<unk>", "<s>", "</s>", "<pad>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>",
           "<think>", "</think>"]
WORDS = ("hello hi how are you i am fine thanks what is the capital of france paris a an and or "
         "it this that one two three four five six seven eight nine ten cat dog sat on mat be "
         "helpful good bad yes no please tell me story once upon time there was little girl boy "
         "who liked to play in park sun sky blue red big small").split()
PUNCT = list(".,!?:;'")
TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "{% if m['role'] == 'assistant' %}<|assistant|> {% if enable_thinking %}<think> {% endif %}"
    "{{ m['content'] }} <|end|> "
    "{% else %}<|{{ m['role'] }}|> {{ m['content'] }} <|end|> {% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|> {% if enable_thinking %}<think> {% endif %}"
    "{% endif %}")

CHAT = [{"role": "system", "content": "be helpful ."},
        {"role": "user", "content": "hello , how are you ?"},
        {"role": "assistant", "content": "i am fine , thanks ."},
        {"role": "user", "content": "what is the capital of france ?"},
        {"role": "assistant", "content": "paris ."}]


def tiny_chat_tokenizer(template: str = TEMPLATE) -> PreTrainedTokenizerFast:
    """A 85-token word-level tokenizer: ids 0..9 special (<s> = 1 BOS, </s> = 2 EOS, <pad> = 3)."""
    vocab = {t: i for i, t in enumerate(SPECIAL + sorted(set(WORDS)) + PUNCT)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.decoder = decoders.WordPiece(prefix="##")
    backend.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>",
                                  pad_token="<pad>", unk_token="<unk>",
                                  additional_special_tokens=SPECIAL[4:])
    tok.chat_template = template
    return tok


def save_tiny_tokenizer(path: str | Path) -> Path:
    tiny_chat_tokenizer().save_pretrained(path)
    return Path(path)
