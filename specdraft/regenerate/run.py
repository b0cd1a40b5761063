"""Regenerating a dataset with a backend (`regenerate`), and the `specdraft regenerate` stage.

Chat mode: every assistant turn is regenerated in order, each from the conversation so far (with
the earlier turns already regenerated); a chat that ends in a user turn gets one assistant turn
appended. With reasoning="keep" each regenerated assistant turn keeps the reasoning the target
produced, as `reasoning_content` (the server's reasoning field, or a local target's think block
split off its answer); with "drop" the prompts are rendered with the template's non-thinking
switch and no reasoning is written. No-chat mode (base models): the prompt is the record's `prompt` field, or the first
`prompt_tokens` tokens of a document; the target writes the continuation.

Every finished record is appended to the output at once (`specdraft.regenerate.output`), so an
interrupted run resumes where it stopped. A record with an empty answer (whitespace only) is not
written, only counted: the output holds records `capture` and `train` read without --skip-bad.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from specdraft.data.records import Records
from specdraft.data.template import check_template_mode, use_chat_template
from specdraft.regenerate.backends import (
    Backend,
    EndpointBackend,
    LocalBackend,
    RegenerationError,
    RegenerationSettingError,
    Sampling,
)
from specdraft.regenerate.output import (
    check_out_path,
    check_settings,
    finished_indices,
    records_hash,
    settings_path,
)
from specdraft.regenerate.turns import regenerate_chats, regenerate_texts


@dataclass(frozen=True)
class RegenResult:
    """num_done: records written by this run; num_kept: finished by an earlier run; num_empty:
    records not written because an answer came back empty (no text to train on, and a line
    `read_records` refuses); a resumed run asks for them again."""

    path: Path
    num_done: int
    num_kept: int
    num_empty: int


def regenerate(
    records: Records,
    out_path: str | Path,
    backend: Backend,
    sampling: Sampling,
    *,
    tokenizer=None,
    template_kwargs: dict | None = None,
    prompt_tokens: int = 32,
    console=None,
    reasoning: str = "keep",
) -> RegenResult:
    """Regenerate every record of `records` into JSONL `out_path` (resumable; see module doc).

    records: `read_records(..., require_assistant=False)`; chat records regenerate assistant
    turns, text records continuations (needs `tokenizer`; prompt = `prompt` field or the first
    `prompt_tokens` tokens). tokenizer: the target's (local: the backend's own); with it, chat
    prompts are also rendered to exact token ids (used by api='completions').
    console: rich Console for a progress bar (None = silent). reasoning: "keep" | "drop" (module
    doc); "drop" needs the tokenizer (its template names the non-thinking switch).
    Raises RegenerationError (failed request after retries, output of other settings),
    RegenerationSettingError (a ValueError) for a mode the tokenizer at hand cannot serve.
    """
    out_path = check_out_path(out_path)
    tokenizer = tokenizer if tokenizer is not None else getattr(backend, "tokenizer", None)
    kwargs = _template_kwargs(records, tokenizer, dict(template_kwargs or {}), reasoning)
    created = not out_path.exists()
    settings = _settings(records, backend, sampling, kwargs, reasoning, prompt_tokens)
    check_settings(out_path, settings)
    done = finished_indices(out_path)
    todo = [(i, r) for i, r in enumerate(records.records) if i not in done]
    try:
        num_written, num_empty = _write_rows(
            records,
            todo,
            out_path,
            backend,
            sampling,
            tokenizer,
            kwargs,
            prompt_tokens,
            console,
            reasoning,
        )
    except BaseException:
        if created and out_path.exists() and out_path.stat().st_size == 0:  # leave no files
            out_path.unlink()
            settings_path(out_path).unlink(missing_ok=True)
        raise
    return RegenResult(out_path, num_written, len(done), num_empty)


def _settings(
    records: Records, backend, sampling: Sampling, kwargs, reasoning, prompt_tokens
) -> dict:
    """What the output's settings sidecar records (`output.check_settings`): the input and its
    hash, the mode, the backend, sampling, template kwargs, reasoning and (no-chat) prompt length."""
    return {
        "input": str(records.path.resolve()),
        "input_hash": records_hash(records),
        "num_records": len(records.records),
        "chat": records.chat,
        "backend": backend.describe(),
        "sampling": asdict(sampling),
        "template_kwargs": kwargs,
        "reasoning": reasoning,
        "prompt_tokens": None if records.chat else prompt_tokens,
    }


def _template_kwargs(records: Records, tokenizer, kwargs: dict, reasoning: str) -> dict:
    """The chat-template kwargs `regenerate` renders with: `kwargs`, plus the template's
    non-thinking switch with reasoning="drop". Raises RegenerationSettingError when the mode
    needs the tokenizer and there is none, DataError for chats and a tokenizer without a template."""
    from specdraft.data.reasoning import check_mode, reasoning_kwargs
    from specdraft.data.render import check_chat_template

    if check_mode(reasoning) == "drop" and records.chat:
        if tokenizer is None:
            raise RegenerationSettingError(
                "--reasoning drop with --endpoint needs --tokenizer (the target's "
                "tokenizer: its chat template names the non-thinking switch)"
            )
        kwargs = reasoning_kwargs(tokenizer, kwargs, reasoning)
    if not records.chat and tokenizer is None:
        raise RegenerationSettingError(
            "--no-chat with --endpoint needs --tokenizer DIR (the target's tokenizer: it cuts "
            "each text into a prompt of --prompt-tokens tokens), or pass --target DIR"
        )
    if tokenizer is not None:
        check_chat_template(tokenizer, records)
    return kwargs


def _write_rows(
    records, todo, out_path, backend, sampling, tokenizer, kwargs, prompt_tokens, console, reasoning
) -> tuple[int, int]:
    """Regenerate `todo` in batches, appending each finished row with no empty answer to
    `out_path`; (rows written, rows left out as empty)."""
    num_written = num_empty = 0
    with open(out_path, "a", encoding="utf-8") as f, _progress(console, len(todo)) as advance:
        for start in range(0, len(todo), backend.batch_size):
            chunk = todo[start : start + backend.batch_size]
            try:
                rows = (
                    regenerate_chats(chunk, backend, sampling, tokenizer, kwargs, reasoning)
                    if records.chat
                    else regenerate_texts(chunk, backend, sampling, tokenizer, prompt_tokens)
                )
            except RegenerationError as e:
                if start == 0 and f.tell() == 0:  # nothing written: the caller removes it
                    raise
                raise RegenerationError(
                    f"{e}; finished records are kept in {out_path}: re-run "
                    f"the same command to resume"
                ) from e
            for row in rows:
                if _is_empty(row):
                    num_empty += 1
                    continue
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
                f.flush()
                num_written += 1
            advance(len(rows))
    return num_written, num_empty


def _is_empty(row: dict) -> bool:
    if "messages" in row:
        return any(
            m["role"] == "assistant"
            and not (m["content"] or "").strip()
            and not m.get("tool_calls")
            for m in row["messages"]
        )
    return not row["completion"].strip()


class _progress:
    """A rich progress bar over records (a no-op without a console); yields `advance(n)`."""

    def __init__(self, console, total: int):
        from rich.progress import Progress, TimeRemainingColumn

        columns = (
            *Progress.get_default_columns()[:-1],
            TimeRemainingColumn(elapsed_when_finished=True),
        )
        # TimeRemainingColumn: the time taken once done, not 0:00:00
        self.bar = Progress(*columns, console=console, disable=console is None)
        self.task = self.bar.add_task("regenerate", total=total)

    def __enter__(self):
        self.bar.__enter__()
        return lambda n: self.bar.advance(self.task, n)

    def __exit__(self, *exc):
        return self.bar.__exit__(*exc)


@dataclass(frozen=True)
class RegenConfig:
    """Inputs of `specdraft regenerate`: exactly one of `target` (local model directory) or
    `endpoint` (OpenAI-compatible base URL, with `model`). tokenizer: the target's tokenizer
    directory (default: `target`); needed by an endpoint for the no-chat mode and for exact
    token-id prompts with api='completions'. chat_template: a Jinja file rendering the chats
    instead of the tokenizer's template (`data.template`; an endpoint's chat API renders with
    the server's own, so it needs api='completions' and `tokenizer`)."""

    data: str
    out: str
    target: str | None = None
    endpoint: str | None = None
    model: str = ""
    api: str = "chat"
    tokenizer: str | None = None
    chat_template: str | None = None
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
    reasoning: str = "keep"

    def __post_init__(self) -> None:
        if (self.target is None) == (self.endpoint is None):
            raise RegenerationSettingError(
                "RegenConfig: give exactly one of target (a local model directory) "
                "or endpoint (an OpenAI-compatible URL)"
            )
        if self.endpoint and not self.model:
            raise RegenerationSettingError(
                "model is empty: an endpoint needs the served model's name (--model)"
            )
        if self.prompt_tokens <= 0:
            raise RegenerationSettingError(
                f"RegenConfig.prompt_tokens = {self.prompt_tokens}: must be positive"
            )
        check_template_mode(self.chat_template, self.chat)
        if self.chat_template and self.endpoint and (self.api == "chat" or not self.tokenizer):
            raise RegenerationSettingError(
                f"--chat-template {self.chat_template} with --endpoint needs --api completions "
                "--tokenizer DIR (the chat API renders with the server's own template: start the "
                "server with --chat-template instead)"
            )


