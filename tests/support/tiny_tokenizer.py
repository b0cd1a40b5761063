"""A tiny chat tokenizer built in code, shared by the data, capture, regenerate and doctor tests.

WordLevel over a small vocabulary, with a jinja chat template that has an `enable_thinking`
switch (case FC-08).
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

SPECIAL = [
    "<unk>",
    "<s>",
    "</s>",
    "<pad>",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|end|>",
    "<think>",
    "</think>",
]
WORDS = (
    "hello hi how are you i am fine thanks what is the capital of france paris a an and or "
    "it this that one two three four five six seven eight nine ten cat dog sat on mat be "
    "helpful good bad yes no please tell me story once upon time there was little girl boy "
    "who liked to play in park sun sky blue red big small"
).split()
PUNCT = list(".,!?:;'")
TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "{% if m['role'] == 'assistant' %}<|assistant|> {% if enable_thinking %}<think> {% endif %}"
    "{{ m['content'] }} <|end|> "
    "{% else %}<|{{ m['role'] }}|> {{ m['content'] }} <|end|> {% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|> {% if enable_thinking %}<think> {% endif %}"
    "{% endif %}"
)


def turns(*contents: str) -> list[dict[str, str]]:
    """Chat messages (OpenAI form) with these contents, user and assistant in turn, user first."""
    return [{"role": ("user", "assistant")[i % 2], "content": c} for i, c in enumerate(contents)]


CHAT = [
    {"role": "system", "content": "be helpful ."},
    {"role": "user", "content": "hello , how are you ?"},
    {"role": "assistant", "content": "i am fine , thanks ."},
    {"role": "user", "content": "what is the capital of france ?"},
    {"role": "assistant", "content": "paris ."},
]


def tiny_chat_tokenizer(template: str = TEMPLATE) -> PreTrainedTokenizerFast:
    """A 85-token word-level tokenizer: ids 0..9 special (<s> = 1 BOS, </s> = 2 EOS, <pad> = 3)."""
    vocab = {t: i for i, t in enumerate(SPECIAL + sorted(set(WORDS)) + PUNCT)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.decoder = decoders.WordPiece(prefix="##")
    backend.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", 1)]
    )
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
        additional_special_tokens=SPECIAL[4:],
    )
    tok.chat_template = template
    return tok


def save_tiny_tokenizer(path: str | Path) -> Path:
    tiny_chat_tokenizer().save_pretrained(path)
    return Path(path)


TEMPLATES = (
    Path(__file__).parents[1] / "unit" / "data" / "templates"
)  # real chat templates, see SOURCES.md


def byte_tokenizer(
    template: str,
    special: list[str],
    *,
    bos: str | None = None,
    eos: str | None = None,
    added: tuple[str, ...] = ("<think>", "</think>"),
) -> PreTrainedTokenizerFast:
    """A byte-level tokenizer (no merges: one token per byte) that tokenizes any text, with
    `special` as special tokens and `added` as plain added tokens (Qwen3 keeps <think> non-special),
    and `template` as its chat template: real templates render through it exactly."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {c: i for i, c in enumerate(sorted(alphabet))}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token=bos, eos_token=eos, additional_special_tokens=special
    )
    tok.add_tokens(list(added))
    tok.chat_template = template
    return tok


def template_tokenizer(name: str) -> PreTrainedTokenizerFast:
    """`byte_tokenizer` with the real chat template `name` (qwen3, deepseek_v3_1, deepseek_r1,
    kimi_k2_thinking, gpt_oss) and that model's special tokens."""
    template = (TEMPLATES / f"{name}.jinja").read_text(encoding="utf-8")
    tool = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
    deepseek = [
        "<｜begin▁of▁sentence｜>",
        "<｜end▁of▁sentence｜>",
        "<｜User｜>",
        "<｜Assistant｜>",
        "<｜tool▁calls▁begin｜>",
        "<｜tool▁calls▁end｜>",
        "<｜tool▁call▁begin｜>",
        "<｜tool▁call▁end｜>",
        "<｜tool▁sep｜>",
        "<｜tool▁output▁begin｜>",
        "<｜tool▁output▁end｜>",
        "<｜tool▁outputs▁begin｜>",
        "<｜tool▁outputs▁end｜>",
    ]
    kimi = [
        "<|im_user|>",
        "<|im_assistant|>",
        "<|im_system|>",
        "<|im_middle|>",
        "<|im_end|>",
        "<|tool_calls_section_begin|>",
        "<|tool_calls_section_end|>",
        "<|tool_call_begin|>",
        "<|tool_call_argument_begin|>",
        "<|tool_call_end|>",
    ]
    harmony = ["<|start|>", "<|message|>", "<|channel|>", "<|end|>", "<|return|>", "<|call|>"]
    kinds = {
        "qwen3": (["<|im_start|>", "<|im_end|>", "<|endoftext|>"], None, "<|im_end|>", tool),
        "deepseek_v3_1": (deepseek, deepseek[0], deepseek[1], ["<think>", "</think>"]),
        "deepseek_r1": (deepseek, deepseek[0], deepseek[1], ["<think>", "</think>"]),
        "kimi_k2_thinking": (kimi, None, "<|im_end|>", ["<think>", "</think>"]),
        "gpt_oss": (harmony, None, "<|return|>", []),
    }
    special, bos, eos, added = kinds[name]
    added = tuple(added) + (("<think>", "</think>") if name == "qwen3" else ())
    return byte_tokenizer(template, special, bos=bos, eos=eos, added=added)
