"""The peers' hidden-state stores: speculators' offline format and SpecForge's, read and written
strictly (a missing or extra field is refused, naming the file and the field).

What each file holds, read from the peers' source (not copied; facts only):

| store | file | field | dtype | shape | what it is |
|---|---|---|---|---|---|
| speculators | DIR/ (`datasets.save_to_disk`: data-*.arrow, dataset_info.json, state.json) | input_ids | int64 | [T] per row | token ids of sample i = row i |
| speculators | same dataset | loss_mask | int64 | [T] | 1 = assistant token (a label) |
| speculators | same dataset | seq_len | int | scalar | T |
| speculators | DIR/token_freq.pt (optional) | torch.save dict | | | token counts (not read) |
| speculators | DIR/hidden_states/hs_{i}.safetensors | token_ids | int64 | [T] | must equal row i's input_ids |
| speculators | same file | hidden_states | target dtype (bf16) | [T, n_aux + 1, H] | slots stacked on dim 1: the aux layers in id order, then the last layer's output *before* the final norm (the trainer applies `verifier_norm`) |
| SpecForge | DIR/rows_{g}-{g+G}/data_{i}.ckpt or .ckpt.gz (G = 2000; gzip of the same bytes) | input_ids | int64 | [T] | token ids |
| SpecForge | same file (`torch.save` dict) | loss_mask | int64 | [T] | 1 = assistant token (the reader zeroes the last one itself) |
| SpecForge | same file | aux_hidden_state | target dtype (bf16) | [1, T, n_aux*H] | aux layers concatenated on the last dim, in id order |
| SpecForge | same file | hidden_state | target dtype (bf16) | [1, T, H] | the last hidden state *after* the final norm (the trainer applies only lm_head) |
| SpecForge | DIR/vocab_mapping/vocab_mapping.pt (optional) | torch.save dict d2t, t2d | | | draft vocabulary (not read) |

Neither store records which layers were captured, the target or the tokenizer: `convert`
asks for them. Aux ids are engine ids: speculators' come from vLLM's
`eagle_aux_hidden_state_layer_ids` (default [2, L//2, L-3] plus L for the last state),
SpecForge's from SGLang's capture. Sources read: vllm-project/speculators c05b95b3
(`src/speculators/data_generation/offline.py` check_hidden_states, `train/data.py`
ArrowDataset, `scripts/prepare_data.py`, `hs_connectors/.../transfer.py` FileTransfer) with
vllm-project/vllm 015a95c8 (`distributed/kv_transfer/kv_connector/v1/
example_hidden_states_connector.py`, the writer of hs files); sgl-project/SpecForge a6b6b023
(`scripts/prepare_hidden_states.py` at 7757409f, `specforge/algorithms/common/providers.py`
OfflineCaptureLayout, `specforge/data/preprocessing.py` OfflineEagle3Dataset,
`specforge/modeling/target/target_head.py`, `specforge/offline_capture/sglang_backend/`).

A sample here is a dict: input_ids [T] int64, loss_mask [T] int64 (0/1), aux_hidden
[T, n_aux*H], last_hidden [T, H] (the store's dtype). SpecForge's last_hidden is after the norm.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import pickle
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch

from specdraft.capture.store import CaptureError, DamagedStore
from specdraft.checkpoint import read_safetensors, write_safetensors
from specdraft.files import atomic_write, atomic_write_bytes

SPECULATORS_HS_DIR = "hidden_states"
SPECULATORS_HS_KEYS = ("hidden_states", "token_ids")
SPECULATORS_COLUMNS = ("input_ids", "loss_mask", "seq_len")
SPECFORGE_KEYS = ("input_ids", "loss_mask", "aux_hidden_state", "hidden_state")
SPECFORGE_GROUP = 2000  # files per rows_{g}-{g+G} folder (prepare_hidden_states' default)
_SPECFORGE_NAME = re.compile(r"data_(\d+)\.ckpt(\.gz)?$")
_HS_NAME = re.compile(r"hs_(\d+)\.safetensors$")
PEER_FIX = "restore the file, or write the store again with the tool that made it"  # a peer's file cut short


def _check_keys(path: Path, keys: Iterable[str], expected: tuple[str, ...], what: str) -> None:
    """CaptureError naming the missing and the extra fields of `path`."""
    keys = set(keys)
    missing = [k for k in expected if k not in keys]
    extra = sorted(keys - set(expected))
    if missing or extra:
        parts = ([f"missing {', '.join(missing)}"] if missing else []) + (
            [f"extra {', '.join(extra)}"] if extra else []
        )
        raise CaptureError(
            f"{path}: not a {what} ({'; '.join(parts)}; expected exactly {', '.join(expected)})"
        )


def _check_shape(path: Path, name: str, tensor, shape: tuple) -> None:
    """CaptureError unless `tensor` is a tensor of `shape` (None = any size there)."""
    if not isinstance(tensor, torch.Tensor):
        raise CaptureError(f"{path}: field {name} is a {type(tensor).__name__}, not a tensor")
    if len(tensor.shape) != len(shape) or any(
        s is not None and s != t for s, t in zip(shape, tensor.shape)
    ):
        want = "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"
        raise CaptureError(f"{path}: field {name} has shape {list(tensor.shape)}, expected {want}")


def _split_aux(hs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[T, n+1, H] -> (aux [T, n*H], last [T, H])."""
    return hs[:, :-1].flatten(1), hs[:, -1]


