"""Run the target over a dataset and keep what training needs: a sharded safetensors store.

Layout of a store directory:

    shard-00000.safetensors   per shard, samples concatenated along the token axis:
                              input_ids [N] int32, loss_mask [N] uint8, offsets [S+1] int64
                              (sample j = rows offsets[j]:offsets[j+1]),
                              aux_hidden [N, n_aux*H] and last_hidden [N, H] (bf16 by default)
    target_head.safetensors   the target's final norm, lm_head and input embedding weights
                              ("norm.weight", "lm_head.weight", "embed_tokens.weight")
    index.json                settings, target / tokenizer / template / data identity, shard list
                              with sha256 checksums, sample and token counts

Why `last_hidden` and not logits: the trainer recomputes the target's logits as
lm_head(final_norm(last_hidden)) with `target_head.safetensors`. That costs H values per token
(2·H bytes in bf16; 8 KiB for H = 4096) where full logits cost V values (256 KiB in bf16 for
V = 128,256, 31x more), and top-k logits would store 2 values (id, logit) per k while losing the
rest of the distribution. One extra matmul per step is cheaper than the disk and I/O.

Resume: the sample -> shard assignment is fixed by the data (`shard_plan`: consecutive samples
until a shard would pass `shard_tokens` tokens, which bounds memory and file size), every
file is written to a temp name and renamed, and index.json lists a shard only once its file is in
place with its checksum. Re-running keeps every listed shard whose checksum matches and redoes
the rest; a store captured with other settings (data, target, layers, dtype, lengths) is refused.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save

from specdraft.checkpoint import file_sha256, write_safetensors
from specdraft.data import Sample, data_hash

FORMAT = "specdraft-capture"
FORMAT_VERSION = 1
INDEX = "index.json"
HEAD = "target_head.safetensors"
DTYPES = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float16": torch.float16,
          "fp16": torch.float16, "float32": torch.float32, "fp32": torch.float32}
FIX_CORRUPT = "delete it and re-run capture to redo it"


class CaptureError(ValueError):
    """A store that cannot be written, resumed or read; the message names the file and the fix."""


def parse_dtype(name: str | torch.dtype) -> torch.dtype:
    """'bf16' / 'bfloat16' / 'fp16' / 'float16' / 'fp32' / 'float32' (or a dtype) -> dtype."""
    if isinstance(name, torch.dtype):
        return name
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}; use one of {', '.join(DTYPES)}")
    return DTYPES[name]


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@dataclass(frozen=True)
class CaptureResult:
    """What `write_store` did: counts, shards reused from an earlier run, estimated bytes."""

    path: Path
    num_samples: int
    num_tokens: int
    num_shards: int
    num_reused: int
    estimated_bytes: int


@dataclass(frozen=True)
class StoreSettings:
    """What a store's contents depend on; a resume must match all of it.

    aux_layers: specdraft indices. dtype: storage dtype of aux_hidden / last_hidden.
    max_length: samples are truncated to this many tokens. shard_tokens: at most this many
    tokens per shard (a longer single sample gets a shard of its own); the states of one shard
    are held in memory, shard_tokens · bytes_per_token bytes (65,536 tokens = 2 GiB for H = 4096,
    3 aux layers, bf16). shard_samples: optional cap on samples per shard as well.
    batch_tokens: padded tokens per target forward (batching by length; not identity).
    """

    aux_layers: tuple[int, ...]
    dtype: torch.dtype = torch.bfloat16
    max_length: int = 2048
    shard_tokens: int = 65536
    batch_tokens: int = 16384
    shard_samples: int | None = None

    def __post_init__(self) -> None:
        for name in ("max_length", "shard_tokens", "batch_tokens"):
            if getattr(self, name) <= 0:
                raise ValueError(f"StoreSettings.{name} = {getattr(self, name)}: must be positive")
        if self.shard_samples is not None and self.shard_samples <= 0:
            raise ValueError(f"StoreSettings.shard_samples = {self.shard_samples}: must be "
                             f"positive (or None)")
        if not self.aux_layers:
            raise ValueError("StoreSettings.aux_layers is empty: name the aux layers to capture")

    def identity(self) -> dict[str, Any]:
        return {"aux_layers": list(self.aux_layers), "dtype": _dtype_name(self.dtype),
                "max_length": self.max_length, "shard_tokens": self.shard_tokens,
                "shard_samples": self.shard_samples}


def bytes_per_token(hidden_size: int, n_aux: int, dtype: torch.dtype) -> int:
    """Stored bytes per token: input_ids 4 + loss_mask 1 + (n_aux + 1)·H·itemsize."""
    return 4 + 1 + (n_aux + 1) * hidden_size * dtype.itemsize


def estimate_disk(num_tokens: int, hidden_size: int, n_aux: int, dtype: torch.dtype,
                  head_bytes: int = 0) -> int:
    """Bytes a store of `num_tokens` tokens will take (shards + target head; headers ignored)."""
    return num_tokens * bytes_per_token(hidden_size, n_aux, dtype) + head_bytes


def _human(num_bytes: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if num_bytes < 1024 or unit == "TiB":
            return f"{num_bytes:.1f} {unit}" if unit != "B" else f"{int(num_bytes)} B"
        num_bytes /= 1024
    raise AssertionError("unreachable")


def _atomic_save(tensors: dict[str, torch.Tensor], path: Path) -> str:
    tmp = path.with_name(path.name + ".tmp")
    write_safetensors({k: v.contiguous() for k, v in tensors.items()}, tmp)
    digest = file_sha256(tmp)
    os.replace(tmp, path)
    return digest


def _atomic_json(obj: dict, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)


# ---------------------------------------------------------------------------------------------
# Running the target

def shard_plan(lengths: list[int], shard_tokens: int,
               shard_samples: int | None = None) -> list[tuple[int, int]]:
    """Sample ranges [first, end) of each shard: consecutive samples, a new shard whenever the
    next sample would take the current one past `shard_tokens` tokens or `shard_samples`."""
    plan: list[tuple[int, int]] = []
    first, tokens = 0, 0
    max_samples = shard_samples or len(lengths)
    for i, n in enumerate(lengths):
        if i > first and (tokens + n > shard_tokens or i - first >= max_samples):
            plan.append((first, i))
            first, tokens = i, 0
        tokens += n
    if lengths:
        plan.append((first, len(lengths)))
    return plan


def _plan(samples: list[Sample], settings: StoreSettings) -> list[tuple[int, int]]:
    return shard_plan([len(s.input_ids) for s in samples], settings.shard_tokens,
                      settings.shard_samples)


def _length_batches(lengths: list[int], batch_tokens: int) -> list[list[int]]:
    """Indices sorted by length, grouped so that count · longest <= batch_tokens (>= 1 each)."""
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    batches: list[list[int]] = []
    for i in order:
        if batches and (len(batches[-1]) + 1) * lengths[i] <= batch_tokens:
            batches[-1].append(i)
        else:
            batches.append([i])
    return batches


def _forward_batch(target, samples: list[Sample], aux_layers, dtype, device):
    """Per sample: (aux [T, n_aux*H], last [T, H]) in `dtype` on the CPU (right padding)."""
    longest = max(len(s.input_ids) for s in samples)
    ids = torch.zeros(len(samples), longest, dtype=torch.long)
    mask = torch.zeros(len(samples), longest, dtype=torch.long)
    for b, s in enumerate(samples):
        ids[b, : len(s.input_ids)] = torch.tensor(s.input_ids)
        mask[b, : len(s.input_ids)] = 1
    out = target.forward(ids.to(device), mask.to(device), aux_layers=list(aux_layers),
                         return_logits=False)
    return [(out.aux_hidden[b, : len(s.input_ids)].to("cpu", dtype),
             out.last_hidden[b, : len(s.input_ids)].to("cpu", dtype)) for b, s in enumerate(samples)]


def capture_shard(target, samples: list[Sample], settings: StoreSettings, device="cpu",
                  on_batch=None) -> dict[str, torch.Tensor]:
    """The tensors of one shard for `samples` (already truncated), in sample order.

    Samples are batched by length (`settings.batch_tokens` padded tokens per forward).
    `on_batch(num_tokens)` is called after each forward. Returns input_ids [N] int32,
    loss_mask [N] uint8, offsets [S+1] int64, aux_hidden [N, n_aux*H], last_hidden [N, H].
    """
    lengths = [len(s.input_ids) for s in samples]
    states: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * len(samples)
    for batch in _length_batches(lengths, settings.batch_tokens):
        outs = _forward_batch(target, [samples[i] for i in batch], settings.aux_layers,
                              settings.dtype, device)
        for i, out in zip(batch, outs):
            states[i] = out
        if on_batch:
            on_batch(sum(lengths[i] for i in batch))
    offsets = torch.zeros(len(samples) + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(torch.tensor(lengths, dtype=torch.int64), 0)
    return {
        "input_ids": torch.tensor([t for s in samples for t in s.input_ids], dtype=torch.int32),
        "loss_mask": torch.tensor([m for s in samples for m in s.loss_mask], dtype=torch.uint8),
        "offsets": offsets,
        "aux_hidden": torch.cat([a for a, _ in states]),
        "last_hidden": torch.cat([h for _, h in states]),
    }


def target_head_tensors(target) -> dict[str, torch.Tensor]:
    """Copies of the target's final norm, lm_head and input embedding weights (CPU)."""
    return {"norm.weight": target.final_norm.weight.detach().to("cpu").clone(),
            "lm_head.weight": target.lm_head.weight.detach().to("cpu").clone(),
            "embed_tokens.weight": target.embed_tokens.weight.detach().to("cpu").clone()}


