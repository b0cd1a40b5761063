"""`specdraft store convert`: a hidden-state store from one format to another (specdraft,
speculators, SpecForge; `peers` holds the peer formats and what their files hold).

What specdraft's index needs and a peer store lacks is asked for, never guessed: the target
directory (its config hash, sizes, head weights and tokenizer) and the aux layers, given as
engine ids in a named convention (`conventions.layers_of_option`). A peer store written here
from a specdraft store keeps that store's index beside its files (`recorded`): converting it
back needs neither and gives the same store.

The last hidden state: specdraft and speculators store it before the target's final norm,
SpecForge after it. To SpecForge it is normed (RMSNorm as transformers computes it, with the
store's norm weight and the target's rms_norm_eps); a norm cannot be undone, so a store made
from SpecForge files (without a `recorded` copy of the states before the norm) records `"last_hidden": "after_norm"` in index.json (training then applies
only lm_head) and cannot become a speculators store.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from specdraft.capture import peers
from specdraft.capture.recorded import check_given, recorded_index, restore_store, write_record
from specdraft.capture.store import (
    FORMAT,
    FORMAT_VERSION,
    INDEX,
    CaptureError,
    CaptureStore,
    dtype_name,
)
from specdraft.conventions import layers_of_option
from specdraft.files import atomic_dir, atomic_write_json

FORMATS = ("specdraft", "speculators", "specforge")
CONVENTIONS = ("specdraft", "vllm", "sglang")
# which engine wrote each peer's aux ids: the convention --aux-layers is read in by default
SOURCE_CONVENTION = {"speculators": "vllm", "specforge": "sglang"}
LAST_HIDDEN_KEY = "last_hidden"  # index.json: "before_norm" (absent = before) or "after_norm"
AFTER_NORM = "after_norm"
_SHARD_TOKENS = 65536


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


def _target_text_config(directory: str | Path, flag: str) -> dict[str, Any]:
    path = Path(directory) / "config.json"
    if not path.is_file():
        raise CaptureError(f"{path}: not found; {flag} must be the target model's directory")
    config = json.loads(path.read_text())
    return config.get("text_config") or config


def _norm_eps(store: CaptureStore, target: str | None) -> float:
    directory = target or store.meta["target"].get("name_or_path")
    if not directory or not (Path(directory) / "config.json").is_file():
        raise CaptureError(
            f"{store.path / INDEX}: target path {directory!r} has no config.json; "
            f"pass --target DIR (SpecForge stores the state after the final norm, "
            f"which needs the target's rms_norm_eps)"
        )
    config = _target_text_config(directory, "--target")
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


def peer_aux_layers(aux_ids, convention: str, target, num_aux: int) -> tuple[int, ...]:
    """Specdraft indices of `aux_ids` read in `convention` (one of `conventions.AUX_CONVENTIONS`,
    `conventions.layers_of_option`) for `target` (a `specdraft.targets.Target`). Raises
    CaptureError / ConventionError naming the ids."""
    if aux_ids is None:
        raise CaptureError(
            f"--aux-layers is required: a peer store does not record which target "
            f"layers it holds (give the {num_aux} engine ids it was captured with, "
            f"e.g. vLLM's eagle_aux_hidden_state_layer_ids without the last layer)"
        )
    if len(aux_ids) != num_aux:
        raise CaptureError(
            f"--aux-layers {','.join(map(str, aux_ids))}: {len(aux_ids)} layers, but "
            f"the store holds {num_aux} aux states per token"
        )
    return tuple(layers_of_option(convention, aux_ids, target.num_layers, target.target_class))


@dataclass(frozen=True)
class TargetIdentity:
    """What a specdraft index records of the target a peer store came from: `--target DIR`
    (and `--tokenizer DIR`, default the target's)."""

    target: Any  # specdraft.targets.Target
    path: str
    tokenizer: dict[str, Any]

    @classmethod
    def load(
        cls, target_dir: str | Path | None, tokenizer_dir: str | Path | None = None
    ) -> TargetIdentity:
        from transformers import AutoTokenizer

        from specdraft.data.render import tokenizer_fingerprint
        from specdraft.targets import load_target

        if target_dir is None:
            raise CaptureError(
                "--target DIR is required: a peer store records no target (specdraft's "
                "index needs its config hash, sizes, head weights and tokenizer)"
            )
        _target_text_config(target_dir, "--target")
        tokenizer_dir = tokenizer_dir or target_dir
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)
        except (OSError, ValueError) as e:
            raise CaptureError(
                f"{tokenizer_dir}: no tokenizer ({str(e).splitlines()[0]}); pass "
                f"--tokenizer DIR, the tokenizer the store was captured with"
            ) from None
        return cls(
            load_target(target_dir),
            str(Path(target_dir).resolve()),
            tokenizer_fingerprint(tokenizer),
        )


