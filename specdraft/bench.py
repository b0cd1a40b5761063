"""Benchmark a serving engine with speculation against the same engine without it.

`run_bench` sends the same prompts to a server (specdraft, vLLM, SGLang or any OpenAI-compatible
one) and to an optional baseline server, streaming, at each concurrency of a sweep, and reports:
- output tokens/s (all completion tokens / wall time of the level), TTFT and TPOT (mean, p50,
  p99; TPOT = (latency - TTFT) / (tokens - 1) per request);
- accept length tau and per-position acceptance p_k from raw counter deltas around each level:
  specdraft's and vLLM's /metrics (`<prefix>spec_decode_num_drafts`, `..._num_draft_tokens`,
  `..._num_accepted_tokens`, `..._num_accepted_tokens_per_pos{position}`, vLLM
  `v1/spec_decode/metrics.py`): tau = 1 + accepted / drafts, p_k = accepted at position k-1 /
  drafts, and tau = 1 + sum p_k is checked (M1). SGLang: the native `/generate` endpoint's
  `meta_info` per request: tau = completion_tokens / spec_verify_ct (SGLang's definition; it
  counts the prefill's token, and SGLang exposes no per-position counts);
- speedup = tokens/s with speculation / tokens/s of the baseline at the same concurrency, and
  the crossover: the first concurrency at which speculation stops winning (FC-13). Without a
  baseline the report says "no baseline: speedup not measured": speculation is never called a
  win without one (DESIGN.md invariant 6).
Requests use temperature 0 and ignore_eos (vLLM / SGLang / specdraft extension) by default, so
both servers generate max_tokens tokens for every prompt.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import httpx
import numpy as np

BUILTIN = "builtin"
NO_BASELINE = "no baseline: speedup not measured"
METRIC_PREFIX = {"specdraft": "specdraft:", "vllm": "vllm:"}
COUNTERS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens")


@dataclass(frozen=True)
class BenchConfig:
    """What to benchmark. url / baseline_url: server base URLs (http://host:port); prompts:
    "builtin" or a file (JSONL rows {"prompt": text} or JSON strings; other files: one prompt
    per line); concurrency: requests in flight, one level each; num_prompts: requests per
    level (prompts cycled); max_tokens: per request; tie_band: speedups within 1 +- tie_band
    are ties, not wins (the crossover). Raises ValueError for a bad value."""

    url: str
    baseline_url: str | None = None
    prompts: str = BUILTIN
    concurrency: tuple[int, ...] = (1, 4, 16)
    max_tokens: int = 128
    num_prompts: int = 32
    temperature: float = 0.0
    ignore_eos: bool = True
    warmup: int = 1
    timeout_s: float = 600.0
    tie_band: float = 0.05

    def __post_init__(self) -> None:
        for name in ("url", "baseline_url"):
            value = getattr(self, name)
            if value is not None and not value.startswith(("http://", "https://")):
                raise ValueError(f"{name} {value!r}: must start with http:// or https://")
        if not self.concurrency or any(c < 1 for c in self.concurrency):
            raise ValueError(f"concurrency {list(self.concurrency)}: give positive integers, e.g. 1,4,16")
        for name in ("max_tokens", "num_prompts"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} {getattr(self, name)}: must be >= 1")
        if self.temperature < 0 or self.warmup < 0 or self.timeout_s <= 0 or not 0 <= self.tie_band < 1:
            raise ValueError("temperature and warmup must be >= 0, timeout_s > 0, tie_band in [0, 1)")


def load_prompts(source: str) -> list[str]:
    """Prompts from "builtin" (specdraft/assets/bench_prompts.jsonl: short stories and code) or
    a file. Raises ValueError naming the file and line of a bad row, or for no prompts."""
    if source == BUILTIN:
        text, name = (resources.files("specdraft.assets") / "bench_prompts.jsonl").read_text(), "builtin"
    else:
        path = Path(source)
        if not path.is_file():
            raise ValueError(f"{source}: prompt file not found (give a JSONL file or 'builtin')")
        text, name = path.read_text(), str(path)
    jsonl = name == "builtin" or name.endswith(".jsonl")
    prompts = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        prompts.append(prompt_of_row(line, name, number) if jsonl else line)
    if not prompts:
        raise ValueError(f"{name}: no prompts")
    return prompts


def prompt_of_row(line: str, name: str, number: int) -> str:
    """The prompt of one JSONL row: {"prompt": text} or a JSON string."""
    try:
        row = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"{name}:{number}: not JSON ({e.msg})") from None
    prompt = row.get("prompt") if isinstance(row, dict) else row
    if not isinstance(prompt, str) or not prompt:
        raise ValueError(f'{name}:{number}: expected {{"prompt": "<text>"}} or a JSON string')
    return prompt


# ---- speculative counts -----------------------------------------------------------------------
@dataclass
class SpecCounts:
    """Raw speculative counts over one level (counter deltas or per-request sums).

    num_drafts: verification steps; num_draft_tokens: drafts verified (None when the server
    does not say); accepted_per_pos: accepted drafts per depth (None when not exposed)."""

    source: str
    num_drafts: float
    num_accepted_tokens: float
    num_draft_tokens: float | None = None
    accepted_per_pos: list[float] | None = None

    @property
    def accept_length(self) -> float:
        """tau = 1 + accepted / drafts (emitted tokens per verification)."""
        return 1.0 + self.num_accepted_tokens / self.num_drafts

    @property
    def acceptance_per_position(self) -> list[float] | None:
        """p_k = accepted at depth k / drafts."""
        if self.accepted_per_pos is None:
            return None
        return [a / self.num_drafts for a in self.accepted_per_pos]

    @property
    def tau_from_positions(self) -> float | None:
        """1 + sum p_k (M1: equals accept_length when the counters agree)."""
        p = self.acceptance_per_position
        return None if p is None else 1.0 + sum(p)

    def to_dict(self) -> dict[str, Any]:
        """Raw counts plus tau, p_k and 1 + sum p_k."""
        return {**asdict(self), "accept_length": self.accept_length,
                "acceptance_per_position": self.acceptance_per_position,
                "tau_from_positions": self.tau_from_positions}


def scrape_counters(text: str, prefix: str) -> dict[str, Any]:
    """The speculative counters in a Prometheus exposition: {"num_drafts", "num_draft_tokens",
    "num_accepted_tokens": float (summed over label sets), "per_pos": {position: float}}."""
    from prometheus_client.parser import text_string_to_metric_families

    values: dict[str, Any] = {name: 0.0 for name in COUNTERS}
    values["per_pos"] = {}
    base = prefix + "spec_decode_"
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name.removesuffix("_total")
            if not name.startswith(base) or sample.name.endswith("_created"):
                continue
            key = name.removeprefix(base)
            if key == "num_accepted_tokens_per_pos":
                pos = int(sample.labels["position"])
                values["per_pos"][pos] = values["per_pos"].get(pos, 0.0) + sample.value
            elif key in COUNTERS:
                values[key] += sample.value
    return values


def counter_delta(before: dict[str, Any], after: dict[str, Any], source: str) -> SpecCounts | None:
    """SpecCounts from two scrapes; None when no verification step happened in between."""
    drafts = after["num_drafts"] - before["num_drafts"]
    if drafts <= 0:
        return None
    positions = sorted(after["per_pos"])
    per_pos = [after["per_pos"][k] - before["per_pos"].get(k, 0.0) for k in positions] or None
    return SpecCounts(source, drafts, after["num_accepted_tokens"] - before["num_accepted_tokens"],
                      after["num_draft_tokens"] - before["num_draft_tokens"], per_pos)


# ---- requests ---------------------------------------------------------------------------------
@dataclass
class RequestRecord:
    """One request: TTFT (first text), latency, completion tokens, usage / meta_info or error."""

    ttft_s: float | None
    latency_s: float
    num_tokens: int
    usage: dict[str, Any] | None = None
    error: str | None = None


@dataclass(frozen=True)
class Server:
    """A server under test: base URL, kind (specdraft | vllm | sglang | openai), served model."""

    url: str
    kind: str
    model: str


def detect_server(url: str, timeout_s: float = 30.0) -> Server:
    """Find the server's kind (from its /metrics prefix, else SGLang's /get_model_info) and the
    model it serves (/v1/models). Raises RuntimeError when the server does not answer."""
    with httpx.Client(base_url=url, timeout=timeout_s) as client:
        try:
            listing = client.get("/v1/models")
            listing.raise_for_status()
            model = listing.json()["data"][0]["id"]
        except (httpx.HTTPError, KeyError, IndexError, ValueError) as e:
            raise RuntimeError(f"{url}: no OpenAI-compatible /v1/models ({e})") from None
        metrics = client.get("/metrics")
        text = metrics.text if metrics.status_code == 200 else ""
        for kind, prefix in (*METRIC_PREFIX.items(), ("sglang", "sglang:")):
            if prefix in text:
                return Server(url, kind, model)
        if client.get("/get_model_info").status_code == 200:
            return Server(url, "sglang", model)
    return Server(url, "openai", model)


def request_body(server: Server, prompt: str, cfg: BenchConfig) -> tuple[str, dict[str, Any]]:
    """(path, JSON body): SGLang's native /generate, else streamed /v1/completions with usage."""
    if server.kind == "sglang":
        params = {"temperature": cfg.temperature, "max_new_tokens": cfg.max_tokens,
                  "ignore_eos": cfg.ignore_eos}
        return "/generate", {"text": prompt, "sampling_params": params, "stream": True}
    body = {"model": server.model, "prompt": prompt, "max_tokens": cfg.max_tokens,
            "temperature": cfg.temperature, "stream": True, "stream_options": {"include_usage": True}}
    if server.kind != "openai" and cfg.ignore_eos:
        body["ignore_eos"] = True
    return "/v1/completions", body


