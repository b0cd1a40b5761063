"""Training data sources: what the trainer reads, and the two sources that provide it.

A training source (`TrainData`) must provide:

- `batch(sample_ids, max_length, device)`: one rank's share of a global batch as a `Batch` of
  right-padded input_ids and loss mask [B, T], the target's aux hidden states
  [B, T, n_aux·H_target] and the target's logits [B, T, V];
- `token_counts(sample_ids)`: loss-masked target-token counts [V] over those samples (the
  training split), from which the draft vocabulary is built;
- `info`: a `TargetInfo`, what the drafter takes from its target (config, aux layers,
  embedding) and what its manifest records about it;
- `len()`: the number of samples.

`StoreData` reads an offline capture store; `OnlineData` runs a live target at every batch.
`open_data` turns a store directory, an `OnlineSource` (target directory + data file) or a
TrainData as is into a source.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.nn.functional as F

from specdraft.capture.convert import AFTER_NORM, LAST_HIDDEN_KEY
from specdraft.conventions import default_aux_layers
from specdraft.data.labels import token_counts
from specdraft.data.render import RenderInfo, Sample, data_hash, tokenizer_fingerprint
from specdraft.train.loss import target_logits


@dataclass
class Batch:
    """One rank's share of a global batch, right-padded (pad id 0, loss_mask 0).

    sample_ids: the source's sample indices; input_ids/loss_mask: [B, T] long/bool;
    aux_hidden: [B, T, n_aux·H_target]; target_logits: [B, T, V] float32.
    """

    sample_ids: list[int]
    input_ids: torch.Tensor
    loss_mask: torch.Tensor
    aux_hidden: torch.Tensor
    target_logits: torch.Tensor


@dataclass
class TargetInfo:
    """What the drafter takes from its target, and what its manifest records about it.

    config: transformers text config or its dict (sizes, rope, rms_norm_eps).
    manifest_fields: Manifest fields known from the source: target, tokenizer, chat_template,
    data_hash. vocab_limit: tokenizer length (draft vocabulary never past it), or None.
    """

    config: Any
    aux_layers: tuple[int, ...]
    embed_weight: torch.Tensor  # [V, H_target]
    manifest_fields: dict[str, Any]
    vocab_limit: int | None = None


class TrainData(Protocol):
    """A training source: offline capture store (StoreData) or online target (OnlineData)."""

    info: TargetInfo

    def __len__(self) -> int: ...

    def token_counts(self, sample_ids: Sequence[int]) -> torch.Tensor: ...

    def batch(self, sample_ids: Sequence[int], max_length: int, device: torch.device) -> Batch: ...


def pad_samples(samples: Sequence[Sample], max_length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Truncate to `max_length` and right-pad: (input_ids [B, T] long, loss_mask [B, T] bool)."""
    samples = [s.truncated(max_length) for s in samples]
    t_len = max(len(s.input_ids) for s in samples)
    ids = torch.zeros(len(samples), t_len, dtype=torch.long)
    mask = torch.zeros(len(samples), t_len, dtype=torch.bool)
    for i, s in enumerate(samples):
        ids[i, : len(s.input_ids)] = torch.tensor(s.input_ids)
        mask[i, : len(s.loss_mask)] = torch.tensor(s.loss_mask, dtype=torch.bool)
    return ids, mask


def _right_pad(rows: Sequence[torch.Tensor], t_len: int) -> torch.Tensor:
    """Stack [T_i, ...] tensors into [B, t_len, ...], zero-padded on the right."""
    out = rows[0].new_zeros(len(rows), t_len, *rows[0].shape[1:])
    for i, r in enumerate(rows):
        out[i, : len(r)] = r[:t_len]
    return out


@dataclass(frozen=True)
class OnlineSource:
    """Where online training reads: a target directory (model + tokenizer) and a data file.

    data: JSONL chats/texts, a `save_to_disk` directory or a text file (`specdraft.data`);
    chat=False renders plain text (base models); template_kwargs go to apply_chat_template.
    target_dtype: the dtype the target runs in ("float32" | "bfloat16" | "float16", or fp32 /
    bf16 / fp16; its aux states and logits reach the drafter as float32 either way).
    skip_bad: skip and count bad data records instead of refusing the file (as capture does).
    reasoning: "keep" | "drop" (`specdraft.data.reasoning`).
    Raises ValueError (naming --target-dtype) for an unknown dtype.
    """

    target: str
    data: str
    chat: bool = True
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    target_dtype: str = "float32"
    skip_bad: bool = False
    reasoning: str = "keep"

    def __post_init__(self) -> None:
        from specdraft.capture.store import INDEX
        from specdraft.conventions import DTYPES

        if self.target_dtype not in DTYPES:
            raise ValueError(
                f"--target-dtype {self.target_dtype!r}: choose one of {', '.join(DTYPES)}"
            )
        if (Path(self.data) / INDEX).is_file():
            raise ValueError(
                f"{self.data} is a capture store (specdraft capture), not a data file: drop --online "
                f"to train on the store offline (--target only if the target it recorded moved)"
            )


