"""Regeneration backends: what writes the target's answers.

Backends: `LocalBackend` (transformers `generate`, batched with left padding) and
`EndpointBackend` (any OpenAI-compatible server: `/v1/chat/completions` or `/v1/completions`,
bounded concurrency, retries with exponential backoff on 5xx / 429 / timeouts / connection errors).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from specdraft.engine.requests import decode_continuation
from specdraft.errors import SpecdraftError


class RegenerationError(SpecdraftError, RuntimeError):
    """A request that failed for good, or an output file that cannot be resumed."""


class RegenerationSettingError(RegenerationError, ValueError):
    """A regenerate setting that cannot work: a sampling value out of range, an unknown api, no
    served model to name, a mode the given tokenizer cannot serve."""


@dataclass(frozen=True)
class Sampling:
    """Sampling settings, recorded in the sidecar. temperature 0 = greedy (top_p ignored).
    seed: request i uses seed + i (endpoint); a local batch starting at i is seeded seed + i."""

    temperature: float = 0.0
    top_p: float = 1.0
    max_new_tokens: int = 256
    seed: int = 0

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise RegenerationSettingError(
                f"Sampling.temperature = {self.temperature}: must be >= 0"
            )
        if not 0 < self.top_p <= 1:
            raise RegenerationSettingError(f"Sampling.top_p = {self.top_p}: must be in (0, 1]")
        if self.max_new_tokens <= 0:
            raise RegenerationSettingError(
                f"Sampling.max_new_tokens = {self.max_new_tokens}: must be positive"
            )


@dataclass(frozen=True)
class Completion:
    """One answer: `content` as the backend returned it, and `reasoning` when the server's
    reasoning parser returned it apart (`conventions.REASONING_RESPONSE_FIELDS`); a local
    target's think block stays in `content` (None here). tool_calls: the server's parsed tool
    calls (OpenAI objects), None without."""

    content: str
    reasoning: str | None = None
    tool_calls: list[dict[str, Any]] | None = None


@dataclass(frozen=True)
class Prompt:
    """One generation request: `messages` (chat, with the chat-template kwargs) and/or rendered
    `text`, and token `ids` when a tokenizer is at hand (exactly the tokens to continue).
    `index` (the record's) seeds the request. tools: the record's tool schemas (sent as `tools`)."""

    index: int
    messages: list[dict[str, str]] | None = None
    text: str | None = None
    ids: list[int] | None = None
    template_kwargs: dict[str, Any] | None = None
    tools: tuple[dict[str, Any], ...] | None = None


class Backend(Protocol):
    """What `regenerate` needs from a backend: `complete` returns one Completion per prompt, in
    order."""

    batch_size: int  # prompts handed to one `complete` call

    def complete(self, prompts: list[Prompt], sampling: Sampling) -> list[Completion]: ...

    def describe(self) -> dict[str, Any]: ...


class LocalBackend:
    """The target itself through transformers `generate` (greedy or sampled), left-padded batches.

    model_dir: transformers model directory (and tokenizer unless `tokenizer_dir` is given),
    loaded as capture loads it (`targets.load_target`: the class its config names, multimodal
    wrappers included; its errors name the directory); `generate` runs on its `causal_lm`.
    Stops at the target's end ids (`target.config.end_token_ids`: the generation config's EOS ids
    and the tokenizer's). TargetTokenizerError when no tokenizer loads
    (`targets.tokenizer.load_target_tokenizer`)."""

    def __init__(
        self,
        model_dir: str | Path,
        *,
        tokenizer_dir: str | Path | None = None,
        batch_size: int = 8,
        dtype: torch.dtype = torch.float32,
        device: str = "cpu",
    ):
        from specdraft.targets import load_target
        from specdraft.targets.config import end_token_ids
        from specdraft.targets.tokenizer import load_target_tokenizer

        self.model_dir = str(model_dir)
        self.tokenizer = load_target_tokenizer(
            tokenizer_dir or model_dir, "pass --tokenizer DIR, the target's tokenizer"
        )
        self.model = load_target(model_dir, dtype=dtype, device=device).causal_lm
        self.batch_size, self.device = batch_size, device
        self.eos_ids = end_token_ids(self.tokenizer, self.model.generation_config)
        pad = (
            self.tokenizer.pad_token_id
        )  # else an end id, else 0: left padding is masked, any id serves
        self.pad_id = pad if pad is not None else (self.eos_ids[0] if self.eos_ids else 0)

    def describe(self) -> dict[str, Any]:
        return {"kind": "local", "model": self.model_dir, "dtype": str(self.model.dtype)}

    def complete(self, prompts: list[Prompt], sampling: Sampling) -> list[Completion]:
        """Batched generation; each prompt needs `ids`. Returns the decoded continuations."""
        longest = max(len(p.ids) for p in prompts)
        ids = torch.full((len(prompts), longest), self.pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for b, p in enumerate(prompts):  # left padding: every prompt ends at the same column
            ids[b, longest - len(p.ids) :] = torch.tensor(p.ids)
            mask[b, longest - len(p.ids) :] = 1
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            torch.manual_seed(sampling.seed + prompts[0].index)
            out = self.model.generate(
                input_ids=ids.to(self.device),
                attention_mask=mask.to(self.device),
                generation_config=self._generation_config(sampling),
            )
        return [self._decode(p, row[longest:].tolist()) for p, row in zip(prompts, out.cpu())]

    def _generation_config(self, sampling: Sampling):
        from transformers import GenerationConfig

        greedy = sampling.temperature == 0
        return GenerationConfig(
            max_new_tokens=sampling.max_new_tokens,
            do_sample=not greedy,
            temperature=None if greedy else sampling.temperature,
            top_p=None if greedy else sampling.top_p,
            top_k=None,
            eos_token_id=self.eos_ids or None,
            pad_token_id=self.pad_id,
        )

    def _decode(self, prompt: Prompt, new_ids: list[int]) -> Completion:
        """The answer up to its first EOS, decoded as the continuation of its prompt (chat or
        text), as the endpoint path and `serve` do: decoded alone, a SentencePiece answer would
        lose its word-start space and re-tokenise to other ids than the target generated."""
        stop = next((i for i, t in enumerate(new_ids) if t in self.eos_ids), len(new_ids))
        return Completion(
            decode_continuation(
                self.tokenizer, prompt.ids, new_ids[:stop], skip_special_tokens=True
            )
        )


RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})


class EndpointBackend:
    """Any OpenAI-compatible server (vLLM, SGLang, specdraft serve).

    api="chat": POST {base_url}/v1/chat/completions with the messages (template kwargs sent as
    `chat_template_kwargs`); api="completions": POST /v1/completions with the prompt token ids
    when known (exact tokens), else the text. At most `concurrency` requests in flight; a request
    is retried up to `max_retries` times (backoff_s · 2^attempt) on 408/429/5xx, timeouts and
    connection errors; other statuses fail at once. Raises RegenerationError naming the URL.
    batch_size: prompts per `complete` call (default 4 · concurrency); a failed call loses them."""

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api: str = "chat",
        concurrency: int = 8,
        timeout_s: float = 120.0,
        max_retries: int = 5,
        backoff_s: float = 1.0,
        api_key: str | None = None,
        batch_size: int | None = None,
    ):
        import httpx

        from specdraft.client import base_url as api_root

        if api not in ("chat", "completions"):
            raise RegenerationSettingError(f"api {api!r}: use 'chat' or 'completions'")
        root = api_root(base_url)
        self.url = f"{root}/v1/chat/completions" if api == "chat" else f"{root}/v1/completions"
        self.model, self.api, self.concurrency = model, api, concurrency
        self.batch_size = batch_size or 4 * concurrency
        self.max_retries, self.backoff_s = max_retries, backoff_s
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.Client(timeout=timeout_s, headers=headers)

    def describe(self) -> dict[str, Any]:
        return {"kind": "endpoint", "url": self.url, "model": self.model, "api": self.api}

    def complete(self, prompts: list[Prompt], sampling: Sampling) -> list[Completion]:
        with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
            return list(pool.map(lambda p: self._complete_one(p, sampling), prompts))

    def _body(self, prompt: Prompt, sampling: Sampling) -> dict[str, Any]:
        body = {
            "model": self.model,
            "max_tokens": sampling.max_new_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "seed": sampling.seed + prompt.index,
        }
        if self.api == "chat":
            if prompt.messages is None:
                raise RegenerationError(
                    "the no-chat mode needs api='completions' (--api completions)"
                )
            body["messages"] = prompt.messages
            if prompt.template_kwargs:
                body["chat_template_kwargs"] = prompt.template_kwargs
            if prompt.tools:
                body["tools"] = list(prompt.tools)
        else:
            body["prompt"] = prompt.ids if prompt.ids is not None else prompt.text
        return body

    def _complete_one(self, prompt: Prompt, sampling: Sampling) -> Completion:
        import httpx

        body = self._body(prompt, sampling)
        for attempt in range(self.max_retries + 1):
            last = attempt == self.max_retries
            try:
                response = self.client.post(self.url, json=body)
            except (httpx.TimeoutException, httpx.TransportError) as e:
                if last:
                    raise RegenerationError(
                        f"{self.url}: {type(e).__name__} after "
                        f"{attempt + 1} attempts (record {prompt.index})"
                    ) from e
            else:
                if response.status_code == 200:
                    return self._parse(response, prompt)
                if last or response.status_code not in RETRY_STATUS:
                    raise RegenerationError(
                        f"{self.url}: HTTP {response.status_code} after {attempt + 1} attempts "
                        f"(record {prompt.index}): {response.text[:200]}"
                    )
            time.sleep(self.backoff_s * 2**attempt)
        raise AssertionError("unreachable")

    def _parse(self, response, prompt: Prompt) -> Completion:
        """The choice's content and, from a chat completion, its reasoning under any of
        `conventions.REASONING_RESPONSE_FIELDS` (vLLM's `reasoning`, SGLang's `reasoning_content`)."""
        from specdraft.conventions.engines import REASONING_RESPONSE_FIELDS

        try:
            choice = response.json()["choices"][0]
            message = choice["message"] if self.api == "chat" else {"content": choice["text"]}
            reasoning = next(
                (message[k] for k in REASONING_RESPONSE_FIELDS if message.get(k)), None
            )
            return Completion(
                message["content"] or "", reasoning, message.get("tool_calls") or None
            )
        except (ValueError, KeyError, IndexError, TypeError) as e:
            raise RegenerationError(
                f"{self.url}: unexpected response for record {prompt.index}: {response.text[:200]}"
            ) from e


def served_model(base_url: str, api_key: str | None = None, timeout_s: float = 10.0) -> str:
    """The one model an OpenAI-compatible server at `base_url` serves (GET /v1/models). Raises
    RegenerationSettingError (a ValueError) naming --model when the server lists none or several,
    or cannot be asked."""
    import httpx

    from specdraft.client import base_url as api_root

    url = f"{api_root(base_url)}/v1/models"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        response = httpx.get(url, headers=headers, timeout=timeout_s)
        response.raise_for_status()
        ids = [m["id"] for m in response.json()["data"]]
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as e:
        raise RegenerationSettingError(
            f"--endpoint needs --model, the served model's name (asking {url} for it "
            f"failed: {type(e).__name__})"
        ) from None
    if len(ids) != 1:
        listed = f"it serves {', '.join(map(str, ids))}" if ids else "it lists none"
        raise RegenerationSettingError(
            f"--endpoint needs --model, the served model's name ({url}: {listed})"
        )
    return str(ids[0])