async def send(client: httpx.AsyncClient, server: Server, prompt: str, cfg: BenchConfig) -> RequestRecord:
    """Stream one request; time the first text and the end."""
    path, body = request_body(server, prompt, cfg)
    start, first, chunks, last = time.perf_counter(), None, 0, {}
    try:
        async with client.stream("POST", path, json=body) as response:
            if response.status_code != 200:
                detail = (await response.aread()).decode(errors="replace")[:300]
                return RequestRecord(None, time.perf_counter() - start, 0, error=f"HTTP {response.status_code}: {detail}")
            async for line in response.aiter_lines():
                if not line.startswith("data:") or line.strip() == "data: [DONE]":
                    continue
                event = json.loads(line[5:])
                if "error" in event:
                    return RequestRecord(None, time.perf_counter() - start, 0, error=str(event["error"]))
                text = event.get("text", "") if server.kind == "sglang" else "".join(
                    c.get("text") or "" for c in event.get("choices", []))
                if text and first is None:
                    first = time.perf_counter()
                chunks += bool(text)
                last = event.get("meta_info") or event.get("usage") or last
    except (httpx.HTTPError, json.JSONDecodeError) as e:
        return RequestRecord(None, time.perf_counter() - start, 0, error=f"{type(e).__name__}: {e}")
    tokens = int(last.get("completion_tokens", chunks))
    return RequestRecord(first and first - start, time.perf_counter() - start, tokens, last or None)