def regenerate_file(cfg: RegenConfig, console=None) -> RegenResult:
    """Read cfg.data, build the backend, `regenerate` into cfg.out. Raises DataError (bad input),
    RegenerationError (failed requests, output of other settings), RegenerationSettingError (a
    ValueError: bad config)."""
    from specdraft.data.records import read_records, skipped_line

    check_out_path(cfg.out, cfg.data)
    records = read_records(cfg.data, chat=cfg.chat, skip_bad=cfg.skip_bad, require_assistant=False)
    if console is not None and records.num_skipped:
        console.print(skipped_line(records.num_skipped, cfg.data), style="yellow", markup=False)
    tokenizer = None
    if cfg.target is not None:
        backend = LocalBackend(
            cfg.target, tokenizer_dir=cfg.tokenizer, batch_size=cfg.batch_size, device=cfg.device
        )
    else:
        backend = EndpointBackend(
            cfg.endpoint,
            cfg.model,
            api=cfg.api,
            concurrency=cfg.concurrency,
            timeout_s=cfg.timeout_s,
            max_retries=cfg.max_retries,
            api_key=cfg.api_key,
        )
        if cfg.tokenizer:
            from specdraft.targets.tokenizer import load_target_tokenizer

            tokenizer = load_target_tokenizer(cfg.tokenizer, "pass --tokenizer DIR, a tokenizer")
    if cfg.chat_template:  # an endpoint with a template has a tokenizer (`RegenConfig`)
        use_chat_template(tokenizer or backend.tokenizer, cfg.chat_template, chat=cfg.chat)
    return regenerate(
        records,
        cfg.out,
        backend,
        cfg.sampling,
        tokenizer=tokenizer,
        template_kwargs=cfg.template_kwargs,
        prompt_tokens=cfg.prompt_tokens,
        console=console,
        reasoning=cfg.reasoning,
    )
