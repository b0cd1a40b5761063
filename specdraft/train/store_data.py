"""`StoreData`: an offline capture store as training data (`sources.TrainData`), and how a
store's target is found and compared: its recorded target record against a `--target`
directory or a checkpoint's (`same_target`, `describe_target`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from specdraft.capture.store import AFTER_NORM, LAST_HIDDEN_KEY
from specdraft.train.errors import BadTrainSetting, TargetConfigNotFound
from specdraft.train.loss import target_logits
from specdraft.train.sources import Batch, TargetInfo


def _right_pad(rows: Sequence[torch.Tensor], t_len: int) -> torch.Tensor:
    """Stack [T_i, ...] tensors into [B, t_len, ...], zero-padded on the right."""
    out = rows[0].new_zeros(len(rows), t_len, *rows[0].shape[1:])
    for i, r in enumerate(rows):
        out[i, : len(r)] = r[:t_len]
    return out


class StoreData:
    """An offline capture store (`specdraft.capture.store.CaptureStore`) as training data.

    Target logits are recomputed per batch as lm_head(final_norm(last_hidden)) with the store's
    `target_head.safetensors` (lm_head(last_hidden) for a store that records its last state after
    the norm, `capture.store.AFTER_NORM`). The target's full config (heads, intermediate size, rms_norm_eps,
    rope) comes from `target_config` (a config, its dict or the target directory) or else from
    config.json under the store's recorded target path.
    Raises CaptureError for a missing/unfinished store, TargetConfigNotFound (a FileNotFoundError)
    for an unresolvable target config, BadTrainSetting (a ValueError) for a `target_config`
    directory of another target than the store's.
    """

    def __init__(self, path: str | Path, target_config: Any = None) -> None:
        from specdraft.capture.store import CaptureStore

        self.store = CaptureStore(path)
        meta = self.store.meta
        self.config = _store_target_config(self.store, target_config)
        head = self.store.target_head()
        self._norm, self._lm_head = head["norm.weight"], head["lm_head.weight"]
        self._head_device = torch.device("cpu")
        self._after_norm = meta.get(LAST_HIDDEN_KEY) == AFTER_NORM
        tokenizer = meta.get("tokenizer") or {}
        self.info = TargetInfo(
            config=self.config,
            aux_layers=tuple(self.store.aux_layers),
            embed_weight=head["embed_tokens.weight"],
            manifest_fields={
                "target": {k: v for k, v in meta["target"].items()},
                "tokenizer": meta.get("tokenizer"),
                "chat_template": meta.get("chat_template"),
                "data_hash": meta.get("data_hash"),
            },
            vocab_limit=tokenizer.get("length"),
            lm_head_weight=self._lm_head,
        )

    def __len__(self) -> int:
        return len(self.store)

    def token_counts(self, sample_ids: Sequence[int]) -> torch.Tensor:
        """Loss-masked target-token counts [V] over the samples `sample_ids`; reads only
        input_ids, loss_mask and offsets of each shard (capture.store's layout), never the
        hidden states."""
        chosen = torch.zeros(len(self.store), dtype=torch.bool)
        chosen[list(sample_ids)] = True
        counts = torch.zeros(self.store.meta["target"]["vocab_size"], dtype=torch.long)
        for s, entry in enumerate(self.store.meta["shards"]):
            shard = self.store.shard_tensors(s, "input_ids", "loss_mask", "offsets")
            lengths = shard["offsets"].diff()
            first = entry["first_sample"]
            rows = chosen[first : first + lengths.numel()].repeat_interleave(lengths)
            ids = shard["input_ids"].long()[shard["loss_mask"].bool() & rows]
            counts += torch.bincount(ids, minlength=counts.numel())
        return counts

    def batch(self, sample_ids: Sequence[int], max_length: int, device: torch.device) -> Batch:
        rows = [self.store[i] for i in sample_ids]
        t_len = min(max_length, max(len(r["input_ids"]) for r in rows))
        pad = lambda key: _right_pad([r[key] for r in rows], t_len).to(device)  # noqa: E731
        if self._head_device != device:
            self._norm, self._lm_head = self._norm.to(device), self._lm_head.to(device)
            self._head_device = device
        eps = _config_get(self.config, "rms_norm_eps", 1e-6)
        if self._after_norm:  # converted from SpecForge: the state is already normed
            logits = F.linear(pad("last_hidden").to(self._lm_head.dtype), self._lm_head).float()
        else:
            logits = target_logits(
                pad("last_hidden"),
                self._norm,
                self._lm_head,
                eps,
                _config_get(self.config, "final_logit_softcapping"),
            )
        return Batch(
            list(sample_ids), pad("input_ids"), pad("loss_mask"), pad("aux_hidden").float(), logits
        )


def _config_get(config: Any, key: str, default: Any = None) -> Any:
    return config.get(key, default) if isinstance(config, dict) else getattr(config, key, default)


def _store_target_config(store: Any, override: Any = None) -> Any:
    """The target's transformers text config: `override` (a config, its dict, or a target
    directory), else config.json under the target path the capture store recorded."""
    from transformers import AutoConfig

    if override is not None and not isinstance(override, (str, Path)):
        return override
    path = override or store.meta["target"].get("name_or_path")
    if not path or not (Path(path) / "config.json").is_file():
        raise TargetConfigNotFound(
            f"{store.path / 'index.json'}: target path {path!r} has no "
            f"config.json; pass the target directory (train --target DIR)"
        )
    config = AutoConfig.from_pretrained(path, local_files_only=True)
    if override:
        _check_store_target(store, config, override)
    return config.get_text_config()


# what a target record (capture.target_meta) says about the network, when it has no config_hash
TARGET_SIZES = ("num_layers", "hidden_size", "vocab_size")


def describe_target(meta: dict[str, Any]) -> str:
    """A target record (capture.target_meta) in a few words: path, layers, hidden size, config hash."""
    sizes = f"{meta.get('num_layers')} layers, hidden {meta.get('hidden_size')}, vocab {meta.get('vocab_size')}"
    digest = f", config {meta['config_hash'][:12]}" if meta.get("config_hash") else ""
    return f"{meta.get('name_or_path')} ({sizes}{digest})"


def same_target(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two target records name the same network: the same config hash when both record
    one, else the same sizes (the path may move)."""
    if a.get("config_hash") and b.get("config_hash"):
        return a["config_hash"] == b["config_hash"]
    return all(a.get(k) == b.get(k) for k in TARGET_SIZES)


def _check_store_target(store: Any, config: Any, directory: str | Path) -> None:
    """Refuse a `--target` directory whose model is not the target `store` was captured from."""
    from specdraft.targets.config import config_hash

    text = config.get_text_config()
    given = {
        "name_or_path": str(directory),
        "config_hash": config_hash(config),
        "num_layers": getattr(text, "num_hidden_layers", None),
        "hidden_size": getattr(text, "hidden_size", None),
        "vocab_size": getattr(text, "vocab_size", None),
    }
    recorded = store.meta["target"]
    if not same_target(recorded, given):
        raise BadTrainSetting(
            f"--target {directory}: not the target this store was captured from ("
            f"{store.path / 'index.json'} records {describe_target(recorded)}; --target is "
            f"{describe_target(given)}): pass that target's directory, or leave --target out"
        )