async def run_requests(server: Server, prompts: list[str], concurrency: int,
                       cfg: BenchConfig) -> tuple[list[RequestRecord], float]:
    """Send all prompts with `concurrency` in flight; (records, wall seconds)."""
    limits = httpx.Limits(max_connections=concurrency + 1)
    async with httpx.AsyncClient(base_url=server.url, timeout=cfg.timeout_s, limits=limits) as client:
        gate = asyncio.Semaphore(concurrency)

        async def one(prompt: str) -> RequestRecord:
            async with gate:
                return await send(client, server, prompt, cfg)

        start = time.perf_counter()
        records = await asyncio.gather(*(one(p) for p in prompts))
        return list(records), time.perf_counter() - start


# ---- one server -------------------------------------------------------------------------------
@dataclass
class Stats:
    """mean, p50 and p99 of a sample (seconds); None for an empty sample."""

    mean: float | None
    p50: float | None
    p99: float | None

    @classmethod
    def of(cls, values: list[float]) -> Stats:
        """Stats of `values`."""
        if not values:
            return cls(None, None, None)
        a = np.asarray(values, dtype=float)
        return cls(float(a.mean()), float(np.percentile(a, 50)), float(np.percentile(a, 99)))


@dataclass
class LevelResult:
    """One server at one concurrency."""

    concurrency: int
    num_requests: int
    num_errors: int
    duration_s: float
    num_output_tokens: int
    tokens_per_s: float
    ttft_s: Stats
    tpot_s: Stats
    spec: SpecCounts | None
    usage_accept_length: float | None = None  # from specdraft's per-response usage
    first_error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        d = asdict(self)
        d["spec"] = self.spec.to_dict() if self.spec else None
        return d


