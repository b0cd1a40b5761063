"""The one reader of a drafter's weight files, whatever the field saved them as.

Every consumer (the loader, inspect, convert, export, doctor) reads a drafter's tensors through
`read_weights`, so none of them can see other tensors than the rest. The formats, looked for in
this order (the first present wins; two present is refused, as it is ambiguous):

- ``model.safetensors`` (specdraft, SpecForge, speculators, SGLang exports);
- ``model.safetensors.index.json`` + its shards (transformers' sharded save: ``weight_map``
  maps each tensor name to the shard holding it);
- ``pytorch_model.bin`` (the official EAGLE trainer's ``torch.save`` of a state dict; its HF
  repos ship it), read with ``torch.load(weights_only=True, mmap=True)``: no code runs, and
  the tensors stay in the page cache until used;
- ``pytorch_model.bin.index.json`` + its shards.

Tensors are read lazily where the format allows (safetensors through `safe_open`, .bin files
memory-mapped), so reading a drafter costs about its file size, not a multiple of it. Any file
that cannot be read (cut short, damaged, a pickled object that is not a tensor, a shard the index
names but is not there) is one CheckpointError naming the file and the fix; a file cut short or
damaged is a DamagedCheckpoint (also a `DamagedFile`: the CLI exits 2, as for any unusable input).
"""

from __future__ import annotations

import json
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from specdraft.checkpoint.layouts import WEIGHTS_FILE, CheckpointError
from specdraft.errors import DamagedFile, SpecdraftError
from specdraft.files import ordinary_mode

SAFETENSORS_INDEX = "model.safetensors.index.json"
TORCH_FILE = "pytorch_model.bin"
TORCH_INDEX = "pytorch_model.bin.index.json"
# The weight files a drafter directory may hold, in the order they are looked for.
WEIGHT_FILES = (WEIGHTS_FILE, SAFETENSORS_INDEX, TORCH_FILE, TORCH_INDEX)
REEXPORT_FIX = "restore the file from where the drafter came from, or re-export it"


class DamagedCheckpoint(CheckpointError, DamagedFile):
    """A drafter weight file cut short or damaged (a truncated download or copy)."""


@dataclass(frozen=True)
class WeightFiles:
    """Where a drafter directory keeps its tensors.

    entry: the file named in messages (the weights file, or the index of a sharded save);
    shards: the files holding the tensors (the entry itself when not sharded);
    format: "safetensors" or "torch" (pytorch_model.bin).
    """

    entry: Path
    shards: tuple[Path, ...]
    format: str


def open_safetensors(path: str | Path, fix: str, error: type[SpecdraftError] = DamagedFile) -> Any:
    """`safe_open(path)` on the CPU: tensors read lazily, the handle usable in `with`. The one rule
    of every safetensors reader (target weights, capture shards, drafters): a file cut short (a
    truncated download or copy), cut in its header or not safetensors at all raises `error`
    "PATH: cannot be read as safetensors, cut short or damaged (what safetensors found); FIX".
    safetensors checks at opening that the header parses and the file holds every byte it names."""
    try:
        return safe_open(str(path), framework="pt", device="cpu")
    except SafetensorError as e:
        reason = str(e).removeprefix("Error while deserializing header: ")
        raise error(
            f"{path}: cannot be read as safetensors, cut short or damaged ({reason}); {fix}"
        ) from None


def read_safetensors(
    path: str | Path, fix: str, error: type[SpecdraftError] = DamagedFile
) -> dict[str, torch.Tensor]:
    """Every tensor of a safetensors file, by name (CPU); a damaged file as `open_safetensors`."""
    with open_safetensors(path, fix, error) as f:
        return {key: f.get_tensor(key) for key in f.keys()}  # noqa: SIM118 (a safe_open handle, no dict)


def write_safetensors(
    tensors: dict[str, torch.Tensor], path: str | Path, metadata: dict[str, str] | None = None
) -> None:
    """safetensors.save_file with the permissions of an ordinary file (0666 less the umask;
    save_file creates it owner-only, which a server running as another user cannot read).
    save_file writes from the tensors' memory: no serialized copy is held."""
    save_file(tensors, str(path), metadata=metadata)
    ordinary_mode(path)


def find_weights(path: str | Path) -> WeightFiles:
    """The weight files of drafter directory `path` (see the module doc for the formats).

    Raises CheckpointError naming the directory when it holds none of WEIGHT_FILES or more than
    one format, and naming the index when it is bad JSON, has no weight_map or names a shard
    that is not there."""
    path = Path(path)
    present = [name for name in WEIGHT_FILES if (path / name).is_file()]
    if not present:
        raise CheckpointError(
            f"{path / WEIGHTS_FILE}: missing (looked for {', '.join(WEIGHT_FILES)}); a drafter "
            f"directory holds its tensors in one of them: {REEXPORT_FIX}"
        )
    if len(present) > 1:
        raise CheckpointError(
            f"{path}: holds {' and '.join(present)}, so which tensors are the drafter's is "
            "ambiguous: keep one of them"
        )
    entry = path / present[0]
    fmt = "safetensors" if present[0].startswith("model.safetensors") else "torch"
    if not present[0].endswith(".index.json"):
        return WeightFiles(entry, (entry,), fmt)
    return WeightFiles(entry, tuple(path / name for name in _shard_names(entry)), fmt)


