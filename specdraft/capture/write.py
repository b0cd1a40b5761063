"""Writing a capture store (`write_store`), resumable.

Resume: the sample -> shard assignment is fixed by the data (`shard_plan`: consecutive samples
until a shard would pass `shard_tokens` tokens, which bounds memory and file size), every
file is written to a temp name and renamed (`specdraft.files`), and index.json lists a shard
only once its file is in place with its checksum. Re-running keeps every listed shard whose checksum matches and redoes
the rest; a store captured with other settings (data, target, layers, dtype, lengths) is refused.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save

from specdraft.capture.forward import capture_shard, plan_samples, target_head_tensors, target_meta
from specdraft.capture.store import (
    FORMAT,
    FORMAT_VERSION,
    HEAD,
    INDEX,
    CaptureError,
    StoreSettings,
    bytes_per_token,
    estimate_disk,
    read_index,
    tensor_layout,
)
from specdraft.checkpoint import file_sha256, write_safetensors
from specdraft.data.render import Sample, data_hash
from specdraft.files import (
    atomic_write,
    atomic_write_bytes,
    atomic_write_json,
    differing_fields,
    is_temp_path,
)


@dataclass(frozen=True)
class CaptureResult:
    """What `write_store` did: counts, shards reused from an earlier run, estimated bytes."""

    path: Path
    num_samples: int
    num_tokens: int
    num_shards: int
    num_reused: int
    estimated_bytes: int


def _human(num_bytes: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if num_bytes < 1024 or unit == "TiB":
            return f"{num_bytes:.1f} {unit}" if unit != "B" else f"{int(num_bytes)} B"
        num_bytes /= 1024
    raise AssertionError("unreachable")


def _save_shard(tensors: dict[str, torch.Tensor], path: Path) -> str:
    """Write one shard's tensors to `path` (atomically); its sha256."""
    atomic_write(
        path, lambda tmp: write_safetensors({k: v.contiguous() for k, v in tensors.items()}, tmp)
    )
    return file_sha256(path)


def _new_index(target, samples: list[Sample], settings: StoreSettings, extra: dict) -> dict:
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        **settings.identity(),
        "target": target_meta(target, extra.get("target_path")),
        "tokenizer": extra.get("tokenizer"),
        "chat_template": extra.get("chat_template"),
        "data": extra.get("data"),
        "data_hash": data_hash(samples),
        "num_samples": len(samples),
        "num_tokens": sum(len(s.input_ids) for s in samples),
        "num_shards": len(plan_samples(samples, settings)),
        "tensors": tensor_layout(len(settings.aux_layers), target.hidden_size, settings.dtype),
        "target_head": None,
        "shards": [],
        "complete": False,
    }


_IDENTITY_KEYS = (
    "format_version",
    "aux_layers",
    "dtype",
    "max_length",
    "shard_tokens",
    "shard_samples",
    "data_hash",
    "num_samples",
    "num_tokens",
)
_TARGET_KEY = "target config_hash"


def _identity(index: dict) -> dict[str, Any]:
    """What a resumed store must match: `_IDENTITY_KEYS` and the target's config hash."""
    return {
        **{k: index.get(k) for k in _IDENTITY_KEYS},
        _TARGET_KEY: (index.get("target") or {}).get("config_hash"),
    }


def _resume_index(out_dir: Path, fresh: dict) -> dict:
    """The existing index when its identity matches `fresh` (else CaptureError); else fresh."""
    path = out_dir / INDEX
    if not path.exists():
        return fresh
    old = read_index(path)
    if not old.get("shards"):
        return fresh  # no shard captured yet: nothing to keep, whatever the settings were
    was, now = _identity(old), _identity(fresh)
    diffs = [
        f"{k} differs" if k == _TARGET_KEY else f"{k}: {was[k]!r} vs now {now[k]!r}"
        for k in differing_fields(was, now, (*_IDENTITY_KEYS, _TARGET_KEY))
    ]
    if diffs:
        raise CaptureError(
            f"{path}: this store was captured with other settings ("
            f"{'; '.join(diffs)}); use a new output directory or delete {out_dir}"
        )
    return old