@dataclass
class ServerRun:
    """All levels of one server."""

    url: str
    kind: str
    model: str
    levels: list[LevelResult] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {"url": self.url, "kind": self.kind, "model": self.model,
                "levels": [level.to_dict() for level in self.levels]}


def scrape(server: Server, timeout_s: float) -> dict[str, Any] | None:
    """The server's speculative counters now (None for kinds without Prometheus counters)."""
    prefix = METRIC_PREFIX.get(server.kind)
    if prefix is None:
        return None
    response = httpx.get(server.url + "/metrics", timeout=timeout_s)
    response.raise_for_status()
    return scrape_counters(response.text, prefix)


def level_result(server: Server, concurrency: int, records: list[RequestRecord], duration: float,
                 spec: SpecCounts | None) -> LevelResult:
    """Aggregate the records of one level; raises RuntimeError when every request failed."""
    ok = [r for r in records if r.error is None]
    if not ok:
        raise RuntimeError(f"{server.url}: every request failed at concurrency {concurrency}: "
                           f"{records[0].error}")
    tpot = [(r.latency_s - r.ttft_s) / (r.num_tokens - 1) for r in ok if r.ttft_s is not None and r.num_tokens > 1]
    tokens = sum(r.num_tokens for r in ok)
    if server.kind == "sglang":
        spec = sglang_counts(ok)
    usage = [r.usage for r in ok if r.usage and "num_drafts" in r.usage]
    drafts = sum(u["num_drafts"] for u in usage)
    usage_tau = 1 + sum(u["num_accepted_tokens"] for u in usage) / drafts if drafts else None
    errors = [r.error for r in records if r.error is not None]
    return LevelResult(concurrency, len(records), len(errors), duration, tokens, tokens / duration,
                       Stats.of([r.ttft_s for r in ok if r.ttft_s is not None]), Stats.of(tpot), spec,
                       usage_tau, errors[0] if errors else None)


def sglang_counts(records: list[RequestRecord]) -> SpecCounts | None:
    """tau from SGLang's meta_info: completion_tokens / spec_verify_ct summed over requests."""
    metas = [r.usage for r in records if r.usage and r.usage.get("spec_verify_ct")]
    if not metas:
        return None
    verify = sum(int(m["spec_verify_ct"]) for m in metas)
    completion = sum(int(m["completion_tokens"]) for m in metas)
    return SpecCounts("sglang meta_info (completion_tokens / spec_verify_ct)", verify, completion - verify)


def bench_server(url: str, prompts: list[str], cfg: BenchConfig,
                 progress: Callable[[str], None] | None = None) -> ServerRun:
    """Run every concurrency level against one server (after `warmup` requests)."""
    server = detect_server(url, cfg.timeout_s)
    run = ServerRun(url, server.kind, server.model)
    batch = [prompts[i % len(prompts)] for i in range(cfg.num_prompts)]
    if cfg.warmup:
        asyncio.run(run_requests(server, batch[:cfg.warmup], 1, cfg))
    for concurrency in cfg.concurrency:
        before = scrape(server, cfg.timeout_s)
        records, duration = asyncio.run(run_requests(server, batch, concurrency, cfg))
        after = scrape(server, cfg.timeout_s)
        spec = counter_delta(before, after, f"{server.kind} /metrics") if before is not None else None
        level = level_result(server, concurrency, records, duration, spec)
        run.levels.append(level)
        if progress:
            progress(f"{url} ({server.kind}) concurrency {concurrency}: {level.tokens_per_s:.1f} tok/s, "
                     f"tau {level.spec.accept_length:.3f}" if level.spec else
                     f"{url} ({server.kind}) concurrency {concurrency}: {level.tokens_per_s:.1f} tok/s")
    return run