# ---------------------------------------------------------------------------------------------
# Writing

def target_meta(target, name_or_path: str | None) -> dict[str, Any]:
    """What a store index and a manifest record about a loaded target (`Target`)."""
    from specdraft.draft import rope_from_hf_config
    from specdraft.target import config_hash

    cfg = target.config
    rope_theta, rope_scaling = rope_from_hf_config(lambda k, d=None: getattr(cfg, k, d))
    return {"architecture": target.architecture, "target_class": target.target_class,
            "config_hash": config_hash(cfg), "hidden_size": target.hidden_size,
            "vocab_size": target.vocab_size, "num_layers": target.num_layers,
            "rope_theta": rope_theta, "rope_scaling": rope_scaling,
            "max_position_embeddings": getattr(cfg, "max_position_embeddings", None),
            "name_or_path": name_or_path}


def _new_index(target, samples: list[Sample], settings: StoreSettings, extra: dict) -> dict:
    n_aux = len(settings.aux_layers)
    H = target.hidden_size
    return {
        "format": FORMAT, "format_version": FORMAT_VERSION, **settings.identity(),
        "target": target_meta(target, extra.get("target_path")),
        "tokenizer": extra.get("tokenizer"), "chat_template": extra.get("chat_template"),
        "data": extra.get("data"), "data_hash": data_hash(samples),
        "num_samples": len(samples), "num_tokens": sum(len(s.input_ids) for s in samples),
        "num_shards": len(_plan(samples, settings)),
        "tensors": {"input_ids": ["int32", ["N"]], "loss_mask": ["uint8", ["N"]],
                    "offsets": ["int64", ["S+1"]],
                    "aux_hidden": [_dtype_name(settings.dtype), ["N", n_aux * H]],
                    "last_hidden": [_dtype_name(settings.dtype), ["N", H]]},
        "target_head": None, "shards": [], "complete": False,
    }