def _save_head(out_dir: Path, head: dict[str, torch.Tensor], index: dict) -> None:
    """Write target_head.safetensors; its sha256 identifies the target's weights, so a resume
    with other weights under the same config is refused (its shards would be stale)."""
    data = save({k: v.contiguous() for k, v in head.items()})
    digest = hashlib.sha256(data).hexdigest()
    old = index["target_head"]
    if old and old["sha256"] != digest:
        raise CaptureError(
            f"{out_dir / HEAD}: the target's head/embedding weights differ from "
            f"the ones this store was captured with; use a new output directory "
            f"or delete {out_dir}"
        )
    if not _valid(out_dir, old):
        atomic_write_bytes(out_dir / HEAD, data)
    index["target_head"] = {"file": HEAD, "sha256": digest}


def _valid(out_dir: Path, entry: dict | None) -> bool:
    if not entry:
        return False
    path = out_dir / entry["file"]
    return path.is_file() and file_sha256(path) == entry["sha256"]


def check_store_dir(out_dir: str | Path) -> Path:
    """`out_dir` as a Path after refusing what capturing there would mix files into: a file, or a
    directory holding anything but a capture store (new, empty, or a store to resume are fine).
    Raises CaptureError."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise CaptureError(
            f"{out_dir} is a file; pass a directory: a new or empty one, or a capture "
            f"store to resume"
        )
    if out.is_dir() and not (out / INDEX).exists():
        # a run stopped before its index leaves at most the target head and temp files
        others = [p.name for p in out.iterdir() if p.name != HEAD and not _is_partial(p)]
        if others:
            raise CaptureError(
                f"{out_dir}: holds files that are not a capture store ({', '.join(sorted(others)[:3])}"
                f"{', ...' if len(others) > 3 else ''}); give a new or empty directory"
            )
    return out


def _is_partial(path: Path) -> bool:
    """A file an interrupted write left: a `files.temp_path`, or `*.tmp` (older specdraft)."""
    return is_temp_path(path) or path.name.endswith(".tmp")


def _print_estimate(
    console, index: dict, settings: StoreSettings, H: int, head_bytes: int, out_dir: Path
) -> int:
    """Print the store's size in two short lines, the total, then how it adds up (one line of 123
    columns broke inside its formula at a 100-column terminal); warn when the disk under `out_dir`
    has less free. Returns the estimated bytes (`estimate_disk`)."""
    n_aux, tokens = len(settings.aux_layers), index["num_tokens"]
    total = estimate_disk(tokens, H, n_aux, settings.dtype, head_bytes)
    if console is not None:
        shards = index["num_shards"]
        console.print(
            f"capture: {index['num_samples']} samples, {tokens} tokens, {shards} "
            f"shard{'s' * (shards != 1)}; estimated disk {_human(total)}",
            markup=False,
        )
        console.print(
            f"  = {tokens} tokens x {bytes_per_token(H, n_aux, settings.dtype)} B (ids 4 + mask 1 + "
            f"{n_aux + 1}·{H}·{settings.dtype.itemsize}) + target head {_human(head_bytes)}",
            markup=False,
        )
        free = shutil.disk_usage(out_dir).free
        if free < total:
            console.print(
                f"warning: only {_human(free)} free under {out_dir}", style="yellow", markup=False
            )
    return total


def write_store(
    target,
    samples: list[Sample],
    out_dir: str | Path,
    settings: StoreSettings,
    *,
    extra: dict | None = None,
    device="cpu",
    console=None,
    run_shards=None,
) -> CaptureResult:
    """Capture `samples` (truncated to settings.max_length) through `target` into `out_dir`.

    target: a `specdraft.targets.Target`. extra: identity recorded in index.json: "tokenizer"
    (`tokenizer_fingerprint`), "chat_template" (`RenderInfo.to_dict()`), "data" (source and
    skipped count), "target_path". console: a rich Console for the disk estimate and the
    progress bar (None = silent). run_shards(jobs, out_dir, settings, on_tokens, on_shard)
    captures the missing shards elsewhere (`in_process(shard_fn)`: vLLM in this process,
    `capture.vllm_parallel`: one vLLM engine process per data-parallel rank): it saves each
    job's file (`save_shard`) and calls on_shard(its index entry) once the file is in place, and
    on_tokens(n) as tokens are captured; `target` then only has to give the config, sizes and
    head weights (`capture.vllm.HeadTarget`). Default: `forward.capture_shard` through `target`
    on `device`, here. index.json has one writer, this function (on_shard runs here).
    Resumes an earlier run in the same directory (see module doc).
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
        num_reused = _keep_valid(out_dir, head, index, done)
        run_shards = run_shards or _here(target, device)
        _capture_missing(run_shards, samples, settings, out_dir, index, done, console)
    except Exception:
        if created and not done:  # nothing captured: leave no store a corrected re-run would meet
            shutil.rmtree(out_dir, ignore_errors=True)
        raise
    index["complete"] = True
    atomic_write_json(out_dir / INDEX, index)
    return CaptureResult(
        out_dir, len(samples), index["num_tokens"], index["num_shards"], num_reused, total
    )