# ---------------------------------------------------------------- speculators


def is_speculators_store(path: Path) -> bool:
    return (path / SPECULATORS_HS_DIR).is_dir() and (path / "dataset_info.json").is_file()


def _hs_files(path: Path) -> dict[int, Path]:
    hs_dir = path / SPECULATORS_HS_DIR
    found = {int(m.group(1)): p for p in hs_dir.iterdir() if (m := _HS_NAME.fullmatch(p.name))}
    others = sorted(
        p.name
        for p in hs_dir.iterdir()
        if not _HS_NAME.fullmatch(p.name) and not p.name.endswith(".lock")
    )
    if others:
        raise CaptureError(
            f"{hs_dir}: holds files that are not hs_{{i}}.safetensors ({', '.join(others[:3])})"
        )
    return found


def read_speculators(path: str | Path) -> Iterator[dict[str, torch.Tensor]]:
    """The samples of a speculators offline store, in row order (see the module table).

    Raises CaptureError naming the file and field: a missing or extra column or tensor, a
    missing hs file, token_ids that differ from the row's input_ids, a wrong shape; DamagedStore
    for an hs file cut short or damaged.
    """
    from datasets import load_from_disk

    path = Path(path)
    try:
        rows = load_from_disk(str(path)).with_format("torch")
    except (FileNotFoundError, ValueError) as e:
        raise CaptureError(f"{path}: not a datasets save_to_disk directory ({e})") from None
    _check_keys(
        path / "dataset_info.json",
        rows.column_names,
        SPECULATORS_COLUMNS,
        "speculators preprocessed dataset",
    )
    files = _hs_files(path)
    if sorted(files) != list(range(len(rows))):
        gaps = sorted(set(range(len(rows))) - set(files))
        raise CaptureError(
            f"{path / SPECULATORS_HS_DIR}: hs_{gaps[0] if gaps else max(files)}"
            f".safetensors: {'missing' if gaps else 'has no dataset row'} "
            f"({len(files)} hs files for {len(rows)} rows)"
        )
    for i in range(len(rows)):
        row, file = rows[i], files[i]
        yield _speculators_sample(file, read_safetensors(file, PEER_FIX, DamagedStore), row)


