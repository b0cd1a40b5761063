"""Replace the answers of a dataset with the target's own outputs (EAGLE-3 trains best on them).

Chat mode: every assistant turn is regenerated in order, each from the conversation so far (with
the earlier turns already regenerated); a chat that ends in a user turn gets one assistant turn
appended. No-chat mode (base models): the prompt is the record's `prompt` field, or the first
`prompt_tokens` tokens of a document; the target writes the continuation.

Backends: `LocalBackend` (transformers `generate`, batched with left padding) and
`EndpointBackend` (any OpenAI-compatible server: `/v1/chat/completions` or `/v1/completions`,
bounded concurrency, retries with exponential backoff on 5xx / 429 / timeouts / connection errors).

Output: JSONL, one whole line per finished record, `{"index", "source", "messages"}` (chat) or
`{"index", "source", "prompt", "completion"}`, appended and flushed. A re-run with the same
settings resumes: finished indices are kept and skipped, a partial last line (a crash mid-write)
is discarded. The settings (backend, sampling, template kwargs, input hash) are recorded in the
sidecar `<out>.settings.json`; a re-run with other settings is refused, never mixed in.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from specdraft.data import Record, Records


class RegenerationError(RuntimeError):
    """A request that failed for good, or an output file that cannot be resumed."""


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
            raise ValueError(f"Sampling.temperature = {self.temperature}: must be >= 0")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"Sampling.top_p = {self.top_p}: must be in (0, 1]")
        if self.max_new_tokens <= 0:
            raise ValueError(f"Sampling.max_new_tokens = {self.max_new_tokens}: must be positive")


@dataclass(frozen=True)
class Prompt:
    """One generation request: `messages` (chat, with the chat-template kwargs) and/or rendered
    `text`, and token `ids` when a tokenizer is at hand (exactly the tokens to continue).
    `index` (the record's) seeds the request."""

    index: int
    messages: list[dict[str, str]] | None = None
    text: str | None = None
    ids: list[int] | None = None
    template_kwargs: dict[str, Any] | None = None


class Backend(Protocol):
    """What `regenerate` needs from a backend: `complete` returns one text per prompt, in order."""

    batch_size: int  # prompts handed to one `complete` call

    def complete(self, prompts: list[Prompt], sampling: Sampling) -> list[str]: ...

    def describe(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class RegenResult:
    """num_done: records written by this run; num_kept: finished by an earlier run; num_empty:
    outputs that came back empty (they fail `read_records` later; use skip_bad there)."""

    path: Path
    num_done: int
    num_kept: int
    num_empty: int


# ---------------------------------------------------------------------------------------------
# Backends

class LocalBackend:
    """The target itself through transformers `generate` (greedy or sampled), left-padded batches.

    model_dir: transformers model directory (and tokenizer unless `tokenizer_dir` is given).
    Stops at the generation config's EOS ids (plus the tokenizer's EOS)."""

    def __init__(self, model_dir: str | Path, *, tokenizer_dir: str | Path | None = None,
                 batch_size: int = 8, dtype: torch.dtype = torch.float32, device: str = "cpu"):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.model_dir = str(model_dir)
        self.tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir or model_dir))
        self.model = AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=dtype).to(device)
        self.model.eval()
        self.batch_size, self.device = batch_size, device
        eos = self.model.generation_config.eos_token_id
        eos = [eos] if isinstance(eos, int) else list(eos or [])
        self.eos_ids = sorted({*eos, *([self.tokenizer.eos_token_id] if
                                       self.tokenizer.eos_token_id is not None else [])})
        pad = self.tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else self.eos_ids[0]

    def describe(self) -> dict[str, Any]:
        return {"kind": "local", "model": self.model_dir, "dtype": str(self.model.dtype)}

    def complete(self, prompts: list[Prompt], sampling: Sampling) -> list[str]:
        """Batched generation; each prompt needs `ids`. Returns the decoded continuations."""
        longest = max(len(p.ids) for p in prompts)
        ids = torch.full((len(prompts), longest), self.pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for b, p in enumerate(prompts):  # left padding: every prompt ends at the same column
            ids[b, longest - len(p.ids):] = torch.tensor(p.ids)
            mask[b, longest - len(p.ids):] = 1
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            torch.manual_seed(sampling.seed + prompts[0].index)
            out = self.model.generate(
                input_ids=ids.to(self.device), attention_mask=mask.to(self.device),
                generation_config=self._generation_config(sampling))
        return [self._decode(p, row[longest:].tolist()) for p, row in zip(prompts, out.cpu())]

    def _generation_config(self, sampling: Sampling):
        from transformers import GenerationConfig

        greedy = sampling.temperature == 0
        return GenerationConfig(
            max_new_tokens=sampling.max_new_tokens, do_sample=not greedy,
            temperature=None if greedy else sampling.temperature,
            top_p=None if greedy else sampling.top_p, top_k=None,
            eos_token_id=self.eos_ids, pad_token_id=self.pad_id)

    def _decode(self, prompt: Prompt, new_ids: list[int]) -> str:
        stop = next((i for i, t in enumerate(new_ids) if t in self.eos_ids), len(new_ids))
        new_ids = new_ids[:stop]
        if prompt.messages is not None:
            return self.tokenizer.decode(new_ids, skip_special_tokens=True)
        # Text continuation: decode with the prompt so word boundaries (leading spaces) survive.
        head = self.tokenizer.decode(prompt.ids, skip_special_tokens=True)
        full = self.tokenizer.decode(prompt.ids + new_ids, skip_special_tokens=True)
        if full.startswith(head):
            return full[len(head):]
        return self.tokenizer.decode(new_ids, skip_special_tokens=True)


RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})


