"""A specdraft store made from a peer store's samples (`convert.convert_store` to specdraft, when
the peer keeps no `recorded` index): what specdraft's index needs and the peer's files lack is
asked for, never guessed: the target directory (`TargetIdentity`: its config hash, sizes, head
weights and tokenizer) and the aux layers, given as engine ids in a named convention
(`peer_aux_layers`); then the shards, the target head and index.json (`write_specdraft`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from specdraft.capture.store import (
    AFTER_NORM,
    FORMAT,
    FORMAT_VERSION,
    INDEX,
    LAST_HIDDEN_KEY,
    CaptureError,
    dtype_name,
    tensor_layout,
)
from specdraft.conventions import layers_of_option
from specdraft.data.render import Sample
from specdraft.files import atomic_write_json

SHARD_TOKENS = 65536  # tokens per shard of a store made from a peer's


def target_text_config(directory: str | Path, flag: str) -> dict[str, Any]:
    """The text config of the target directory given as `flag` (`--target`), as config.json holds
    it (a multimodal wrapper's text_config). Raises CaptureError naming the file when it is
    missing, unreadable or not a JSON object."""
    path = Path(directory) / "config.json"
    if not path.is_file():
        raise CaptureError(f"{path}: not found; {flag} must be the target model's directory")
    try:
        config = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CaptureError(
            f"{path}: cannot be read as JSON ({e}); {flag} must be the target model's directory"
        ) from None
    if not isinstance(config, dict):
        raise CaptureError(
            f"{path}: not a JSON object; {flag} must be the target model's directory"
        )
    return config.get("text_config") or config


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
        from specdraft.data.render import tokenizer_fingerprint
        from specdraft.targets import load_target
        from specdraft.targets.tokenizer import load_target_tokenizer

        if target_dir is None:
            raise CaptureError(
                "--target DIR is required: a peer store records no target (specdraft's "
                "index needs its config hash, sizes, head weights and tokenizer)"
            )
        target_text_config(target_dir, "--target")
        tokenizer = load_target_tokenizer(
            tokenizer_dir or target_dir,
            "pass --tokenizer DIR, the tokenizer the store was captured with",
        )
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


def checked_samples(
    samples: Iterable[dict], hidden: int, num_aux: int, src: Path
) -> Iterator[dict]:
    """`samples`, each after `_check_widths`."""
    for i, s in enumerate(samples):
        _check_widths(i, s, hidden, num_aux, src)
        yield s


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
    from specdraft.capture.write import _save_head
    from specdraft.data.render import data_hash

    H, n_aux = ident.target.hidden_size, len(aux_layers)
    shards, kept, dtype = _write_shards(samples, out, H, n_aux, src)
    index: dict[str, Any] = {"target_head": None, "shards": shards}
    _save_head(out, target_head_tensors(ident.target), index)
    lengths = [len(s.input_ids) for s in kept]
    index.update(
        {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "aux_layers": list(aux_layers),
            "dtype": dtype_name(dtype),
            "max_length": max(lengths),
            "shard_tokens": SHARD_TOKENS,
            "shard_samples": None,
            "target": target_meta(ident.target, ident.path),
            "tokenizer": ident.tokenizer,
            "chat_template": None,
            "data": {"converted_from": source},
            "data_hash": data_hash(kept),
            "num_samples": len(kept),
            "num_tokens": sum(lengths),
            "num_shards": len(index["shards"]),
            "tensors": tensor_layout(n_aux, H, dtype),
            LAST_HIDDEN_KEY: AFTER_NORM if after_norm else "before_norm",
            "complete": True,
        }
    )
    atomic_write_json(out / INDEX, index)
    return len(kept)


def _groups(samples: Iterable[dict], hidden: int, num_aux: int, src: Path) -> Iterator[list[dict]]:
    """`samples`, each checked (`_check_widths`) and its states cast to the first sample's dtype,
    in consecutive groups of at most SHARD_TOKENS tokens (a longer sample alone)."""
    rows: list[dict] = []
    tokens, dtype = 0, None
    for i, s in enumerate(samples):
        _check_widths(i, s, hidden, num_aux, src)
        dtype = dtype or s["aux_hidden"].dtype
        if rows and tokens + s["input_ids"].numel() > SHARD_TOKENS:
            yield rows
            rows, tokens = [], 0
        rows.append(
            {
                **s,
                "aux_hidden": s["aux_hidden"].to(dtype),
                "last_hidden": s["last_hidden"].to(dtype),
            }
        )
        tokens += s["input_ids"].numel()
    if rows:
        yield rows


def _write_shards(
    samples: Iterable[dict], out: Path, hidden: int, num_aux: int, src: Path
) -> tuple[list[dict[str, Any]], list[Sample], torch.dtype]:
    """Write `samples` as shard-{n:05d}.safetensors files into `out`; (their index.json entries,
    the samples' ids and masks, the states' dtype). Raises CaptureError when there is none."""
    from specdraft.capture.forward import shard_tensors
    from specdraft.capture.write import _save_shard

    entries: list[dict[str, Any]] = []
    kept: list[Sample] = []
    dtype = None
    for rows in _groups(samples, hidden, num_aux, src):
        part = [Sample(r["input_ids"].tolist(), r["loss_mask"].tolist()) for r in rows]
        states = [(r["aux_hidden"], r["last_hidden"]) for r in rows]
        name = f"shard-{len(entries):05d}.safetensors"
        digest = _save_shard(shard_tensors(part, states), out / name)
        entries.append(
            {
                "shard": len(entries),
                "file": name,
                "sha256": digest,
                "first_sample": len(kept),
                "num_samples": len(rows),
                "num_tokens": sum(r["input_ids"].numel() for r in rows),
            }
        )
        kept += part
        dtype = dtype or rows[0]["aux_hidden"].dtype
    if not kept:
        raise CaptureError(f"{src}: holds no samples")
    return entries, kept, dtype