def _speculators_sample(file: Path, hs: dict, row: dict) -> dict[str, torch.Tensor]:
    _check_keys(file, hs, SPECULATORS_HS_KEYS, "speculators hidden-state file")
    ids, mask = row["input_ids"].long(), row["loss_mask"].long()
    T = ids.numel()
    _check_shape(file, "token_ids", hs["token_ids"], (T,))
    _check_shape(file, "hidden_states", hs["hidden_states"], (T, None, None))
    if hs["hidden_states"].shape[1] < 2:
        raise CaptureError(
            f"{file}: field hidden_states has {hs['hidden_states'].shape[1]} "
            f"layer slots; expected the aux layers and the last layer"
        )
    if not torch.equal(hs["token_ids"].long(), ids):
        raise CaptureError(f"{file}: field token_ids differs from the dataset row's input_ids")
    if mask.shape != ids.shape:
        raise CaptureError(
            f"{file.parent.parent}: row {file.stem[3:]}: loss_mask has "
            f"{mask.numel()} entries for {T} input_ids"
        )
    aux, last = _split_aux(hs["hidden_states"])
    return {"input_ids": ids, "loss_mask": mask, "aux_hidden": aux, "last_hidden": last}


def write_speculators(
    samples: Iterable[dict[str, torch.Tensor]], out: str | Path, num_aux: int
) -> int:
    """Write `samples` (before-norm last states) as a speculators offline store into the new
    directory `out`: the dataset (input_ids, loss_mask, seq_len) and hidden_states/hs_{i}.
    Returns the sample count."""
    from datasets import Dataset

    out = Path(out)
    hs_dir = out / SPECULATORS_HS_DIR
    hs_dir.mkdir(parents=True, exist_ok=True)
    columns: dict[str, list] = {name: [] for name in SPECULATORS_COLUMNS}
    for i, s in enumerate(samples):
        T, H = s["last_hidden"].shape
        stacked = torch.cat([s["aux_hidden"].reshape(T, num_aux, H), s["last_hidden"][:, None]], 1)
        tensors = {"hidden_states": stacked.contiguous(), "token_ids": s["input_ids"].long()}
        atomic_write(
            hs_dir / f"hs_{i}.safetensors", lambda tmp, t=tensors: write_safetensors(t, tmp)
        )
        columns["input_ids"].append(s["input_ids"].long().tolist())
        columns["loss_mask"].append(s["loss_mask"].long().tolist())
        columns["seq_len"].append(T)
    rows = Dataset.from_dict(columns)
    # speculators' reader compares row tensors with torch.equal: its preprocessing saves the rows
    # in torch format (speculators 0.9.0 data_generation/preprocessing.py, set_format(type="torch")).
    rows.set_format(type="torch")
    with quiet_datasets():  # its "Saving the dataset" bar is not specdraft's output
        rows.save_to_disk(str(out))
    return len(columns["seq_len"])


@contextlib.contextmanager
def quiet_datasets():
    """The datasets library's progress bars off in the block, as they were after it."""
    from datasets.utils import (
        are_progress_bars_disabled,
        disable_progress_bars,
        enable_progress_bars,
    )

    was_disabled = are_progress_bars_disabled()
    disable_progress_bars()
    try:
        yield
    finally:
        if not was_disabled:
            enable_progress_bars()


# ---------------------------------------------------------------- SpecForge


def specforge_files(path: str | Path) -> list[Path]:
    """The data_{i}.ckpt / .ckpt.gz files under `path`, by sample index i (SpecForge itself
    sorts the paths as text; the index is the order prepare_hidden_states wrote)."""
    found: dict[int, Path] = {}
    for file in sorted(Path(path).rglob("*.ckpt*")):
        match = _SPECFORGE_NAME.fullmatch(file.name)
        if match is None:
            raise CaptureError(f"{file}: not a SpecForge data_{{i}}.ckpt[.gz] file name")
        index = int(match.group(1))
        if index in found:
            raise CaptureError(f"{file}: sample {index} also in {found[index]}")
        found[index] = file
    return [found[i] for i in sorted(found)]