def _here(target, device):
    """`write_store`'s default run_shards: `forward.capture_shard` through `target` on `device`."""
    return in_process(lambda part, st, on_batch: capture_shard(target, part, st, device, on_batch))


def _keep_valid(out_dir: Path, head: dict[str, torch.Tensor], index: dict, done: dict) -> int:
    """Start or resume the store in `out_dir`: delete what an interrupted run left half-written,
    write the target head (`_save_head`), keep the listed shards whose checksum matches (into
    `done`, by shard number) and write index.json listing them. Returns their count."""
    for tmp in [p for p in out_dir.iterdir() if _is_partial(p)]:
        tmp.unlink()  # partial files of an interrupted run
    _save_head(out_dir, head, index)
    done.update({e["shard"]: e for e in index["shards"] if _valid(out_dir, e)})
    index["shards"] = sorted(done.values(), key=lambda e: e["shard"])
    atomic_write_json(out_dir / INDEX, index)
    return len(done)


@dataclass(frozen=True)
class ShardJob:
    """One shard to capture: its number in the store's plan (`forward.plan_samples`), the index
    of its first sample, and its samples (truncated)."""

    shard: int
    first: int
    samples: list[Sample]


def save_shard(out_dir: Path, job: ShardJob, tensors: dict[str, torch.Tensor]) -> dict[str, Any]:
    """Write `job`'s tensors (`forward.shard_tensors`) to `shard-{n:05d}.safetensors` in
    `out_dir`, atomically; its index.json entry (file, sha256, first sample, counts)."""
    name = f"shard-{job.shard:05d}.safetensors"
    digest = _save_shard(tensors, out_dir / name)
    return {
        "shard": job.shard,
        "file": name,
        "sha256": digest,
        "first_sample": job.first,
        "num_samples": len(job.samples),
        "num_tokens": int(tensors["offsets"][-1]),
    }


def in_process(shard_fn):
    """A `write_store` run_shards that captures the jobs here, one after another, with
    shard_fn(samples, settings, on_batch) -> a shard's tensors."""

    def run_shards(
        jobs: list[ShardJob], out_dir: Path, settings: StoreSettings, on_tokens, on_shard
    ) -> None:
        for job in jobs:
            on_shard(save_shard(out_dir, job, shard_fn(job.samples, settings, on_tokens)))

    return run_shards


def _capture_missing(run_shards, samples, settings, out_dir, index, done, console) -> None:
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    plan = plan_samples(samples, settings)
    jobs = [
        ShardJob(s, first, samples[first:end])
        for s, (first, end) in enumerate(plan)
        if s not in done
    ]
    num_tokens = sum(len(x.input_ids) for job in jobs for x in job.samples)
    columns = (
        TextColumn("capture"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("tokens"),
        TimeRemainingColumn(elapsed_when_finished=True),
    )  # time left while running, time taken once done

    def on_shard(entry: dict) -> None:  # the one writer of index.json
        done[entry["shard"]] = entry
        index["shards"] = sorted(done.values(), key=lambda e: e["shard"])
        atomic_write_json(out_dir / INDEX, index)

    with Progress(*columns, console=console, disable=console is None) as progress:
        task = progress.add_task("capture", total=num_tokens)
        run_shards(jobs, out_dir, settings, lambda n: progress.advance(task, n), on_shard)


def interrupted_capture(out_dir: str | Path) -> str:
    """What an interrupted capture into `out_dir` kept, for the line the CLI prints."""
    path = Path(out_dir) / INDEX
    try:
        index = json.loads(path.read_text())
        kept, total = len(index["shards"]), index["num_shards"]
    except (OSError, ValueError, KeyError, TypeError):
        return "no shard captured yet: re-run the same command to start"
    return f"{kept} of {total} shards kept in {out_dir}: re-run the same command to continue"
