"""Online acceptance: the sample prompts sent to a live server (specdraft, vLLM, SGLang) at
temperature 0, its speculative counters read before and after (`specdraft.client`), and offline
acceptance computed on the sequences the server produced (prompt + its greedy output,
teacher-forced with the target's aux states), so both sides see the same tokens.

Online p_k = accepted drafts at depth k / verification steps, tau = 1 + accepted / steps
(SGLang: completion_tokens / spec_verify_ct, no per-position counts). Offline: the drafter
alone replays the server's chain rounds on those sequences (`offline.run_on(replay=True)`), the same
counts; a per-position average (prod alpha_i) would overstate them, as rounds crowd where
drafts fail.

The sequences must be the token ids the server ran: specdraft and vLLM (>= 0.10.2) return them
on `return_token_ids`, SGLang as `output_ids`. A server that answers text only is re-tokenized
with the target's tokenizer, which does not give back the same ids: an output that continues a
word gains a word-start piece (SentencePiece: "k" -> "▁k"), BPE re-merges pieces the model
emitted apart ("a" + "b" -> "ab"), decoding drops special tokens (an EOS generated under
ignore_eos). Offline then replays sequences the server never ran, so OnlineRun counts those
outputs (`num_retokenized`) and the report says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx

from specdraft.client import (
    SERVER_WAIT_S,
    ClientError,
    RequestRecord,
    Server,
    SpecCounts,
    counter_delta,
    scrape,
    sglang_counts,
    wait_for_server,
)
from specdraft.data.render import Sample
from specdraft.doctor.evidence import Evidence
from specdraft.doctor.file_evidence import Unavailable
from specdraft.doctor.offline import OfflineRun, run_on
from specdraft.train.progress import counted_progress

MAX_TOKENS = 32  # tokens generated per prompt
PROMPT_TOKENS = 8  # prompt length when a sample's supervision starts before its 4th token
TIMEOUT_S = 60.0


class ServerError(RuntimeError):
    """The server did not answer (or answered an error) at its URL."""


@dataclass
class OnlineRun:
    """What the server did: its kind, counter deltas, the sequences it produced (prompt masked
    out, output supervised), how many prompts were sent, and how many outputs came back as text
    only and were re-tokenized (not necessarily the ids the server ran)."""

    server: Server
    counts: SpecCounts | None
    sequences: list[Sample]
    num_prompts: int
    num_retokenized: int = 0


def prompt_of(sample: Sample) -> list[int]:
    """The first tokens of a sample: those before its first supervised token (its prompt turn),
    or the first PROMPT_TOKENS when supervision starts earlier than the fourth token; all of a
    sample without supervised tokens (a suite's prompt, `doctor --samples mt-bench`)."""
    ids = list(sample.input_ids)
    if not any(sample.loss_mask):
        return ids
    first = next((i for i, m in enumerate(sample.loss_mask) if m), len(ids))
    n = first if first >= 4 else PROMPT_TOKENS
    return ids[: max(1, min(n, len(ids) - 1))]


def connect(url: str, timeout_s: float = TIMEOUT_S, wait_s: float = SERVER_WAIT_S) -> Server:
    """The server at `url`, waited for up to wait_s seconds while it refuses connections (still
    starting: `client.wait_for_server`, as bench waits); raises ServerError when it does not answer."""
    import sys

    try:
        return wait_for_server(
            url, wait_s, timeout_s, "--server", on_wait=lambda line: print(line, file=sys.stderr)
        )
    except (RuntimeError, httpx.HTTPError) as e:
        raise ServerError(f"{url} does not answer: {e}") from None


def served(ev: Evidence) -> Server:
    """The --server, connected to once per doctor run (`connect`; cached in `ev`, so the checks that
    ask share one wait). Unavailable without --server, or naming the failure when it does not answer."""
    url = ev.inputs.server
    if url is None:
        raise Unavailable("no --server", "pass a live server URL")

    def connected() -> Server:
        try:
            return connect(url, wait_s=ev.inputs.server_wait_s)
        except ServerError as e:
            raise Unavailable(*server_failure(url, e)) from None

    return ev.cached("server", connected)


def server_failure(url: str, error: ServerError) -> tuple[str, str]:
    """(evidence, fix) of a --server that does not answer, or answers an error."""
    return f"server unreachable or failing: {error}", f"start the server at {url} or fix --server"


def served_by_specdraft(ev: Evidence) -> bool:
    """Whether --server is specdraft's own server (`specdraft serve`: its kind, `client.Server.kind`);
    False without --server or when it does not answer."""
    try:
        return served(ev).kind == "specdraft"
    except Unavailable:
        return False


def run_online(
    server: Server,
    samples: list[Sample],
    tokenizer: Any,
    max_tokens: int = MAX_TOKENS,
    timeout_s: float = TIMEOUT_S,
) -> OnlineRun:
    """Send each sample's prompt (token ids, temperature 0, ignore_eos, asking for the output's
    token ids) one at a time and read the speculative counters around them. tokenizer: a
    callable returning the ids of a text (used when the server returns no token ids; counted
    in num_retokenized). Shows the requests done and the time left
    (`train.progress.counted_progress`). Raises ServerError."""
    url = server.url
    sequences, records, num_retokenized = [], [], 0
    try:
        before = scrape(server, timeout_s)
        with (
            httpx.Client(base_url=server.url, timeout=timeout_s) as client,
            counted_progress("doctor online acceptance (requests)", len(samples)) as advance,
        ):
            for sample in samples:
                prompt = prompt_of(sample)
                output, usage, retokenized = _generate(
                    client, server, prompt, max_tokens, tokenizer
                )
                num_retokenized += retokenized
                records.append(RequestRecord(None, 0.0, len(output), usage))
                if output:
                    sequences.append(Sample(prompt + output, [0] * len(prompt) + [1] * len(output)))
                advance()
        after = scrape(server, timeout_s)
    except (httpx.HTTPError, ClientError) as e:  # ClientError: client.scrape's, naming /metrics
        raise ServerError(f"{url}: {type(e).__name__}: {e}") from None
    if server.kind == "sglang":
        counts = sglang_counts(records)
    elif before is not None:
        counts = counter_delta(before, after, f"{server.kind} /metrics")
    else:
        counts = None
    return OnlineRun(server, counts, sequences, len(samples), num_retokenized)


def _generate(
    client: httpx.Client, server: Server, prompt: list[int], max_tokens: int, tokenizer: Any
) -> tuple[list[int], dict[str, Any] | None, bool]:
    """(output token ids, usage or meta_info, whether the ids were re-tokenized from text) of
    one non-streamed greedy request."""
    if server.kind == "sglang":
        params = {"temperature": 0.0, "max_new_tokens": max_tokens, "ignore_eos": True}
        body = _post(client, "/generate", {"input_ids": prompt, "sampling_params": params})
        ids, text, usage = body.get("output_ids"), body.get("text"), body.get("meta_info")
    else:
        req = {
            "model": server.model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0.0,
        }
        if server.kind != "openai":
            req["ignore_eos"] = True
        if server.kind in ("vllm", "specdraft"):
            req["return_token_ids"] = True
        body = _post(client, "/v1/completions", req)
        choice = (body.get("choices") or [{}])[0]
        ids, text, usage = choice.get("token_ids"), choice.get("text"), body.get("usage")
    if ids is not None:
        return list(ids)[:max_tokens], usage, False
    return tokenizer(text or "")[:max_tokens], usage, True


def _post(client: httpx.Client, path: str, body: dict[str, Any]) -> dict[str, Any]:
    response = client.post(path, json=body)
    if response.status_code != 200:
        raise ServerError(
            f"{client.base_url}{path}: HTTP {response.status_code}: {response.text[:300]}"
        )
    return response.json()


def largest_served_id(run: OnlineRun) -> int:
    """The largest token id among the output tokens the server returned (-1 when none came back)."""
    return max(
        (i for s in run.sequences for i, m in zip(s.input_ids, s.loss_mask) if m), default=-1
    )


def offline_on_served(ev: Evidence, engine: str | None, steps: int, run: OnlineRun) -> OfflineRun:
    """The drafter alone replaying the server's rounds (`steps`-draft chains) on the sequences
    the server produced."""
    return run_on(ev, engine, steps, run.sequences, replay=True)
