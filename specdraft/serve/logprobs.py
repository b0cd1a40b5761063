"""Log-probabilities in the response shapes vLLM's OpenAI server returns (`LogprobsWriter`), from
the target's scores of the emitted tokens (`TokenScore`, kept by `serve.scoring`).

- Completions (vllm entrypoints/openai/completion/serving.py, OpenAI's legacy completions):
  `{"tokens", "token_logprobs", "top_logprobs", "text_offset"}`, one entry per token;
  `top_logprobs[i]` maps each of the `logprobs` most likely tokens' text, and the emitted one's,
  to its log-probability (so up to logprobs + 1 entries); `text_offset` counts characters of
  the choice's text (echoed prompt included) before the token. An echoed prompt's first token
  has no score (null), as vLLM's prompt_logprobs.
- Chat (vllm entrypoints/openai/chat_completion/serving.py, OpenAI's chat logprobs):
  `{"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}]}`
  with the `top_logprobs` most likely tokens, most likely first.
A token's text is what it adds after the tokens before it (`requests.decode_continuation`, as
vLLM's incremental detokenizer gives it; decoded alone, a SentencePiece token loses its
word-start space), so a choice's token texts join into its text and text_offset indexes it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from specdraft.engine.requests import decode_continuation


@dataclass(frozen=True)
class TokenScore:
    """The target's raw log-probability (log-softmax of its logits, before penalties and
    temperature: vLLM's default `raw_logprobs`) of one token, natural log; logprob None for a
    prompt's first token (nothing precedes it). top: the most likely (id, logprob), best first."""

    token: int
    logprob: float | None
    top: tuple[tuple[int, float], ...] = ()


@dataclass
class LogprobsWriter:
    """One choice's logprobs, chunk by chunk: `render(scores)` gives the shape of its endpoint
    for the scores of the tokens a chunk (or the whole body) carries. num_top: the alternatives
    asked (completions' `logprobs`, chat's `top_logprobs`). context: the ids before the first
    scored token (the prompt's, unless the prompt is echoed and scored itself)."""

    tokenizer: Any
    chat: bool
    num_top: int
    context: list[int] = field(default_factory=list)
    offset: int = 0  # characters of the completion's text before the next token

    def text(self, token: int) -> str:
        """The text `token` adds after the context (the tokens scored so far included)."""
        return decode_continuation(self.tokenizer, self.context, [token])

    def render(self, scores: Sequence[TokenScore]) -> dict[str, Any]:
        """The endpoint's logprobs object for these tokens (completions' text_offset goes on)."""
        return self.chat_shape(scores) if self.chat else self.completion_shape(scores)

    def completion_shape(self, scores: Sequence[TokenScore]) -> dict[str, Any]:
        """`{"tokens", "token_logprobs", "top_logprobs", "text_offset"}`."""
        out: dict[str, list] = {"tokens": [], "token_logprobs": [], "top_logprobs": []}
        out["text_offset"] = []
        for s in scores:
            text = self.text(s.token)
            out["tokens"].append(text)
            out["token_logprobs"].append(s.logprob)
            top = None
            if s.logprob is not None:
                top = {self.text(t): lp for t, lp in s.top[: self.num_top]}
                top[text] = s.logprob
            out["top_logprobs"].append(top)
            out["text_offset"].append(self.offset)
            self.offset += len(text)
            self.context.append(s.token)
        return out

    def chat_shape(self, scores: Sequence[TokenScore]) -> dict[str, Any]:
        """`{"content": [...]}`, each token with its top_logprobs list."""
        content = []
        for s in scores:
            top = [self.entry(t, lp) for t, lp in s.top[: self.num_top]]
            content.append({**self.entry(s.token, s.logprob), "top_logprobs": top})
            self.context.append(s.token)
        return {"content": content}

    def entry(self, token: int, logprob: float | None) -> dict[str, Any]:
        """`{"token", "logprob", "bytes"}` (bytes: the text's UTF-8)."""
        text = self.text(token)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}
