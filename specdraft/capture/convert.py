"""`specdraft store convert`: a hidden-state store from one format to another (specdraft,
speculators, SpecForge; `peers` holds the peer formats and what their files hold).

What specdraft's index needs and a peer store lacks is asked for, never guessed (`from_peer`:
the target directory and the aux layers, given as engine ids in a named convention). A peer
store written here
from a specdraft store keeps that store's index beside its files (`recorded`): converting it
back needs neither and gives the same store.

The last hidden state: specdraft and speculators store it before the target's final norm,
SpecForge after it. To SpecForge it is normed (RMSNorm as transformers computes it, with the
store's norm weight and the target's rms_norm_eps); a norm cannot be undone, so a store made
from SpecForge files (without a `recorded` copy of the states before the norm) records `"last_hidden": "after_norm"` in index.json (training then applies
only lm_head) and cannot become a speculators store.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from specdraft.capture import peers
from specdraft.capture.from_peer import (
    TargetIdentity,
    checked_samples,
    peer_aux_layers,
    target_text_config,
    write_specdraft,
)
from specdraft.capture.recorded import check_given, recorded_index, restore_store, write_record
from specdraft.capture.store import (
    AFTER_NORM,
    INDEX,
    LAST_HIDDEN_KEY,
    CaptureError,
    CaptureStore,
)
from specdraft.files import atomic_dir

FORMATS = ("specdraft", "speculators", "specforge")
CONVENTIONS = ("specdraft", "vllm", "sglang")
# which engine wrote each peer's aux ids: the convention --aux-layers is read in by default
SOURCE_CONVENTION = {"speculators": "vllm", "specforge": "sglang"}


@dataclass(frozen=True)
class PeerInputs:
    """What the user gives `convert_store` about a peer store (None: not given): the target and
    tokenizer directories, needed to make a specdraft store from a peer's without a record (its
    index records the target) and to norm before-norm states for SpecForge when the store records
    no target path; the peer's aux ids and the convention they are in (default: the engine that
    writes that peer's ids, `SOURCE_CONVENTION`)."""

    target: str | None = None
    tokenizer: str | None = None
    aux_layers: tuple[int, ...] | None = None
    convention: str | None = None


@dataclass(frozen=True)
class ConvertResult:
    """What `convert_store` wrote."""

    path: Path
    source_format: str
    format: str
    num_samples: int
    aux_layers: tuple[int, ...] | None


