"""What a peer store converted from a specdraft store keeps of it, so that converting it back
gives the same store: the folder `RECORD_DIR` beside the peer's files holds the specdraft
store's index.json (aux layers as specdraft indices, target, tokenizer, chat template,
max_length, data and data_hash), its target head and, for SpecForge (whose files hold the last
state after the target's final norm, which cannot be undone), the last states before the norm,
one file per specdraft shard (`last_hidden-{s:05d}.safetensors`, tensor "last_hidden" [N, H]).

Neither peer reads that folder: speculators reads its dataset and hidden_states/, SpecForge
its data_{i}.ckpt[.gz] files. Converting back (`restore_store`) checks that the peer's
samples are still the recorded ones (token ids and loss masks: the recorded data_hash), then
writes the recorded shards again and the recorded index, each shard's checksum taken from the
file written.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from specdraft.capture.forward import shard_tensors
from specdraft.capture.store import (
    HEAD,
    INDEX,
    CaptureError,
    CaptureStore,
    DamagedStore,
    read_index,
)
from specdraft.capture.write import _save_shard
from specdraft.checkpoint import file_sha256, read_safetensors, write_safetensors
from specdraft.conventions import layers_of_option
from specdraft.data.render import Sample, data_hash
from specdraft.files import atomic_write_json

RECORD_DIR = "specdraft_store"


def _last_hidden_file(record: Path, shard: int) -> Path:
    return record / f"last_hidden-{shard:05d}.safetensors"


def write_record(store: CaptureStore, out: Path, keep_last_hidden: bool) -> None:
    """Keep `store`'s index and target head (and its before-norm last states when
    `keep_last_hidden`) in `out`/`RECORD_DIR`."""
    record = out / RECORD_DIR
    record.mkdir()
    shutil.copyfile(store.path / store.meta["target_head"]["file"], record / HEAD)
    if keep_last_hidden:
        for s in range(len(store.meta["shards"])):
            write_safetensors(store.shard_tensors(s, "last_hidden"), _last_hidden_file(record, s))
    atomic_write_json(record / INDEX, store.meta)


def recorded_index(src: Path) -> dict[str, Any] | None:
    """The specdraft index a peer store at `src` keeps (`write_record`), None when it keeps none."""
    path = src / RECORD_DIR / INDEX
    return read_index(path) if path.is_file() else None


def check_given(
    index: dict[str, Any], src: Path, aux_layers, convention: str, target: str | None
) -> None:
    """CaptureError when --aux-layers (read in `convention`) or --target name other layers or
    another target than the store `src` records."""
    from specdraft.targets.config import recorded_target_class

    where = src / RECORD_DIR / INDEX
    recorded = index["target"]
    if aux_layers is not None:
        layers = layers_of_option(
            convention, aux_layers, recorded["num_layers"], recorded_target_class(recorded)
        )
        if list(layers) != list(index["aux_layers"]):
            raise CaptureError(
                f"--aux-layers {','.join(map(str, aux_layers))} reads as specdraft indices "
                f"{list(layers)}, but {where} records {index['aux_layers']}; leave --aux-layers out"
            )
    if target is not None:
        from specdraft.targets.config import config_hash, read_target_config

        if config_hash(read_target_config(target)) != recorded["config_hash"]:
            raise CaptureError(
                f"--target {target}: another model than the one {where} records "
                f"({recorded['name_or_path']}); leave --target out"
            )


def _changed(src: Path) -> CaptureError:
    return CaptureError(
        f"{src}: its samples are not the ones {src / RECORD_DIR / INDEX} records (data_hash): the "
        f"store changed after it was converted; delete {src / RECORD_DIR} and pass --target and "
        f"--aux-layers"
    )


def restore_store(samples: Iterator[dict], src: Path, out: Path, last_from_record: bool) -> int:
    """Write the specdraft store `src`/`RECORD_DIR` records into the new directory `out`: token
    ids, loss masks and aux states from `samples` (the peer's, in order), last states from them
    too, or from the record when `last_from_record` (SpecForge's are after the norm). Returns
    the sample count. Raises CaptureError when the peer's samples are not the recorded ones."""
    record = src / RECORD_DIR
    index = read_index(record / INDEX)
    kept: list[Sample] = []
    for s, entry in enumerate(index["shards"]):
        rows = [row for _, row in zip(range(entry["num_samples"]), samples)]
        if len(rows) != entry["num_samples"]:
            raise _changed(src)
        last = None
        if last_from_record:
            fix = f"delete {record} and pass --target and --aux-layers"
            last = read_safetensors(_last_hidden_file(record, s), fix, DamagedStore)["last_hidden"]
        part = [Sample(r["input_ids"].tolist(), r["loss_mask"].tolist()) for r in rows]
        states = [(r["aux_hidden"], r["last_hidden"]) for r in rows]
        if last is not None:
            bounds = torch.tensor([0] + [len(p.input_ids) for p in part]).cumsum(0).tolist()
            states = [(a, last[i:j]) for (a, _), i, j in zip(states, bounds, bounds[1:])]
        entry["sha256"] = _save_shard(shard_tensors(part, states), out / entry["file"])
        kept += part
    if next(samples, None) is not None or data_hash(kept) != index["data_hash"]:
        raise _changed(src)
    shutil.copyfile(record / HEAD, out / index["target_head"]["file"])
    if file_sha256(out / index["target_head"]["file"]) != index["target_head"]["sha256"]:
        raise CaptureError(
            f"{record / HEAD}: checksum differs from the one {record / INDEX} records; "
            f"delete {record} and pass --target and --aux-layers"
        )
    atomic_write_json(out / INDEX, index)
    return len(kept)