class OnlineData:
    """Token sequences run through a live target at every batch (no store on disk).

    target: a `specdraft.targets.Target`; samples: `specdraft.data.render.Sample`s; aux_layers:
    specdraft indices (default: `conventions.default_aux_layers(L)`). name_or_path, tokenizer
    and render_info (`data.RenderInfo`), when known, are recorded in the drafter's manifest.
    num_skipped: bad records skipped while reading the data (OnlineSource.skip_bad).
    """

    def __init__(
        self,
        target: Any,
        samples: Sequence[Sample],
        aux_layers: Sequence[int] | None = None,
        *,
        name_or_path: str | None = None,
        tokenizer: Any = None,
        render_info: RenderInfo | None = None,
        num_skipped: int = 0,
    ) -> None:
        from specdraft.capture.forward import target_meta
        from specdraft.conventions import check_aux_flag

        self.target, self.samples, self.num_skipped = target, list(samples), num_skipped
        if aux_layers:
            check_aux_flag(aux_layers, target.num_layers)
        name_or_path = name_or_path or getattr(target.config, "_name_or_path", None)
        self.info = TargetInfo(
            config=target.config,
            aux_layers=tuple(aux_layers or default_aux_layers(target.num_layers)),
            embed_weight=target.embed_tokens.weight.detach(),
            manifest_fields={
                "target": target_meta(target, name_or_path),
                "tokenizer": tokenizer_fingerprint(tokenizer) if tokenizer else None,
                "chat_template": render_info.to_dict() if render_info else None,
                "data_hash": data_hash(self.samples),
            },
            vocab_limit=len(tokenizer) if tokenizer else None,
        )

    @classmethod
    def load(
        cls,
        source: OnlineSource,
        aux_layers: Sequence[int] | None = None,
        device: str | torch.device = "cpu",
    ) -> OnlineData:
        """Load `source`'s target onto `device` in `source.target_dtype` and render its data with
        the target's tokenizer. Raises DataError naming the data file for a bad record (unless
        source.skip_bad), ValueError for a tokenizer that does not belong to the target."""
        from specdraft.capture.stage import load_inputs
        from specdraft.conventions import parse_dtype

        target, tokenizer, data = load_inputs(
            source.target,
            source.data,
            chat=source.chat,
            template_kwargs=source.template_kwargs,
            skip_bad=source.skip_bad,
            reasoning=source.reasoning,
            target_dtype=parse_dtype(source.target_dtype),
            device=device,
        )
        return cls(
            target,
            data.samples,
            aux_layers,
            name_or_path=str(Path(source.target).resolve()),
            tokenizer=tokenizer,
            render_info=data.render_info,
            num_skipped=data.num_skipped,
        )

    def __len__(self) -> int:
        return len(self.samples)

    def token_counts(self, sample_ids: Sequence[int]) -> torch.Tensor:
        """Loss-masked target-token counts [V] over the samples `sample_ids`."""
        return token_counts([self.samples[i] for i in sample_ids], self.target.vocab_size)

    def batch(self, sample_ids: Sequence[int], max_length: int, device: torch.device) -> Batch:
        ids, mask = pad_samples([self.samples[i] for i in sample_ids], max_length)
        lengths = torch.tensor(
            [min(len(self.samples[i].input_ids), max_length) for i in sample_ids]
        )
        attention = (torch.arange(ids.shape[1]) < lengths[:, None]).long()
        t_device = self.target.embed_tokens.weight.device
        out = self.target.forward(
            ids.to(t_device), attention.to(t_device), aux_layers=self.info.aux_layers
        )
        # clone: the target runs in inference mode, and autograd cannot save inference tensors
        return Batch(
            list(sample_ids),
            ids.to(device),
            mask.to(device),
            out.aux_hidden.clone().to(device, torch.float32),
            out.logits.clone().to(device),
        )


class StoreData:
    """An offline capture store (`specdraft.capture.store.CaptureStore`) as training data.

    Target logits are recomputed per batch as lm_head(final_norm(last_hidden)) with the store's
    `target_head.safetensors` (lm_head(last_hidden) for a store that records its last state after
    the norm, `capture.convert.AFTER_NORM`). The target's full config (heads, intermediate size, rms_norm_eps,
    rope) comes from `target_config` (a config, its dict or the target directory) or else from
    config.json under the store's recorded target path.
    Raises CaptureError for a missing/unfinished store, FileNotFoundError for an unresolvable
    target config.
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
        raise FileNotFoundError(
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
        raise ValueError(
            f"--target {directory}: not the target this store was captured from ("
            f"{store.path / 'index.json'} records {describe_target(recorded)}; --target is "
            f"{describe_target(given)}): pass that target's directory, or leave --target out"
        )


def open_data(
    source: str | Path | OnlineSource | TrainData,
    target_config: Any = None,
    aux_layers: Sequence[int] | None = None,
    device: str | torch.device = "cpu",
) -> TrainData:
    """A TrainData for `source`: a capture store directory, an OnlineSource (its target loaded
    onto `device`), or a TrainData as is.

    target_config: for a store, see StoreData. aux_layers: the layers asked for (None = the
    source's); a store or TrainData that holds other layers is a ValueError naming both.
    """
    if isinstance(source, OnlineSource):
        return OnlineData.load(source, aux_layers, device)
    data = StoreData(source, target_config) if isinstance(source, (str, Path)) else source
    if aux_layers is not None and tuple(aux_layers) != data.info.aux_layers:
        held = ",".join(map(str, data.info.aux_layers))
        raise ValueError(
            f"--aux-layers {','.join(map(str, aux_layers))} asked for, but the training data holds "
            f"layers {held}: drop --aux-layers (or pass --aux-layers {held}), or capture those layers"
        )
    return data


def serving_note(info: TargetInfo) -> str | None:
    """`conventions.serving_problem` for the target and aux layers the drafter trains on (the
    class from the recorded architecture, else the recorded target class); None when served."""
    from specdraft.data.serving import serving_problem
    from specdraft.targets.config import target_class_of

    target = info.manifest_fields.get("target") or {}
    if not target.get("num_layers"):
        return None
    target_class = target_class_of(target.get("architecture"), "") or target.get("target_class")
    return serving_problem(info.aux_layers, target["num_layers"], target_class)