# ---- comparison and report --------------------------------------------------------------------
@dataclass
class Crossover:
    """Where speculation stops winning: the first concurrency with speedup <= 1 after a win
    (None when it wins everywhere, loses everywhere, or there is no baseline)."""

    concurrency: int | None
    text: str


def find_crossover(points: list[tuple[int, float]], tie_band: float = 0.0) -> Crossover:
    """Crossover of (concurrency, speedup) points (sorted here by concurrency). Speculation
    wins where speedup > 1 + tie_band and loses where speedup < 1 - tie_band (a tie between:
    run-to-run noise); it stops winning at the first point after a win that is no win."""
    points = sorted(points)
    if not points:
        return Crossover(None, NO_BASELINE)
    wins = [s > 1.0 + tie_band for _, s in points]
    band = f" by more than {tie_band:.0%}" if tie_band else ""
    if all(wins):
        return Crossover(None, f"no crossover: speculation wins{band} at every concurrency measured "
                               f"(up to {points[-1][0]}, speedup {points[-1][1]:.2f}x there)")
    if not any(wins):
        c, s = max(points, key=lambda p: p[1])
        verdict = "loses at" if all(s < 1.0 - tie_band for _, s in points) else f"never wins{band} at"
        return Crossover(None, f"no crossover: speculation {verdict} every concurrency measured "
                               f"(best speedup {s:.2f}x at concurrency {c})")
    i = next((i for i in range(1, len(points)) if wins[i - 1] and not wins[i]), None)
    if i is None:  # no win is followed by a loss: speculation only starts winning at some point
        c, s = next(p for p, won in zip(points, wins) if won)
        return Crossover(None, f"no crossover: speculation does not win{band} below concurrency {c}, "
                               f"then wins (speedup {s:.2f}x there)")
    (c0, s0), (c1, s1) = points[i - 1], points[i]
    return Crossover(c1, f"crossover: speculation stops winning{band} between concurrency {c0} "
                         f"(speedup {s0:.2f}x) and {c1} (speedup {s1:.2f}x)")


@dataclass
class BenchReport:
    """Both runs, speedups per concurrency (None without baseline) and the crossover."""

    config: BenchConfig
    spec: ServerRun
    baseline: ServerRun | None
    speedups: list[tuple[int, float]] | None
    crossover: Crossover

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {"config": asdict(self.config), "spec": self.spec.to_dict(),
                "baseline": self.baseline.to_dict() if self.baseline else None,
                "speedups": [{"concurrency": c, "speedup": s} for c, s in self.speedups or []] or None,
                "crossover": asdict(self.crossover)}


def run_bench(cfg: BenchConfig, progress: Callable[[str], None] | None = None) -> BenchReport:
    """Benchmark cfg.url (and cfg.baseline_url, after it, on the same prompts)."""
    prompts = load_prompts(cfg.prompts)
    spec = bench_server(cfg.url, prompts, cfg, progress)
    baseline = bench_server(cfg.baseline_url, prompts, cfg, progress) if cfg.baseline_url else None
    speedups = None
    if baseline is not None:
        speedups = [(a.concurrency, a.tokens_per_s / b.tokens_per_s) for a, b in zip(spec.levels, baseline.levels)]
    return BenchReport(cfg, spec, baseline, speedups, find_crossover(speedups or [], cfg.tie_band))


def fmt(value: float | None, scale: float = 1.0, digits: int = 1) -> str:
    """A number for the markdown tables ("-" for None)."""
    return "-" if value is None else f"{value * scale:.{digits}f}"


def spec_cell(level: LevelResult) -> tuple[str, str]:
    """(tau with its M1 check, p_k) cells of a level."""
    s = level.spec
    if s is None:
        return "-", "-"
    tau = f"{s.accept_length:.3f}"
    if s.tau_from_positions is not None:
        mark = "ok" if abs(s.tau_from_positions - s.accept_length) <= 1e-6 * s.accept_length else "MISMATCH"
        tau += f" = 1 + sum p_k {s.tau_from_positions:.3f} ({mark})"
    p = s.acceptance_per_position
    return tau, " ".join(f"{x:.2f}" for x in p) if p is not None else "not exposed"