class EndpointBackend:
    """Any OpenAI-compatible server (vLLM, SGLang, specdraft serve).

    api="chat": POST {base_url}/v1/chat/completions with the messages (template kwargs sent as
    `chat_template_kwargs`); api="completions": POST /v1/completions with the prompt token ids
    when known (exact tokens), else the text. At most `concurrency` requests in flight; a request
    is retried up to `max_retries` times (backoff_s · 2^attempt) on 408/429/5xx, timeouts and
    connection errors; other statuses fail at once. Raises RegenerationError naming the URL.
    batch_size: prompts per `complete` call (default 4 · concurrency); a failed call loses them."""

    def __init__(self, base_url: str, model: str, *, api: str = "chat", concurrency: int = 8,
                 timeout_s: float = 120.0, max_retries: int = 5, backoff_s: float = 1.0,
                 api_key: str | None = None, batch_size: int | None = None):
        import httpx

        from specdraft.client import base_url as api_root

        if api not in ("chat", "completions"):
            raise ValueError(f"api {api!r}: use 'chat' or 'completions'")
        root = api_root(base_url)
        self.url = f"{root}/v1/chat/completions" if api == "chat" else f"{root}/v1/completions"
        self.model, self.api, self.concurrency = model, api, concurrency
        self.batch_size = batch_size or 4 * concurrency
        self.max_retries, self.backoff_s = max_retries, backoff_s
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.Client(timeout=timeout_s, headers=headers)

    def describe(self) -> dict[str, Any]:
        return {"kind": "endpoint", "url": self.url, "model": self.model, "api": self.api}

    def complete(self, prompts: list[Prompt], sampling: Sampling) -> list[str]:
        with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
            return list(pool.map(lambda p: self._complete_one(p, sampling), prompts))

    def _body(self, prompt: Prompt, sampling: Sampling) -> dict[str, Any]:
        body = {"model": self.model, "max_tokens": sampling.max_new_tokens,
                "temperature": sampling.temperature, "top_p": sampling.top_p,
                "seed": sampling.seed + prompt.index}
        if self.api == "chat":
            if prompt.messages is None:
                raise RegenerationError("the no-chat mode needs api='completions' (--api "
                                        "completions)")
            body["messages"] = prompt.messages
            if prompt.template_kwargs:
                body["chat_template_kwargs"] = prompt.template_kwargs
        else:
            body["prompt"] = prompt.ids if prompt.ids is not None else prompt.text
        return body

    def _complete_one(self, prompt: Prompt, sampling: Sampling) -> str:
        import httpx

        body = self._body(prompt, sampling)
        for attempt in range(self.max_retries + 1):
            last = attempt == self.max_retries
            try:
                response = self.client.post(self.url, json=body)
            except (httpx.TimeoutException, httpx.TransportError) as e:
                if last:
                    raise RegenerationError(f"{self.url}: {type(e).__name__} after "
                                            f"{attempt + 1} attempts (record {prompt.index})") from e
            else:
                if response.status_code == 200:
                    return self._parse(response, prompt)
                if last or response.status_code not in RETRY_STATUS:
                    raise RegenerationError(
                        f"{self.url}: HTTP {response.status_code} after {attempt + 1} attempts "
                        f"(record {prompt.index}): {response.text[:200]}")
            time.sleep(self.backoff_s * 2 ** attempt)
        raise AssertionError("unreachable")

    def _parse(self, response, prompt: Prompt) -> str:
        try:
            choice = response.json()["choices"][0]
            text = choice["message"]["content"] if self.api == "chat" else choice["text"]
        except (ValueError, KeyError, IndexError, TypeError) as e:
            raise RegenerationError(f"{self.url}: unexpected response for record {prompt.index}: "
                                    f"{response.text[:200]}") from e
        return text or ""