def check_weight_headers(path: str | Path) -> None:
    """CheckpointError naming the first weight file of drafter directory `path` that cannot be read
    (DamagedCheckpoint when cut short or damaged; not tensors), with its fix: safetensors files by
    their headers (`open_safetensors`), PyTorch files by opening them as `read_weights` does
    (memory-mapped: the tensors' bytes are not read). Weight files that are missing or ambiguous (`find_weights`)
    are left to the loader."""
    try:
        files = find_weights(path)
    except CheckpointError:
        return
    for shard in files.shards:
        if files.format == "safetensors":
            with open_safetensors(shard, REEXPORT_FIX, DamagedCheckpoint):
                pass
        else:
            _read_shard(shard, files.format)


def _shard_names(index: Path) -> list[str]:
    """The shard files an index's weight_map names, in first-use order; CheckpointError if bad."""
    try:
        weight_map = json.loads(index.read_text()).get("weight_map")
    except (json.JSONDecodeError, AttributeError, UnicodeDecodeError, OSError) as e:
        raise CheckpointError(
            f"{index}: not a sharded-weights index ({e}); {REEXPORT_FIX}"
        ) from None
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(f"{index}: no weight_map (tensor name -> shard file); {REEXPORT_FIX}")
    names = list(dict.fromkeys(str(v) for v in weight_map.values()))
    missing = [n for n in names if not (index.parent / n).is_file()]
    if missing:
        raise CheckpointError(
            f"{index}: names shards that are not there: {', '.join(missing)}; copy every "
            "shard next to the index"
        )
    return names


def read_weights(path: str | Path) -> tuple[dict[str, torch.Tensor], WeightFiles]:
    """Every tensor of drafter directory `path`, by its name in the file(s), and where they came from.

    safetensors tensors are read through `open_safetensors`; .bin files through
    `torch.load(weights_only=True, mmap=True)` (read-only, copy-on-write pages). A sharded save
    must hold exactly the tensors its index names, each once. Raises CheckpointError naming the
    file for any file that cannot be read (DamagedCheckpoint when cut short or damaged), and for
    names the index and the shards disagree on.
    """
    files = find_weights(path)
    tensors: dict[str, torch.Tensor] = {}
    for shard in files.shards:
        part = _read_shard(shard, files.format)
        twice = sorted(set(part) & set(tensors))
        if twice:
            raise CheckpointError(
                f"{shard}: holds tensors another shard holds too: {', '.join(twice[:8])}; "
                f"{REEXPORT_FIX}"
            )
        tensors.update(part)
    if files.entry not in files.shards:
        _check_index(files.entry, tensors)
    return tensors, files


def _read_shard(file: Path, fmt: str) -> dict[str, torch.Tensor]:
    if fmt == "safetensors":
        return read_safetensors(file, REEXPORT_FIX, DamagedCheckpoint)
    try:
        state = torch.load(file, map_location="cpu", weights_only=True, mmap=True)
    except pickle.UnpicklingError as e:
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise CheckpointError(
            f"{file}: holds pickled objects that are not tensors, refused unread "
            f"(torch.load weights_only: {reason}); convert it to safetensors where it "
            "came from, or re-export it"
        ) from None
    except (RuntimeError, OSError, EOFError, ValueError) as e:
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise DamagedCheckpoint(
            f"{file}: cannot be read as a PyTorch weights file, cut short or damaged "
            f"({reason}); {REEXPORT_FIX}"
        ) from None
    if not isinstance(state, dict) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()
    ):
        raise CheckpointError(
            f"{file}: holds a {type(state).__name__}, not a state dict of named tensors; "
            f"{REEXPORT_FIX}"
        )
    return state


def _check_index(index: Path, tensors: dict[str, torch.Tensor]) -> None:
    """Refuse a sharded save whose shards hold other names than its index lists."""
    named = set(json.loads(index.read_text())["weight_map"])
    unlisted, absent = sorted(set(tensors) - named), sorted(named - set(tensors))
    if unlisted or absent:
        parts = (
            [f"{len(absent)} tensors it lists are in no shard: {', '.join(absent[:8])}"]
            if absent
            else []
        ) + (
            [f"{len(unlisted)} tensors in the shards are not listed: {', '.join(unlisted[:8])}"]
            if unlisted
            else []
        )
        raise CheckpointError(f"{index}: {'; '.join(parts)}; {REEXPORT_FIX}")