_IDENTITY_KEYS = ("format_version", "aux_layers", "dtype", "max_length", "shard_tokens",
                  "shard_samples", "data_hash", "num_samples", "num_tokens")


def _resume_index(out_dir: Path, fresh: dict) -> dict:
    """The existing index when its identity matches `fresh` (else CaptureError); else fresh."""
    path = out_dir / INDEX
    if not path.exists():
        return fresh
    old = read_index(path)
    if not old.get("shards"):
        return fresh  # no shard captured yet: nothing to keep, whatever the settings were
    diffs = [f"{k}: {old.get(k)!r} vs now {fresh[k]!r}" for k in _IDENTITY_KEYS
             if old.get(k) != fresh[k]]
    if old.get("target", {}).get("config_hash") != fresh["target"]["config_hash"]:
        diffs.append("target config_hash differs")
    if diffs:
        raise CaptureError(f"{path}: this store was captured with other settings ("
                           f"{'; '.join(diffs)}); use a new output directory or delete {out_dir}")
    return old


def _save_head(out_dir: Path, head: dict[str, torch.Tensor], index: dict) -> None:
    """Write target_head.safetensors; its sha256 identifies the target's weights, so a resume
    with other weights under the same config is refused (its shards would be stale)."""
    data = save({k: v.contiguous() for k, v in head.items()})
    digest = hashlib.sha256(data).hexdigest()
    old = index["target_head"]
    if old and old["sha256"] != digest:
        raise CaptureError(f"{out_dir / HEAD}: the target's head/embedding weights differ from "
                           f"the ones this store was captured with; use a new output directory "
                           f"or delete {out_dir}")
    if not _valid(out_dir, old):
        tmp = out_dir / (HEAD + ".tmp")
        tmp.write_bytes(data)
        os.replace(tmp, out_dir / HEAD)
    index["target_head"] = {"file": HEAD, "sha256": digest}