def served_model(base_url: str, api_key: str | None = None, timeout_s: float = 10.0) -> str:
    """The one model an OpenAI-compatible server at `base_url` serves (GET /v1/models). Raises
    ValueError naming --model when the server lists none or several, or cannot be asked."""
    import httpx

    from specdraft.client import base_url as api_root

    url = f"{api_root(base_url)}/v1/models"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        response = httpx.get(url, headers=headers, timeout=timeout_s)
        response.raise_for_status()
        ids = [m["id"] for m in response.json()["data"]]
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"--endpoint needs --model, the served model's name (asking {url} for it "
                         f"failed: {type(e).__name__})") from None
    if len(ids) != 1:
        listed = f"it serves {', '.join(map(str, ids))}" if ids else "it lists none"
        raise ValueError(f"--endpoint needs --model, the served model's name ({url}: {listed})")
    return str(ids[0])


# ---------------------------------------------------------------------------------------------
# Resumable output

def settings_path(out_path: Path) -> Path:
    """The sidecar of an output file: `<out>.settings.json` (backend, sampling, input hash)."""
    return out_path.with_name(out_path.name + ".settings.json")


def check_out_path(out_path: str | Path, data: str | Path | None = None) -> Path:
    """`out_path` as a Path; RegenerationError when it is a directory (OUT is a JSONL file) or the
    input file `data` itself (resuming would read it as an output of other settings)."""
    out_path = Path(out_path)
    if data is not None and out_path.resolve() == Path(data).resolve():
        raise RegenerationError(f"OUT is the input file DATA ({data}): give a new output path")
    if out_path.is_dir():
        raise RegenerationError(f"{out_path} is a directory; OUT must be a JSONL file path, e.g. "
                                f"{out_path / 'regenerated.jsonl'}")
    return out_path


def interrupted_regenerate(out_path: str | Path) -> str:
    """What an interrupted regenerate into `out_path` kept, for the line the CLI prints."""
    out_path = Path(out_path)
    try:
        total = json.loads(settings_path(out_path).read_text())["num_records"]
        kept = len(finished_indices(out_path))
    except (OSError, ValueError, KeyError, TypeError):
        return "no record written yet: re-run the same command to start"
    return f"{kept} of {total} records kept in {out_path}: re-run the same command to continue"


def _check_settings(out_path: Path, settings: dict) -> None:
    """Write the sidecar, or compare with the one an earlier run wrote."""
    sidecar = settings_path(out_path)
    if out_path.exists() and not sidecar.exists():
        raise RegenerationError(f"{out_path} exists without its settings file {sidecar.name}; "
                                f"use a new output path or delete it")
    if sidecar.exists() and out_path.exists():
        old = json.loads(sidecar.read_text())
        diffs = [k for k in sorted(set(old) | set(settings)) if old.get(k) != settings.get(k)]
        if diffs:
            raise RegenerationError(
                f"{out_path} was produced with other settings ({', '.join(diffs)} differ; see "
                f"{sidecar}); use a new output path or delete both files")
        return
    tmp = sidecar.with_name(sidecar.name + ".tmp")
    tmp.write_text(json.dumps(settings, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, sidecar)


def finished_indices(out_path: Path) -> set[int]:
    """Indices already in `out_path`; a partial last line (no newline) is cut off the file.
    Raises RegenerationError naming the line for a complete line that is not a record."""
    if not out_path.exists():
        return set()
    data = out_path.read_bytes()
    if data and not data.endswith(b"\n"):
        with open(out_path, "r+b") as f:
            f.truncate(data.rfind(b"\n") + 1)
        data = data[: data.rfind(b"\n") + 1]
    done = set()
    for line_no, line in enumerate(data.decode("utf-8").splitlines(), start=1):
        try:
            done.add(int(json.loads(line)["index"]))
        except (ValueError, KeyError, TypeError) as e:
            raise RegenerationError(f"{out_path}:{line_no}: not a regenerated record ({e}); "
                                    f"delete the line or the file") from e
    return done


def _records_hash(records: Records) -> str:
    h = hashlib.sha256()
    for r in records.records:
        h.update(json.dumps([r.messages, r.prompt, r.text]).encode("utf-8") + b"\n")
    return h.hexdigest()


# ---------------------------------------------------------------------------------------------
# Driver

def _render_ids(tokenizer, messages, template_kwargs: dict) -> tuple[str, list[int]]:
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                         **template_kwargs)
    return text, list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _chat_prompt(index, messages, tokenizer, template_kwargs) -> Prompt:
    if tokenizer is None:
        return Prompt(index, messages=list(messages), template_kwargs=template_kwargs)
    text, ids = _render_ids(tokenizer, list(messages), template_kwargs)
    return Prompt(index, list(messages), text, ids, template_kwargs)