def detect_format(path: str | Path) -> str:
    """'specdraft' (index.json), 'speculators' (a dataset with hidden_states/) or 'specforge'
    (data_{i}.ckpt[.gz] files). Raises CaptureError naming what `path` lacks."""
    path = Path(path)
    if not path.is_dir():
        raise CaptureError(f"{path}: not a directory; give a hidden-state store")
    if (path / INDEX).is_file():
        return "specdraft"
    if peers.is_speculators_store(path):
        return "speculators"
    if any(path.rglob("*.ckpt")) or any(path.rglob("*.ckpt.gz")):
        return "specforge"
    raise CaptureError(
        f"{path}: no {INDEX} (specdraft), dataset_info.json + {peers.SPECULATORS_HS_DIR}/ "
        f"(speculators) or data_{{i}}.ckpt files (SpecForge)"
    )


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The target's final RMSNorm as transformers' Llama computes it (float32 statistics, cast
    back, times the weight), returned in x's dtype. x: [T, H]; weight: [H]."""
    y = x.float()
    y = (y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return (weight * y).to(x.dtype)


def _norm_eps(store: CaptureStore, target: str | None) -> float:
    directory = target or store.meta["target"].get("name_or_path")
    if not directory or not (Path(directory) / "config.json").is_file():
        raise CaptureError(
            f"{store.path / INDEX}: target path {directory!r} has no config.json; "
            f"pass --target DIR (SpecForge stores the state after the final norm, "
            f"which needs the target's rms_norm_eps)"
        )
    config = target_text_config(directory, "--target")
    if "rms_norm_eps" not in config:
        raise CaptureError(
            f"{Path(directory) / 'config.json'}: no rms_norm_eps; the final norm "
            f"SpecForge's files hold cannot be computed"
        )
    return float(config["rms_norm_eps"])


def read_specdraft(store: CaptureStore) -> Iterator[dict[str, torch.Tensor]]:
    for i in range(len(store)):
        row = store[i]
        yield {
            "input_ids": row["input_ids"].long(),
            "loss_mask": row["loss_mask"].long(),
            "aux_hidden": row["aux_hidden"],
            "last_hidden": row["last_hidden"],
        }


def _normed(samples: Iterable[dict], weight: torch.Tensor, eps: float) -> Iterator[dict]:
    for s in samples:
        yield {
            **s,
            "last_hidden": rms_norm(s["last_hidden"], weight.to(s["last_hidden"].device), eps),
        }


def _source_samples(src: Path, source: str) -> tuple[Iterator[dict], bool, CaptureStore | None]:
    """(samples, whether last_hidden is after the final norm, the specdraft store or None)."""
    if source == "specdraft":
        store = CaptureStore(src)
        return read_specdraft(store), store.meta.get(LAST_HIDDEN_KEY) == AFTER_NORM, store
    if source == "speculators":
        return peers.read_speculators(src), False, None
    return peers.read_specforge(src), True, None


def _peek(samples: Iterator[dict], src: Path) -> tuple[Iterator[dict], int]:
    """`samples` unchanged, and its aux states per token (aux width / hidden width)."""
    first = next(samples, None)
    if first is None:
        raise CaptureError(f"{src}: holds no samples")

    def chained() -> Iterator[dict]:
        yield first
        yield from samples

    return chained(), first["aux_hidden"].shape[-1] // first["last_hidden"].shape[-1]


def _source_format(src: Path, dst: Path, to: str) -> str:
    """The format of the store `src` (`detect_format`); CaptureError for an unknown `to`, a store
    already in it, or a `dst` that is not a new or empty directory."""
    if to not in FORMATS:
        raise CaptureError(f"--to {to!r}: unknown store format; use one of {', '.join(FORMATS)}")
    source = detect_format(src)
    if source == to:
        raise CaptureError(f"{src}: already a {to} store; nothing to convert")
    _check_destination(dst)
    return source


def _check_destination(dst: Path) -> None:
    if dst.is_file() or (dst.is_dir() and any(dst.iterdir())):
        raise CaptureError(
            f"{dst}: exists and is not an empty directory; give a new output directory"
        )


def convert_store(
    src: str | Path,
    dst: str | Path,
    to: str,
    given: PeerInputs | None = None,
    *,
    compress: bool = False,
) -> ConvertResult:
    """Convert the store at `src` (format detected, `detect_format`) into `dst` (a new directory,
    written whole or not at all) in format `to` ('specdraft', 'speculators' or 'specforge').

    A peer store written from a specdraft store keeps that store's index (and what the peer's
    files lack of it) in `recorded.RECORD_DIR`, and comes back as the same store: same index,
    same tensors, without target or aux_layers (given, they must name the recorded ones).

    given: the target, tokenizer, aux ids and their convention (`PeerInputs`; None: none given).
    compress: SpecForge .ckpt.gz. Raises CaptureError naming the file and field for bad input.
    """
    src, dst, given = Path(src), Path(dst), given or PeerInputs()
    source = _source_format(src, dst, to)
    samples, after_norm, store = _source_samples(src, source)
    if to == "speculators" and after_norm:
        raise CaptureError(
            f"{src}: holds the last hidden state after the final norm (SpecForge's); "
            f"speculators needs it before the norm, which cannot be recovered"
        )
    samples, num_aux = _peek(samples, src)
    layers = tuple(store.aux_layers) if store is not None else None
    with atomic_dir(dst) as tmp:
        if to == "specdraft":
            convention = given.convention or SOURCE_CONVENTION[source]
            given = dataclasses.replace(given, convention=convention)
            count, layers = _to_specdraft(samples, src, tmp, source, after_norm, num_aux, given)
        elif to == "speculators":
            count = peers.write_speculators(samples, tmp, num_aux)
        else:
            if not after_norm:
                samples = _normed(samples, *_norm_of(store, given.target))
            count = peers.write_specforge(samples, tmp, compress)
        if store is not None:
            write_record(store, tmp, keep_last_hidden=to == "specforge" and not after_norm)
    return ConvertResult(dst, source, to, count, layers)


def _to_specdraft(
    samples: Iterator[dict],
    src: Path,
    out: Path,
    source: str,
    after_norm: bool,
    num_aux: int,
    given: PeerInputs,
) -> tuple[int, tuple[int, ...]]:
    """Write the peer store `src`'s samples as a specdraft store into `out`: the store its
    `recorded` index keeps, else one made with what is `given` (its convention resolved)
    (`from_peer`). Returns (the sample count, the aux layers as specdraft indices)."""
    recorded = recorded_index(src)
    if recorded is not None:
        check_given(recorded, src, given.aux_layers, given.convention, given.target)
        layers = tuple(recorded["aux_layers"])
        checked = checked_samples(samples, recorded["target"]["hidden_size"], len(layers), src)
        last_from_record = after_norm and recorded.get(LAST_HIDDEN_KEY) != AFTER_NORM
        return restore_store(checked, src, out, last_from_record), layers
    ident = TargetIdentity.load(given.target, given.tokenizer)
    layers = peer_aux_layers(given.aux_layers, given.convention, ident.target, num_aux)
    origin = {"format": source, "path": str(src.resolve())}
    count = write_specdraft(
        samples, out, ident, layers, after_norm=after_norm, source=origin, src=src
    )
    return count, layers


def _norm_of(store: CaptureStore | None, target: str | None) -> tuple[torch.Tensor, float]:
    """The target's final norm weight and eps: from a specdraft store's head (eps from --target or
    its recorded target), else from --target's weights."""
    if store is not None:
        return store.target_head()["norm.weight"], _norm_eps(store, target)
    if target is None:
        raise CaptureError(
            "--target DIR is required: SpecForge stores the last hidden state after the "
            "target's final norm, which needs the target's norm weight and rms_norm_eps"
        )
    from specdraft.targets import load_target

    config = target_text_config(target, "--target")
    if "rms_norm_eps" not in config:
        raise CaptureError(f"{Path(target) / 'config.json'}: no rms_norm_eps")
    return load_target(target).final_norm.weight.detach().clone(), float(config["rms_norm_eps"])