def _check_widths(i: int, s: dict, hidden: int, num_aux: int, src: Path) -> None:
    T = s["input_ids"].numel()
    want = {"aux_hidden": (T, num_aux * hidden), "last_hidden": (T, hidden), "loss_mask": (T,)}
    for name, shape in want.items():
        if tuple(s[name].shape) != shape:
            raise CaptureError(
                f"{src}: sample {i}: field {name} has shape {list(s[name].shape)}, "
                f"expected {list(shape)} (target hidden size {hidden}, {num_aux} aux layers)"
            )


def _checked(samples: Iterable[dict], hidden: int, num_aux: int, src: Path) -> Iterator[dict]:
    """`samples`, each after `_check_widths`."""
    for i, s in enumerate(samples):
        _check_widths(i, s, hidden, num_aux, src)
        yield s


def _shard(rows: list[dict]) -> dict[str, torch.Tensor]:
    offsets = torch.zeros(len(rows) + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(torch.tensor([r["input_ids"].numel() for r in rows]), 0)
    return {
        "input_ids": torch.cat([r["input_ids"] for r in rows]).to(torch.int32),
        "loss_mask": torch.cat([r["loss_mask"] for r in rows]).to(torch.uint8),
        "offsets": offsets,
        "aux_hidden": torch.cat([r["aux_hidden"] for r in rows]),
        "last_hidden": torch.cat([r["last_hidden"] for r in rows]),
    }


def write_specdraft(
    samples: Iterable[dict],
    out: Path,
    ident: TargetIdentity,
    aux_layers: tuple[int, ...],
    *,
    after_norm: bool,
    source: dict[str, Any],
    src: Path,
) -> int:
    """Write `samples` as a specdraft capture store into the new directory `out` (shards of at
    most 65,536 tokens, the target head, index.json), readable by `CaptureStore` and training.
    Returns the sample count. Raises CaptureError for a sample whose widths do not fit."""
    from specdraft.capture.forward import target_head_tensors, target_meta
    from specdraft.capture.write import _save_head, _save_shard
    from specdraft.data.render import Sample, data_hash

    H, n_aux = ident.target.hidden_size, len(aux_layers)
    index: dict[str, Any] = {"target_head": None, "shards": []}
    kept: list[Sample] = []
    rows: list[dict] = []
    dtype = None

    def flush() -> None:
        first = len(kept) - len(rows)
        name = f"shard-{len(index['shards']):05d}.safetensors"
        digest = _save_shard(_shard(rows), out / name)
        index["shards"].append(
            {
                "shard": len(index["shards"]),
                "file": name,
                "sha256": digest,
                "first_sample": first,
                "num_samples": len(rows),
                "num_tokens": sum(r["input_ids"].numel() for r in rows),
            }
        )
        rows.clear()

    for i, s in enumerate(samples):
        _check_widths(i, s, H, n_aux, src)
        dtype = dtype or s["aux_hidden"].dtype
        if (
            rows
            and sum(r["input_ids"].numel() for r in rows) + s["input_ids"].numel() > _SHARD_TOKENS
        ):
            flush()
        rows.append(
            {
                **s,
                "aux_hidden": s["aux_hidden"].to(dtype),
                "last_hidden": s["last_hidden"].to(dtype),
            }
        )
        kept.append(Sample(s["input_ids"].tolist(), s["loss_mask"].tolist()))
    if not kept:
        raise CaptureError(f"{src}: holds no samples")
    flush()
    _save_head(out, target_head_tensors(ident.target), index)
    lengths = [len(s.input_ids) for s in kept]
    index.update(
        {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "aux_layers": list(aux_layers),
            "dtype": dtype_name(dtype),
            "max_length": max(lengths),
            "shard_tokens": _SHARD_TOKENS,
            "shard_samples": None,
            "target": target_meta(ident.target, ident.path),
            "tokenizer": ident.tokenizer,
            "chat_template": None,
            "data": {"converted_from": source},
            "data_hash": data_hash(kept),
            "num_samples": len(kept),
            "num_tokens": sum(lengths),
            "num_shards": len(index["shards"]),
            "tensors": {
                "input_ids": ["int32", ["N"]],
                "loss_mask": ["uint8", ["N"]],
                "offsets": ["int64", ["S+1"]],
                "aux_hidden": [dtype_name(dtype), ["N", n_aux * H]],
                "last_hidden": [dtype_name(dtype), ["N", H]],
            },
            LAST_HIDDEN_KEY: AFTER_NORM if after_norm else "before_norm",
            "complete": True,
        }
    )
    atomic_write_json(out / INDEX, index)
    return len(kept)


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


def _check_destination(dst: Path) -> None:
    if dst.is_file() or (dst.is_dir() and any(dst.iterdir())):
        raise CaptureError(
            f"{dst}: exists and is not an empty directory; give a new output directory"
        )


def convert_store(
    src: str | Path,
    dst: str | Path,
    to: str,
    *,
    target: str | None = None,
    tokenizer: str | None = None,
    aux_layers: tuple[int, ...] | None = None,
    convention: str | None = None,
    compress: bool = False,
) -> ConvertResult:
    """Convert the store at `src` (format detected, `detect_format`) into `dst` (a new directory,
    written whole or not at all) in format `to` ('specdraft', 'speculators' or 'specforge').

    A peer store written from a specdraft store keeps that store's index (and what the peer's
    files lack of it) in `recorded.RECORD_DIR`, and comes back as the same store: same index,
    same tensors, without target or aux_layers (given, they must name the recorded ones).

    target / tokenizer: directories; needed to make a specdraft store from a peer's without a
    record (its index records the target) and to norm before-norm states for SpecForge when the
    store records no target path. aux_layers + convention: the peer's aux ids and the convention they are in
    (default: the engine that writes that peer's ids, `SOURCE_CONVENTION`). compress: SpecForge
    .ckpt.gz. Raises CaptureError naming the file and field for bad input.
    """
    src, dst = Path(src), Path(dst)
    if to not in FORMATS:
        raise CaptureError(f"--to {to!r}: unknown store format; use one of {', '.join(FORMATS)}")
    source = detect_format(src)
    if source == to:
        raise CaptureError(f"{src}: already a {to} store; nothing to convert")
    _check_destination(dst)
    samples, after_norm, store = _source_samples(src, source)
    if to == "speculators" and after_norm:
        raise CaptureError(
            f"{src}: holds the last hidden state after the final norm (SpecForge's); "
            f"speculators needs it before the norm, which cannot be recovered"
        )
    samples, num_aux = _peek(samples, src)
    layers = tuple(store.aux_layers) if store is not None else None
    recorded = recorded_index(src) if store is None else None
    with atomic_dir(dst) as tmp:
        if to == "specdraft" and recorded is not None:
            check_given(recorded, src, aux_layers, convention or SOURCE_CONVENTION[source], target)
            layers = tuple(recorded["aux_layers"])
            checked = _checked(samples, recorded["target"]["hidden_size"], len(layers), src)
            count = restore_store(
                checked, src, tmp, after_norm and recorded.get(LAST_HIDDEN_KEY) != AFTER_NORM
            )
        elif to == "specdraft":
            ident = TargetIdentity.load(target, tokenizer)
            layers = peer_aux_layers(
                aux_layers, convention or SOURCE_CONVENTION[source], ident.target, num_aux
            )
            count = write_specdraft(
                samples,
                tmp,
                ident,
                layers,
                after_norm=after_norm,
                source={"format": source, "path": str(src.resolve())},
                src=src,
            )
        elif to == "speculators":
            count = peers.write_speculators(samples, tmp, num_aux)
        else:
            if not after_norm:
                samples = _normed(samples, *_norm_of(store, target))
            count = peers.write_specforge(samples, tmp, compress)
        if store is not None:
            write_record(store, tmp, keep_last_hidden=to == "specforge" and not after_norm)
    return ConvertResult(dst, source, to, count, layers)


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

    config = _target_text_config(target, "--target")
    if "rms_norm_eps" not in config:
        raise CaptureError(f"{Path(target) / 'config.json'}: no rms_norm_eps")
    return load_target(target).final_norm.weight.detach().clone(), float(config["rms_norm_eps"])