def _valid(out_dir: Path, entry: dict | None) -> bool:
    if not entry:
        return False
    path = out_dir / entry["file"]
    return path.is_file() and file_sha256(path) == entry["sha256"]


def read_index(path: Path) -> dict[str, Any]:
    """A store's index.json; CaptureError naming the file when it is not valid JSON."""
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise CaptureError(f"{path}: not valid JSON ({e}); the store's index is damaged: capture into a new "
                           f"directory (or delete {path.parent} and re-run capture)") from None


def check_store_dir(out_dir: str | Path) -> Path:
    """`out_dir` as a Path after refusing what capturing there would mix files into: a file, or a
    directory holding anything but a capture store (new, empty, or a store to resume are fine).
    Raises CaptureError."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise CaptureError(f"{out_dir} is a file; pass a directory: a new or empty one, or a capture "
                           f"store to resume")
    if out.is_dir() and not (out / INDEX).exists():
        # a run stopped before its index leaves at most the target head and temp files
        others = [p.name for p in out.iterdir() if p.name != HEAD and not p.name.endswith(".tmp")]
        if others:
            raise CaptureError(f"{out_dir}: holds files that are not a capture store ({', '.join(sorted(others)[:3])}"
                               f"{', ...' if len(others) > 3 else ''}); give a new or empty directory")
    return out


def _print_estimate(console, index: dict, settings: StoreSettings, H: int, head_bytes: int,
                    out_dir: Path) -> int:
    n_aux = len(settings.aux_layers)
    total = estimate_disk(index["num_tokens"], H, n_aux, settings.dtype, head_bytes)
    if console is not None:
        console.print(
            f"capture: {index['num_samples']} samples, {index['num_tokens']} tokens, "
            f"{index['num_shards']} shards; estimated disk {_human(total)} "
            f"({bytes_per_token(H, n_aux, settings.dtype)} B/token = ids 4 + mask 1 + "
            f"{n_aux + 1}·{H}·{settings.dtype.itemsize}, target head {_human(head_bytes)})")
        free = shutil.disk_usage(out_dir).free
        if free < total:
            console.print(f"warning: only {_human(free)} free under {out_dir}", style="yellow",
                          markup=False)
    return total


def write_store(target, samples: list[Sample], out_dir: str | Path, settings: StoreSettings, *,
                extra: dict | None = None, device="cpu", console=None) -> CaptureResult:
    """Capture `samples` (truncated to settings.max_length) through `target` into `out_dir`.

    target: a `specdraft.target.Target`. extra: identity recorded in index.json: "tokenizer"
    (`tokenizer_fingerprint`), "chat_template" (`RenderInfo.to_dict()`), "data" (source and
    skipped count), "target_path". console: a rich Console for the disk estimate and the
    progress bar (None = silent). Resumes an earlier run in the same directory (see module doc).
    Raises CaptureError when `out_dir` holds a store captured with other settings.
    """
    out_dir = check_store_dir(out_dir)
    samples = [s.truncated(settings.max_length) for s in samples]
    fresh = _new_index(target, samples, settings, extra or {})
    index = _resume_index(out_dir, fresh) if out_dir.is_dir() else fresh
    head = target_head_tensors(target)
    head_bytes = sum(t.numel() * t.element_size() for t in head.values())
    created = not out_dir.exists()
    out_dir.mkdir(parents=True, exist_ok=True)
    total = _print_estimate(console, index, settings, target.hidden_size, head_bytes, out_dir)
    done: dict[int, dict] = {}
    try:
        for tmp in out_dir.glob("*.tmp"):
            tmp.unlink()  # partial files of an interrupted run
        _save_head(out_dir, head, index)
        done.update({e["shard"]: e for e in index["shards"] if _valid(out_dir, e)})
        index["shards"] = sorted(done.values(), key=lambda e: e["shard"])
        _atomic_json(index, out_dir / INDEX)
        num_reused = len(done)
        _capture_missing(target, samples, settings, out_dir, index, done, device, console)
    except Exception:
        if created and not done:  # nothing captured: leave no store that a corrected re-run would meet
            shutil.rmtree(out_dir, ignore_errors=True)
        raise
    index["complete"] = True
    _atomic_json(index, out_dir / INDEX)
    return CaptureResult(out_dir, len(samples), index["num_tokens"], index["num_shards"],
                         num_reused, total)


def _capture_missing(target, samples, settings, out_dir, index, done, device, console) -> None:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    plan = _plan(samples, settings)
    todo = [s for s in range(len(plan)) if s not in done]
    num_tokens = sum(len(x.input_ids) for s in todo for x in samples[plan[s][0]:plan[s][1]])
    columns = (TextColumn("capture"), BarColumn(), MofNCompleteColumn(), TextColumn("tokens"),
               TimeRemainingColumn(elapsed_when_finished=True))  # time left while running, time taken once done
    with Progress(*columns, console=console, disable=console is None) as progress:
        task = progress.add_task("capture", total=num_tokens)
        for s in todo:
            first, end = plan[s]
            part = samples[first:end]
            tensors = capture_shard(target, part, settings, device,
                                    on_batch=lambda n: progress.advance(task, n))
            name = f"shard-{s:05d}.safetensors"
            digest = _atomic_save(tensors, out_dir / name)
            done[s] = {"shard": s, "file": name, "sha256": digest, "first_sample": first,
                       "num_samples": len(part), "num_tokens": int(tensors["offsets"][-1])}
            index["shards"] = sorted(done.values(), key=lambda e: e["shard"])
            _atomic_json(index, out_dir / INDEX)


# ---------------------------------------------------------------------------------------------
# Whole pipeline stage

@dataclass(frozen=True)
class CaptureConfig:
    """Inputs of `specdraft capture`.

    target: transformers model directory (its tokenizer too unless `tokenizer` is given).
    data: JSONL / save_to_disk dir / text file (see specdraft.data). aux_layers: specdraft indices
    (None = conventions.default_aux_layers). dtype: storage dtype name. target_dtype: compute
    dtype of the target. chat=False renders plain text (base models). template_kwargs go to
    apply_chat_template (e.g. {"enable_thinking": False}).
    """

    target: str
    data: str
    out_dir: str
    aux_layers: tuple[int, ...] | None = None
    dtype: str = "bfloat16"
    target_dtype: str = "float32"
    max_length: int = 2048
    shard_tokens: int = 65536
    batch_tokens: int = 16384
    chat: bool = True
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    skip_bad: bool = False
    tokenizer: str | None = None
    device: str = "cpu"

    def __post_init__(self) -> None:
        parse_dtype(self.dtype)
        parse_dtype(self.target_dtype)


def load_inputs(target: str | Path, data: str | Path, *, tokenizer: str | None = None,
                chat: bool = True, template_kwargs: dict[str, Any] | None = None,
                skip_bad: bool = False, target_dtype: torch.dtype = torch.float32,
                device: str | torch.device = "cpu"):
    """The target, its tokenizer and `data` rendered with it: what capture and online training read.

    target: transformers model directory (its tokenizer too unless `tokenizer` is given); data,
    chat, template_kwargs, skip_bad: as `specdraft.data.load_dataset`.
    Returns (Target, tokenizer, SampleSet). Raises DataError (bad data, naming the file) and
    ValueError (a tokenizer longer than the target's vocabulary: it belongs to another model).
    """
    from transformers import AutoTokenizer

    from specdraft.data import load_dataset
    from specdraft.target import load_target

    model = load_target(target, dtype=target_dtype, device=device)
    tok = AutoTokenizer.from_pretrained(tokenizer or target)
    if len(tok) > model.vocab_size:
        raise ValueError(f"tokenizer has {len(tok)} tokens but the target's vocabulary is "
                         f"{model.vocab_size}: pass the target's own tokenizer (--tokenizer)")
    samples = load_dataset(data, tok, chat=chat, template_kwargs=template_kwargs, skip_bad=skip_bad)
    return model, tok, samples


def check_aux_arg(aux_layers, target: str | Path) -> None:
    """Refuse --aux-layers that the drafter trained on them could not be exported or served with
    (`conventions.check_aux_layers`: 3 layers, strictly increasing, within 0..L), reading L from
    the target's config so that nothing is loaded or written first. Raises ValueError."""
    from transformers import AutoConfig

    from specdraft.conventions import check_aux_flag

    config = AutoConfig.from_pretrained(target, local_files_only=True)
    check_aux_flag(aux_layers, config.get_text_config().num_hidden_layers)


def capture_dataset(cfg: CaptureConfig, console=None) -> CaptureResult:
    """Load the target, its tokenizer and the data; render; `write_store` into cfg.out_dir.

    Raises DataError (bad data), CaptureError (store of other settings), ValueError (a token id
    outside the target's vocabulary: the tokenizer belongs to another model)."""
    from specdraft.conventions import default_aux_layers
    from specdraft.data import skipped_line, tokenizer_fingerprint

    check_store_dir(cfg.out_dir)
    if cfg.aux_layers is not None:
        check_aux_arg(cfg.aux_layers, cfg.target)
    target, tokenizer, data = load_inputs(
        cfg.target, cfg.data, tokenizer=cfg.tokenizer, chat=cfg.chat,
        template_kwargs=cfg.template_kwargs, skip_bad=cfg.skip_bad,
        target_dtype=parse_dtype(cfg.target_dtype), device=cfg.device)
    aux = tuple(cfg.aux_layers or default_aux_layers(target.num_layers))
    settings = StoreSettings(aux, parse_dtype(cfg.dtype), cfg.max_length, cfg.shard_tokens,
                             cfg.batch_tokens)
    extra = {"tokenizer": tokenizer_fingerprint(tokenizer),
             "chat_template": data.render_info.to_dict(),
             "target_path": str(Path(cfg.target).resolve()),
             "data": {"path": str(cfg.data), "num_skipped": data.num_skipped}}
    if console is not None and data.num_skipped:
        console.print(skipped_line(data.num_skipped, cfg.data), style="yellow", markup=False)
    return write_store(target, data.samples, cfg.out_dir, settings, extra=extra,
                       device=cfg.device, console=console)


def interrupted_capture(out_dir: str | Path) -> str:
    """What an interrupted capture into `out_dir` kept, for the line the CLI prints."""
    path = Path(out_dir) / INDEX
    try:
        index = json.loads(path.read_text())
        kept, total = len(index["shards"]), index["num_shards"]
    except (OSError, ValueError, KeyError, TypeError):
        return "no shard captured yet: re-run the same command to start"
    return f"{kept} of {total} shards kept in {out_dir}: re-run the same command to continue"


# ---------------------------------------------------------------------------------------------
# Reading

class CaptureStore:
    """Read a finished capture store.

    store[i] -> dict(input_ids [T] long, loss_mask [T] bool, aux_hidden [T, n_aux*H],
    last_hidden [T, H]) in the stored dtype. `.meta` is index.json. Raises CaptureError for a
    directory without index.json or an unfinished store.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        index_path = self.path / INDEX
        if not index_path.is_file():
            raise CaptureError(f"{index_path}: not found; {self.path} is not a capture store "
                               f"(write one with `specdraft capture`)")
        self.meta: dict[str, Any] = read_index(index_path)
        if self.meta.get("format") != FORMAT:
            raise CaptureError(f"{index_path}: not a {FORMAT} index")
        if not self.meta["complete"]:
            raise CaptureError(f"{self.path}: unfinished store ({len(self.meta['shards'])} of "
                               f"{self.meta['num_shards']} shards); re-run capture with the same "
                               f"arguments to finish it")
        self._shards = self.meta["shards"]
        self._starts = [e["first_sample"] for e in self._shards]
        self._files: dict[int, Any] = {}
        self._offsets: dict[int, list[int]] = {}

    def __len__(self) -> int:
        return self.meta["num_samples"]

    @property
    def aux_layers(self) -> list[int]:
        return list(self.meta["aux_layers"])

    def _open(self, s: int):
        if s not in self._files:
            path = self.path / self._shards[s]["file"]
            if not path.is_file():
                raise CaptureError(f"{path}: missing shard; re-run capture to redo it")
            self._files[s] = safe_open(str(path), framework="pt")
            self._offsets[s] = self._files[s].get_tensor("offsets").tolist()
        return self._files[s], self._offsets[s]

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        if not 0 <= i < len(self):
            raise IndexError(f"sample {i} out of range 0..{len(self) - 1}")
        s = bisect.bisect_right(self._starts, i) - 1
        f, offsets = self._open(s)
        j = i - self._starts[s]
        a, b = offsets[j], offsets[j + 1]
        return {"input_ids": f.get_slice("input_ids")[a:b].long(),
                "loss_mask": f.get_slice("loss_mask")[a:b].bool(),
                "aux_hidden": f.get_slice("aux_hidden")[a:b],
                "last_hidden": f.get_slice("last_hidden")[a:b]}

    def lengths(self) -> list[int]:
        """Token count of every sample, in order (for batching by length)."""
        out = []
        for s in range(len(self._shards)):
            offsets = self._open(s)[1]
            out += [b - a for a, b in zip(offsets, offsets[1:])]
        return out

    def target_head(self) -> dict[str, torch.Tensor]:
        """{"norm.weight" [H], "lm_head.weight" [V, H], "embed_tokens.weight" [V, H]}."""
        return load_file(str(self.path / self.meta["target_head"]["file"]))

    def verify(self) -> None:
        """Check every shard's and the target head's sha256 against index.json.

        Raises CaptureError naming the first bad file and the fix (delete it and re-run capture).
        """
        for entry in [self.meta["target_head"], *self._shards]:
            path = self.path / entry["file"]
            if not path.is_file():
                raise CaptureError(f"{path}: missing; re-run capture to redo it")
            if file_sha256(path) != entry["sha256"]:
                raise CaptureError(f"{path}: checksum mismatch (corrupt shard); {FIX_CORRUPT}")