def _load_ckpt(file: Path) -> dict:
    """torch.load(weights_only=True) of a .ckpt, or of a .ckpt.gz's decompressed bytes."""
    try:
        if file.name.endswith(".gz"):
            with gzip.open(file, "rb") as f:
                return torch.load(io.BytesIO(f.read()), weights_only=True)
        return torch.load(file, weights_only=True)
    except pickle.UnpicklingError:
        raise CaptureError(
            f"{file}: holds objects torch.load(weights_only=True) refuses; a SpecForge "
            f"file holds a dict of tensors only"
        ) from None
    except (OSError, EOFError, RuntimeError, ValueError) as e:
        first = str(e).splitlines()[0] if str(e) else ""
        raise DamagedStore(
            f"{file}: unreadable torch.save file ({type(e).__name__}: {first}); {PEER_FIX}"
        ) from None


def read_specforge(path: str | Path) -> Iterator[dict[str, torch.Tensor]]:
    """The samples of a SpecForge offline store (see the module table), by file index; read
    with torch.load(weights_only=True). last_hidden is *after* the target's final norm.
    Raises CaptureError naming the file and field (missing / extra key, wrong shape); DamagedStore
    for a file cut short or damaged."""
    files = specforge_files(path)
    if not files:
        raise CaptureError(f"{path}: no SpecForge data_{{i}}.ckpt or .ckpt.gz files")
    for file in files:
        data = _load_ckpt(file)
        if not isinstance(data, dict):
            raise CaptureError(f"{file}: holds a {type(data).__name__}, not a dict of tensors")
        _check_keys(file, data, SPECFORGE_KEYS, "SpecForge hidden-state file")
        T = data["input_ids"].numel() if isinstance(data["input_ids"], torch.Tensor) else None
        _check_shape(file, "input_ids", data["input_ids"], (T,))
        _check_shape(file, "loss_mask", data["loss_mask"], (T,))
        _check_shape(file, "hidden_state", data["hidden_state"], (1, T, None))
        _check_shape(file, "aux_hidden_state", data["aux_hidden_state"], (1, T, None))
        H = data["hidden_state"].shape[-1]
        if data["aux_hidden_state"].shape[-1] % H:
            raise CaptureError(
                f"{file}: field aux_hidden_state has width "
                f"{data['aux_hidden_state'].shape[-1]}, not a multiple of {H}"
            )
        yield {
            "input_ids": data["input_ids"].long(),
            "loss_mask": data["loss_mask"].long(),
            "aux_hidden": data["aux_hidden_state"][0],
            "last_hidden": data["hidden_state"][0],
        }


def write_specforge(
    samples: Iterable[dict[str, torch.Tensor]], out: str | Path, compress: bool = False
) -> int:
    """Write `samples` (after-norm last states) as SpecForge files into the new directory
    `out`: rows_{g}-{g+G}/data_{i}.ckpt (.ckpt.gz when `compress`). Returns the sample count."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    count = 0
    for i, s in enumerate(samples):
        group = (i // SPECFORGE_GROUP) * SPECFORGE_GROUP
        folder = out / f"rows_{group}-{group + SPECFORGE_GROUP}"
        folder.mkdir(exist_ok=True)
        record = {
            "input_ids": s["input_ids"].long().clone(),
            "loss_mask": s["loss_mask"].long().clone(),
            "aux_hidden_state": s["aux_hidden"][None].clone(),
            "hidden_state": s["last_hidden"][None].clone(),
        }
        buffer = io.BytesIO()
        torch.save(record, buffer)
        data = gzip.compress(buffer.getvalue(), mtime=0) if compress else buffer.getvalue()
        atomic_write_bytes(folder / f"data_{i}.ckpt{'.gz' if compress else ''}", data)
        count += 1
    return count
