"""Which cached stages a run may reuse: out/demo_settings.json records the settings that shaped
each cached stage (paths relative to --out, the data by its content hash, so a copied demo
directory resumes too); a stage whose settings changed is redone with every stage after it
(`reconcile_cache`)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from specdraft.checkpoint import file_sha256
from specdraft.demo.config import DemoConfig
from specdraft.demo.inputs import data_source
from specdraft.files import atomic_write_json, differing_fields

SETTINGS_FILE = "demo_settings.json"


STAGES = ("data", "regenerate", "train", "train-dflash")  # in order: redoing one redoes the later


def path_label(path: Path, out: Path) -> str:
    """`path` relative to --out ("--out/target") when inside it, else absolute: a copied demo
    directory records the same labels."""
    path = Path(path).resolve()
    try:
        return "--out/" + path.relative_to(Path(out).resolve()).as_posix()
    except ValueError:
        return str(path)


def stage_settings(cfg: DemoConfig) -> dict[str, dict[str, Any]]:
    """The settings that shape each cached stage's output (the data and a --chat-template by
    their content, not their paths; the bundled target by its converter's version, which sets
    where its generations end). Later stages (generation, export, doctor, the report) are redone
    on every run."""
    from specdraft.stories260k import CONVERTER

    template = cfg.chat_template
    return {
        "data": {
            "data_sha256": file_sha256(data_source(cfg)),
            "chat_template_sha256": file_sha256(template) if template is not None else None,
            "num_train": cfg.num_train,
            "num_heldout": cfg.num_heldout,
            "seed": cfg.seed,
        },
        "regenerate": {
            "target": f"bundled stories260K ({CONVERTER})"
            if cfg.target is None
            else path_label(cfg.target, cfg.out),
            "prompt_tokens": cfg.prompt_tokens,
            "max_new_tokens": cfg.max_new_tokens,
        },
        "train": {
            "train_steps": cfg.train_steps,
            "batch_size": cfg.batch_size,
            "lr": cfg.lr,
            "ttt_steps": cfg.ttt_steps,
            "seed": cfg.seed,
            "method": cfg.eagle_method,
        },
        "train-dflash": {  # demo --method dflash's drafter (out/train-dflash)
            "block_size": cfg.block_size,
            "dflash_layers": cfg.dflash_layers,
            "dflash_steps": cfg.dflash_steps,
            "dflash_lr": cfg.dflash_lr,
            "dflash_anchors": cfg.dflash_anchors,
        },
    }


HASHED = ("data_sha256", "chat_template_sha256")  # said as "changed", not as two hashes
FLAG_NAMES = {
    "num_train": "--num-train",
    "train_steps": "--train-steps",
    "method": "--method",
    "block_size": "--block-size",
    "target": "--target",
    "data_sha256": "--data (its content)",
    "chat_template_sha256": "--chat-template (its content)",
}


def stages_to_redo(
    old: dict[str, dict[str, Any]], new: dict[str, dict[str, Any]]
) -> tuple[str | None, list[str]]:
    """The first stage whose recorded settings (`old`) differ from the requested ones (`new`),
    or None, and the differences as "--train-steps 1000 -> 200"."""
    for stage in STAGES:
        if old and stage not in old:  # a record older than the stage (train-dflash): none cached
            continue
        before, now = old.get(stage) or {}, new[stage]
        diffs = [
            f"{FLAG_NAMES.get(k, k)} {before.get(k, '?') if k not in HASHED else 'changed'}"
            + ("" if k in HASHED else f" -> {now.get(k)}")
            for k in differing_fields(before, now)
        ]
        if diffs:
            return stage, diffs
    return None, []


def stage_outputs(out: Path, stage: str) -> list[Path]:
    """What `stage` and every later cached stage wrote under out (the converted target is kept)."""
    later = STAGES[STAGES.index(stage) :]
    paths = []
    if "data" in later:
        paths.append(out / "data")
    if "regenerate" in later:
        paths += sorted((out / "data").glob("*.regen.jsonl*")) + [
            out / "store",
            out / "store-heldout",
        ]
    if "train" in later:
        paths += [out / "train", out / "export"]
    if "train-dflash" in later:
        paths.append(out / "train-dflash")
    return [p for p in paths if p.exists()]


def reconcile_cache(cfg: DemoConfig, say: Callable[[str], None]) -> None:
    """Drop the cached stages made with other settings than cfg's (and every later stage), saying
    which settings changed, then record cfg's settings in out/demo_settings.json."""
    new = stage_settings(cfg)
    stage, diffs = redo_from_record(cfg.out, new)
    if stage is not None:
        say(
            f"cached results under {cfg.out} were made with other settings ({'; '.join(diffs)}): "
            f"redoing the {stage} stage and every later one"
        )
        for path in stage_outputs(
            cfg.out, stage
        ):  # data/ holds the regenerated files: gone with it
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink(missing_ok=True)
    cfg.out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(cfg.out / SETTINGS_FILE, {"stages": new})


def redo_from_record(out: Path, new: dict[str, dict[str, Any]]) -> tuple[str | None, list[str]]:
    """`stages_to_redo` against out/demo_settings.json (unreadable: every stage differs); a
    demo directory with data but no record (made before the record existed) redoes the data."""
    record = out / SETTINGS_FILE
    if record.exists():
        try:
            old = json.loads(record.read_text()).get("stages") or {}
        except (OSError, json.JSONDecodeError, AttributeError):
            old = {}
        if isinstance(old.get("train"), dict):  # recorded before --method: all trained eagle3
            old["train"].setdefault("method", "eagle3")
        return stages_to_redo(old, new)
    if (out / "data" / "train.txt").exists() and (out / "data" / "heldout.txt").exists():
        return "data", [f"no {SETTINGS_FILE} records the settings they were made with"]
    return None, []