def _regenerate_chats(chunk: list[tuple[int, Record]], backend, sampling, tokenizer,
                      template_kwargs) -> list[dict]:
    chats = {i: [dict(m) for m in r.messages] for i, r in chunk}
    turns = {i: [j for j, m in enumerate(c) if m["role"] == "assistant"] for i, c in chats.items()}
    for i, c in chats.items():
        if c[-1]["role"] != "assistant":
            turns[i].append(len(c))  # a prompt-only chat gets one assistant turn appended
    for k in range(max(len(t) for t in turns.values())):
        active = [i for i in chats if len(turns[i]) > k]
        prompts = [_chat_prompt(i, chats[i][: turns[i][k]], tokenizer, template_kwargs)
                   for i in active]
        for i, text in zip(active, backend.complete(prompts, sampling)):
            turn = {"role": "assistant", "content": text}
            if turns[i][k] == len(chats[i]):
                chats[i].append(turn)
            else:
                chats[i][turns[i][k]] = turn
    return [{"index": i, "source": r.source, "messages": chats[i]} for i, r in chunk]


def _text_prompt(index: int, record: Record, tokenizer, prompt_tokens: int) -> Prompt:
    if record.prompt:
        ids = list(tokenizer(record.prompt)["input_ids"])
        return Prompt(index, text=record.prompt, ids=ids)
    ids = list(tokenizer(record.text)["input_ids"])[:prompt_tokens]
    return Prompt(index, text=tokenizer.decode(ids, skip_special_tokens=True), ids=ids)


def _regenerate_texts(chunk, backend, sampling, tokenizer, prompt_tokens) -> list[dict]:
    prompts = [_text_prompt(i, r, tokenizer, prompt_tokens) for i, r in chunk]
    outs = backend.complete(prompts, sampling)
    return [{"index": i, "source": r.source, "prompt": p.text, "completion": o}
            for (i, r), p, o in zip(chunk, prompts, outs)]


def regenerate(records: Records, out_path: str | Path, backend: Backend, sampling: Sampling, *,
               tokenizer=None, template_kwargs: dict | None = None, prompt_tokens: int = 32,
               console=None) -> RegenResult:
    """Regenerate every record of `records` into JSONL `out_path` (resumable; see module doc).

    records: `read_records(..., require_assistant=False)`; chat records regenerate assistant
    turns, text records continuations (needs `tokenizer`; prompt = `prompt` field or the first
    `prompt_tokens` tokens). tokenizer: the target's (local: the backend's own); with it, chat
    prompts are also rendered to exact token ids (used by api='completions').
    console: rich Console for a progress bar (None = silent).
    Raises RegenerationError (failed request after retries, output of other settings).
    """
    from specdraft.data import check_chat_template

    out_path = check_out_path(out_path)
    tokenizer = tokenizer if tokenizer is not None else getattr(backend, "tokenizer", None)
    kwargs = dict(template_kwargs or {})
    if not records.chat and tokenizer is None:
        raise ValueError("the no-chat mode needs the target's tokenizer to cut prompts")
    if tokenizer is not None:
        check_chat_template(tokenizer, records)
    created = not out_path.exists()
    _check_settings(out_path, {
        "input": str(records.path.resolve()), "input_hash": _records_hash(records),
        "num_records": len(records.records), "chat": records.chat, "backend": backend.describe(),
        "sampling": asdict(sampling), "template_kwargs": kwargs,
        "prompt_tokens": None if records.chat else prompt_tokens})
    done = finished_indices(out_path)
    todo = [(i, r) for i, r in enumerate(records.records) if i not in done]
    try:
        num_empty = _write_rows(records, todo, out_path, backend, sampling, tokenizer, kwargs,
                                prompt_tokens, console)
    except BaseException:
        if created and out_path.exists() and out_path.stat().st_size == 0:  # nothing produced: leave no files
            out_path.unlink()
            settings_path(out_path).unlink(missing_ok=True)
        raise
    return RegenResult(out_path, len(todo), len(done), num_empty)