def markdown(report: BenchReport) -> str:
    """The report as markdown: one table per server, then speedups and the crossover."""
    cfg = report.config
    settings = (f"{cfg.num_prompts} requests per level, max_tokens {cfg.max_tokens}, temperature "
                f"{cfg.temperature}, ignore_eos {cfg.ignore_eos}, prompts {cfg.prompts}")
    lines = ["# specdraft bench", "", settings, ""]
    for title, run in (("speculative", report.spec), ("baseline", report.baseline)):
        if run is None:
            continue
        lines += [f"## {title}: {run.url} ({run.kind}, model {run.model})", "",
                  "| concurrency | tok/s | TTFT ms mean / p50 / p99 | TPOT ms mean / p50 / p99 | tau | p_k | errors |",
                  "|---|---|---|---|---|---|---|"]
        for lv in run.levels:
            tau, p = spec_cell(lv)
            ttft = " / ".join(fmt(v, 1e3) for v in (lv.ttft_s.mean, lv.ttft_s.p50, lv.ttft_s.p99))
            tpot = " / ".join(fmt(v, 1e3, 2) for v in (lv.tpot_s.mean, lv.tpot_s.p50, lv.tpot_s.p99))
            lines.append(f"| {lv.concurrency} | {lv.tokens_per_s:.1f} | {ttft} | {tpot} | {tau} | {p} | {lv.num_errors} |")
        lines.append("")
    lines += ["## speedup (tokens/s with speculation / baseline, same prompts)", ""]
    if report.speedups is None:
        lines.append(NO_BASELINE)
    else:
        lines += ["| concurrency | speedup |", "|---|---|"]
        lines += [f"| {c} | {s:.2f}x |" for c, s in report.speedups]
    lines += ["", report.crossover.text, ""]
    return "\n".join(lines)


def plot(report: BenchReport, out_dir: Path) -> list[Path]:
    """throughput.png, tpot.png and (with a baseline) speedup.png against concurrency."""
    from matplotlib.figure import Figure

    runs = [("speculative", report.spec), ("baseline", report.baseline)]
    ticks = sorted({lv.concurrency for _, run in runs if run is not None for lv in run.levels})
    series = {"throughput.png": ("output tokens/s", lambda lv: lv.tokens_per_s),
              "tpot.png": ("TPOT p50 (ms)", lambda lv: (lv.tpot_s.p50 or 0.0) * 1e3)}
    paths = []
    for name, (label, value) in series.items():
        fig = Figure(figsize=(5, 3.5))
        ax = fig.add_subplot()
        for title, run in runs:
            if run is not None:
                ax.plot([lv.concurrency for lv in run.levels], [value(lv) for lv in run.levels], "o-", label=title)
        paths.append(save_figure(fig, ax, label, out_dir / name, ticks))
    if report.speedups:
        fig = Figure(figsize=(5, 3.5))
        ax = fig.add_subplot()
        ax.plot(*zip(*report.speedups), "o-", label="speedup")
        ax.axhline(1.0, color="gray", linestyle="--", label="no speculation")
        paths.append(save_figure(fig, ax, "speedup (x)", out_dir / "speedup.png", ticks))
    return paths


def save_figure(fig: Any, ax: Any, ylabel: str, path: Path, ticks: list[int]) -> Path:
    """Label, log-x with the measured concurrencies `ticks`, legend, save atomically."""
    ax.set_xscale("log", base=2)
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.minorticks_off()
    ax.set_xlabel("concurrency")
    ax.set_ylabel(ylabel)
    ax.legend()
    fig.tight_layout()
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=100)
    os.replace(tmp, path)
    return path


def write_report(report: BenchReport, out_dir: str | Path) -> list[Path]:
    """bench.json, bench.md and the plots in out_dir (created; each file written atomically)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, text in (("bench.json", json.dumps(report.to_dict(), indent=2)), ("bench.md", markdown(report))):
        tmp = out / f".{name}.tmp"
        tmp.write_text(text)
        os.replace(tmp, out / name)
        paths.append(out / name)
    return paths + plot(report, out)
