"""The demo's pipeline stages, each cached under --out: convert the target, split the data,
regenerate continuations with the target, capture, train the drafter, export, doctor.

A stage whose output is complete is not redone (one line says it was reused, `say_reused`);
before the stages run, `cache.reconcile_cache` removes the outputs made with other settings.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console

from specdraft.demo.config import DemoConfig
from specdraft.demo.inputs import data_source, split_documents
from specdraft.files import atomic_write_json, atomic_write_text


def stage_target(cfg: DemoConfig, say: Callable[[str], None] = print) -> Path:
    """The target directory: the given one, or stories260K converted under out/target (said in one
    line; a conversion already there is reused, `say_reused`)."""
    if cfg.target is not None:
        return Path(cfg.target)
    from specdraft.stories260k import convert_stories260k, is_converted

    target_dir = cfg.out / "target"
    if is_converted(target_dir):
        say_reused(say, "convert", target_dir)
        return target_dir
    convert_stories260k(target_dir)
    say(f"convert: the bundled stories260K (llama2.c) -> transformers Llama at {target_dir}")
    return target_dir


VAL_FRACTION = 0.05  # of the training documents, held out for training's validation


def train_batch_size(num_samples: int, batch_size: int) -> int:
    """The demo's batch: `batch_size`, lowered to the training split of `num_samples` (the
    validation share, VAL_FRACTION rounded up, held out) when that split holds fewer."""
    return max(1, min(batch_size, num_samples - math.ceil(VAL_FRACTION * num_samples)))


def repoint_regen_settings(out_file: Path, data_file: Path, target_dir: Path) -> None:
    """Point the regenerate sidecar of `out_file` at this run's paths (input file, local target).

    The demo's own record (`reconcile_cache`) has checked what shapes the output (data content,
    target, lengths); the sidecar's absolute paths change only when the demo directory moved.
    """
    from specdraft.regenerate.output import settings_path

    sidecar = settings_path(out_file)
    if not (sidecar.exists() and out_file.exists()):
        return
    settings = json.loads(sidecar.read_text())
    fixed = {**settings, "input": str(Path(data_file).resolve())}
    if isinstance(settings.get("backend"), dict) and settings["backend"].get("kind") == "local":
        fixed["backend"] = {**settings["backend"], "model": str(target_dir)}
    if fixed != settings:
        atomic_write_json(sidecar, fixed)


def say_reused(say: Callable[[str], None], stage: str, path: Path) -> None:
    """One line for a cached stage that is not redone (no progress bar: nothing is left to do)."""
    say(f"{stage}: reused from {path} (settings unchanged)")


def stage_data(cfg: DemoConfig, say: Callable[[str], None] = print) -> tuple[Path, Path]:
    """Write train.txt and heldout.txt (blank-line separated documents) under out/data, or with
    --chat-template train.jsonl and heldout.jsonl (one chat a line)."""
    data_dir, chats = cfg.out / "data", cfg.chat_template is not None
    suffix, separator, what = (".jsonl", "\n", "chats") if chats else (".txt", "\n\n", "documents")
    train_file, heldout_file = data_dir / f"train{suffix}", data_dir / f"heldout{suffix}"
    if train_file.exists() and heldout_file.exists():
        say_reused(say, "data", data_dir)
        return train_file, heldout_file
    train, heldout = split_documents(
        data_source(cfg).read_text(), cfg.num_train, cfg.num_heldout, cfg.seed, chats
    )
    data_dir.mkdir(parents=True, exist_ok=True)
    for path, docs in ((heldout_file, heldout), (train_file, train)):
        atomic_write_text(path, separator.join(docs) + "\n")
    say(f"data: {len(train)} training and {len(heldout)} held-out {what} in {data_dir}")
    return train_file, heldout_file


def regen_complete(out_file: Path, data_file: Path, chat: bool) -> bool:
    """Every record of `data_file` (chats or texts) has its regenerated line in `out_file`."""
    from specdraft.data.records import read_records
    from specdraft.regenerate.output import finished_indices

    num_records = len(read_records(data_file, chat=chat, require_assistant=False).records)
    return finished_indices(out_file) >= set(range(num_records))


def stage_inputs(cfg: DemoConfig, target_dir: Path) -> dict[str, Any]:
    """The fields regenerate's and capture's configs take from the demo's: the target directory,
    the device, and the chat template (chat: whether there is one; its path as a str)."""
    chat = cfg.chat_template is not None
    return {
        "target": str(target_dir),
        "device": cfg.device,
        "chat": chat,
        "chat_template": str(cfg.chat_template) if chat else None,
    }


def stage_regenerate(
    cfg: DemoConfig, target_dir: Path, data_file: Path, say: Callable[[str], None] = print
) -> Path:
    """Replace each document's continuation with the target's greedy output (resumable; a
    complete output is reused without loading the target)."""
    from specdraft.regenerate.backends import Sampling
    from specdraft.regenerate.run import RegenConfig, regenerate_file

    out = data_file.with_name(data_file.stem + ".regen.jsonl")
    repoint_regen_settings(out, data_file, target_dir)
    chat = cfg.chat_template is not None
    if regen_complete(out, data_file, chat):
        say_reused(say, "regenerate", out)
        return out
    say(
        f"regenerate: {'answers' if chat else 'continuations'} of {data_file.name} with the target (greedy)"
    )
    regenerate_file(
        RegenConfig(
            data=str(data_file),
            out=str(out),
            prompt_tokens=cfg.prompt_tokens,
            batch_size=32,
            sampling=Sampling(temperature=0.0, max_new_tokens=cfg.max_new_tokens),
            **stage_inputs(cfg, target_dir),
        ),
        console=Console(stderr=True),
    )
    return out


def store_complete(store: Path) -> bool:
    """A capture store `CaptureStore` opens (a finished index) with every shard file present."""
    from specdraft.capture.store import CaptureError, CaptureStore

    try:
        shards = CaptureStore(store).meta["shards"]
    except CaptureError:
        return False
    return all((store / e["file"]).is_file() for e in shards)


def stage_capture(
    cfg: DemoConfig,
    target_dir: Path,
    regen_file: Path,
    name: str,
    aux_layers: list[int],
    say: Callable[[str], None] = print,
) -> Path:
    """Capture the target's aux states over the regenerated data into out/<name> (resumable; a
    finished store is reused without loading the target)."""
    from specdraft.capture.stage import CaptureConfig, capture_dataset

    store = cfg.out / name
    if store_complete(store):
        say_reused(say, "capture", store)
        return store
    say(
        f"capture: the target's aux states (layers {list(aux_layers)}) over {regen_file.name} into {store}"
    )
    capture_dataset(
        CaptureConfig(
            data=str(regen_file),
            out_dir=str(store),
            aux_layers=tuple(aux_layers),
            dtype="float32",
            max_length=cfg.max_length,
            **stage_inputs(cfg, target_dir),
        ),
        console=Console(stderr=True),
    )
    return store


def stage_train(
    cfg: DemoConfig,
    store: Path,
    target_dir: Path | None = None,
    say: Callable[[str], None] = print,
    dflash: dict[str, Any] | None = None,
) -> tuple[Path, dict[str, Any]]:
    """Train the drafter on the store (resumes from out/train's last checkpoint). The batch is
    cfg.batch_size, lowered to the training split when that is smaller (`train_batch_size`);
    the returned training record holds its "steps" and "config". dflash: the TrainConfig fields
    of a DFlash drafter (`demo.dflash.dflash_fields`), trained into out/train-dflash instead."""
    from specdraft.train.loop import TrainConfig, train

    out = cfg.out / ("train" if dflash is None else "train-dflash")
    draft_dir = out / "draft"
    if (draft_dir / "specdraft_manifest.json").exists():
        manifest = json.loads((draft_dir / "specdraft_manifest.json").read_text())
        say_reused(say, "train", draft_dir)
        return draft_dir, manifest["training"]
    say("train: training the " + ("drafter" if dflash is None else "DFlash drafter"))
    index = store / "index.json"
    num_samples = json.loads(index.read_text())["num_samples"] if index.exists() else cfg.num_train
    batch_size = train_batch_size(num_samples, cfg.batch_size)
    if batch_size < cfg.batch_size:
        Console(stderr=True).print(
            f"demo: batch size {batch_size} (not {cfg.batch_size}): the training split "
            f"holds {num_samples - math.ceil(VAL_FRACTION * num_samples)} of "
            f"{num_samples} samples; raise --num-train for full batches",
            markup=False,
        )
    fields = dict(
        lr=cfg.lr,
        warmup_steps=50,
        total_steps=cfg.train_steps,
        batch_size=batch_size,
        max_length=cfg.max_length,
        ttt_steps=cfg.ttt_steps,
        method=cfg.eagle_method,
        val_fraction=VAL_FRACTION,
        seed=cfg.seed,
        device=cfg.device,
    )
    fields.update(dflash or {})
    every = max(fields["total_steps"] // 4, 1)
    config = TrainConfig(**fields, eval_every=every, save_every=every)
    command = "specdraft demo" + ("" if dflash is None else " --method dflash")
    result = train(config, store, out, resume=True, command=command, target_config=target_dir)
    manifest = json.loads((result.draft_dir / "specdraft_manifest.json").read_text())
    return draft_dir, manifest["training"]  # draft_dir: under --out as given, as a cached run says


def stage_export(
    cfg: DemoConfig, draft_dir: Path, target_dir: Path, chosen: dict[str, Any], chain_steps: int
) -> dict[str, Any]:
    """Export for vLLM, SGLang and speculators; returns engine -> ExportResult.

    SGLang gets the chosen setting; vLLM and speculators (chains only) the fastest chain.
    """
    from specdraft.export import export_dir_beside_run, export_draft

    results = {}
    for engine in ("vllm", "sglang", "speculators"):
        steps, topk, tokens = (
            (chosen["num_steps"], chosen["topk"], chosen["num_draft_tokens"])
            if engine == "sglang"
            else (chain_steps, 1, chain_steps + 1)
        )
        results[engine] = export_draft(
            draft_dir,
            export_dir_beside_run(draft_dir, engine),  # OUT/export/ENGINE
            engine=engine,
            target=target_dir,
            num_steps=steps,
            topk=topk,
            num_draft_tokens=tokens,
        )
    return results


def stage_doctor(
    draft_dir: Path,
    target_dir: Path,
    stores: dict[str, Path],
    exports: dict[str, Any],
    cfg: DemoConfig,
) -> tuple[list[dict[str, Any]], dict[str, list[dict[str, Any]]]]:
    """Doctor on the trained drafter (offline acceptance on each store, served with
    --chat-template) and lint per export (with its launch command as served: `served_command`)."""
    from dataclasses import asdict as as_dict

    from specdraft.doctor.run import run_doctor

    findings = []
    for name, store in stores.items():
        report = run_doctor(
            draft_dir, target=target_dir, samples=store, chat_template=cfg.chat_template
        )
        findings += [{"samples": name, **as_dict(f)} for f in report.findings]
    lint = {}
    for engine in ("sglang", "vllm"):
        args = served_command(cfg, exports[engine].launch_command)
        report = run_doctor(
            exports[engine].out_dir, target=target_dir, engine=engine, engine_args=args
        )
        lint[engine] = [as_dict(f) for f in report.findings]
    return findings, lint


def served_command(cfg: DemoConfig, launch_command: str) -> str:
    """An export's launch command as the demo's data is served: with `--chat-template FILE`
    (vLLM's and SGLang's flag) when the demo trained on chats rendered with it."""
    if cfg.chat_template is None:
        return launch_command
    return f"{launch_command} --chat-template {cfg.chat_template}"