def _write_rows(records, todo, out_path, backend, sampling, tokenizer, kwargs, prompt_tokens,
                console) -> int:
    """Regenerate `todo` in batches, appending each finished row to `out_path`; the empty count."""
    num_empty = 0
    with open(out_path, "a", encoding="utf-8") as f, _progress(console, len(todo)) as advance:
        for start in range(0, len(todo), backend.batch_size):
            chunk = todo[start:start + backend.batch_size]
            try:
                rows = (_regenerate_chats(chunk, backend, sampling, tokenizer, kwargs)
                        if records.chat else
                        _regenerate_texts(chunk, backend, sampling, tokenizer, prompt_tokens))
            except RegenerationError as e:
                if start == 0 and f.tell() == 0:  # nothing written: the caller removes the empty file
                    raise
                raise RegenerationError(f"{e}; finished records are kept in {out_path}: re-run "
                                        f"the same command to resume") from e
            for row in rows:
                num_empty += _is_empty(row)
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
                f.flush()
            advance(len(rows))
    return num_empty


def _is_empty(row: dict) -> bool:
    if "messages" in row:
        return any(m["role"] == "assistant" and not m["content"].strip() for m in row["messages"])
    return not row["completion"].strip()


class _progress:
    """A rich progress bar over records (a no-op without a console); yields `advance(n)`."""

    def __init__(self, console, total: int):
        from rich.progress import Progress, TimeRemainingColumn

        columns = (*Progress.get_default_columns()[:-1], TimeRemainingColumn(elapsed_when_finished=True))
        self.bar = Progress(*columns, console=console, disable=console is None)  # time taken once done, not 0:00:00
        self.task = self.bar.add_task("regenerate", total=total)

    def __enter__(self):
        self.bar.__enter__()
        return lambda n: self.bar.advance(self.task, n)

    def __exit__(self, *exc):
        return self.bar.__exit__(*exc)


# ---------------------------------------------------------------------------------------------
# Whole pipeline stage

@dataclass(frozen=True)
class RegenConfig:
    """Inputs of `specdraft regenerate`: exactly one of `target` (local model directory) or
    `endpoint` (OpenAI-compatible base URL, with `model`). tokenizer: the target's tokenizer
    directory (default: `target`); needed by an endpoint for the no-chat mode and for exact
    token-id prompts with api='completions'."""

    data: str
    out: str
    target: str | None = None
    endpoint: str | None = None
    model: str = ""
    api: str = "chat"
    tokenizer: str | None = None
    chat: bool = True
    prompt_tokens: int = 32
    sampling: Sampling = Sampling()
    template_kwargs: dict[str, Any] | None = None
    concurrency: int = 8
    batch_size: int = 8
    max_retries: int = 5
    timeout_s: float = 120.0
    api_key: str | None = None
    skip_bad: bool = False
    device: str = "cpu"

    def __post_init__(self) -> None:
        if (self.target is None) == (self.endpoint is None):
            raise ValueError("RegenConfig: give exactly one of target (a local model directory) "
                             "or endpoint (an OpenAI-compatible URL)")
        if self.endpoint and not self.model:
            raise ValueError("model is empty: an endpoint needs the served model's name (--model)")
        if self.prompt_tokens <= 0:
            raise ValueError(f"RegenConfig.prompt_tokens = {self.prompt_tokens}: must be positive")


def regenerate_file(cfg: RegenConfig, console=None) -> RegenResult:
    """Read cfg.data, build the backend, `regenerate` into cfg.out. Raises DataError (bad input),
    RegenerationError (failed requests, output of other settings), ValueError (bad config)."""
    from specdraft.data import read_records, skipped_line

    check_out_path(cfg.out, cfg.data)
    records = read_records(cfg.data, chat=cfg.chat, skip_bad=cfg.skip_bad, require_assistant=False)
    if console is not None and records.num_skipped:
        console.print(skipped_line(records.num_skipped, cfg.data), style="yellow", markup=False)
    tokenizer = None
    if cfg.target is not None:
        backend = LocalBackend(cfg.target, tokenizer_dir=cfg.tokenizer,
                               batch_size=cfg.batch_size, device=cfg.device)
    else:
        backend = EndpointBackend(cfg.endpoint, cfg.model, api=cfg.api,
                                  concurrency=cfg.concurrency, timeout_s=cfg.timeout_s,
                                  max_retries=cfg.max_retries, api_key=cfg.api_key)
        if cfg.tokenizer:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(cfg.tokenizer)
    return regenerate(records, cfg.out, backend, cfg.sampling, tokenizer=tokenizer,
                      template_kwargs=cfg.template_kwargs, prompt_tokens=cfg.prompt_tokens,
                      console=console)
